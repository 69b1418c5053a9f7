// `bnfold check MODEL...`: a CI gate. Runs the rules `fold` would run, as a dry run that never writes a model;
// the library turns the run's report into findings (bnfold/check/findings.h), and check formats them.

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "batch.h"
#include "bnfold/api/api.h"
#include "bnfold/error.h"
#include "bnfold/io/model_io.h"
#include "bnfold/check/findings.h"
#include "bnfold/report/report.h"
#include "bnfold/check/fold.h"
#include "bnfold/version.h"
#include "commands.h"
#include "output.h"

namespace bnfold::cli {
namespace {

struct CheckOptions {
  std::vector<std::string> inputs;
  std::string format = "text";
  std::string failOn = kDefaultFailOn;
  unsigned jobs = 0;
  RuleFlags ruleFlags;
};

struct ModelCheck {
  std::string file;
  bool valid = false;
  int64_t opset = 0;
  std::vector<Finding> findings;
};

ModelCheck checkOne(const ModelFile& file, const DriverOptions& driverOptions, int64_t targetOpset,
                    const std::set<std::string>& failOn) {
  ModelCheck result;
  result.file = file.path;
  try {
    Report report;
    auto model = targetOpset > 0 ? loadModelAtOpset(file.path, targetOpset, &report) : loadModel(file.path);
    result.opset = model->opsetVersion("");
    report.setInput(file.path);
    foldModel(*model, driverOptions, report);  // the model is changed in memory only; it is never saved
    result.findings = findingsOf(*model, report, failOn, driverOptions.ruleOptions);
    result.valid = true;
  } catch (...) {
    result.findings = {invalidModelFinding(currentErrorMessage(file.path))};
    result.valid = false;
  }
  return result;
}

const char* severityOf(const Finding& finding) { return severityName(finding.severity); }
bool isFailing(const Finding& finding) { return finding.severity == Severity::Error; }

nlohmann::json findingJson(const std::string& file, const Finding& finding) {
  nlohmann::json json = {{"file", file},
                         {"category", finding.category},
                         {"severity", severityOf(finding)},
                         {"message", finding.message}};
  auto addIfSet = [&](const char* key, const std::string& value) {
    if (!value.empty()) json[key] = value;
  };
  addIfSet("node", finding.node);
  addIfSet("op", finding.op);
  addIfSet("graph", finding.graph);
  addIfSet("rule", finding.rule);
  addIfSet("reason", finding.reason);
  if (!finding.entry.is_null()) json["entry"] = finding.entry;
  return json;
}

// GitHub workflow commands: data escapes %, CR, LF; property values also ':' and ','.
std::string githubEscape(const std::string& text, bool property) {
  std::string out;
  for (char c : text) {
    if (c == '%') out += "%25";
    else if (c == '\r') out += "%0D";
    else if (c == '\n') out += "%0A";
    else if (property && c == ':') out += "%3A";
    else if (property && c == ',') out += "%2C";
    else out += c;
  }
  return out;
}

struct Totals {
  std::size_t models = 0, invalid = 0, clean = 0, findings = 0, failing = 0;
  std::size_t verified = 0, verifyFailed = 0;  // rewrites checked by --verify, and those that failed
  std::map<std::string, std::size_t> byCategory;
  std::map<std::string, std::size_t> failingByCategory;
};

Totals totalsOf(const std::vector<ModelCheck>& checks) {
  Totals totals;
  totals.models = checks.size();
  for (const ModelCheck& check : checks) {
    totals.invalid += !check.valid;
    totals.clean += check.findings.empty();
    for (const Finding& finding : check.findings) {
      if (finding.category == "verify-failed") ++totals.verifyFailed;
      else if (finding.entry.is_object() && finding.entry.contains("verify")) ++totals.verified;
      ++totals.findings;
      ++totals.byCategory[finding.category];
      if (isFailing(finding)) {
        ++totals.failing;
        ++totals.failingByCategory[finding.category];
      }
    }
  }
  return totals;
}

int exitCodeOf(const Totals& totals) {
  if (totals.invalid > 0) return kExitInvalid;
  return totals.failing > 0 ? kExitFindings : kExitOk;
}

std::string categoryCounts(const std::map<std::string, std::size_t>& counts) {
  std::string text;
  for (const FindingCategory& category : findingCategories()) {
    auto it = counts.find(category.name);
    if (it != counts.end()) text += (text.empty() ? "" : ", ") + it->first + " " + std::to_string(it->second);
  }
  return text;
}

void printText(const std::vector<ModelCheck>& checks, const Totals& totals, const std::set<std::string>& failOn,
               bool verifying) {
  const Painter paint(colourAllowed(stdout));
  std::size_t categoryWidth = 0;
  for (const FindingCategory& category : findingCategories())
    categoryWidth = std::max(categoryWidth, std::string(category.name).size());
  for (const ModelCheck& check : checks) {
    if (check.findings.empty()) {
      std::cout << paint(Colour::Bold, check.file) << ": " << paint(Colour::Green, "clean") << "\n";
      continue;
    }
    std::cout << paint(Colour::Bold, check.file) << "\n";
    for (const Finding& finding : check.findings) {
      const std::string severity = severityOf(finding);
      std::cout << "  " << paint(isFailing(finding) ? Colour::Red : Colour::Yellow, severity)
                << std::string(9 - severity.size(), ' ') << paint(Colour::Cyan, finding.category)
                << std::string(categoryWidth + 2 - finding.category.size(), ' ') << finding.message << "\n";
    }
  }
  std::string failing = "--fail-on ";
  if (failOn.empty()) failing += "none";
  for (const FindingCategory& category : findingCategories())
    if (failOn.count(category.name)) failing += (failing.back() == ' ' ? "" : ",") + std::string(category.name);
  std::cout << "\n" << totals.models << (totals.models == 1 ? " model" : " models") << ": " << totals.clean
            << " clean, " << totals.models - totals.clean - totals.invalid << " with findings, " << totals.invalid
            << " invalid; " << totals.findings << (totals.findings == 1 ? " finding" : " findings");
  if (totals.findings) std::cout << " (" << categoryCounts(totals.byCategory) << ")";
  std::cout << "; " << totals.failing << " failing under " << failing;
  if (verifying) std::cout << "; " << totals.verified << " rewrites verified, " << totals.verifyFailed << " failed";
  std::cout << "\n";
}

void printJson(const std::vector<ModelCheck>& checks, const Totals& totals, const std::set<std::string>& failOn,
               const std::vector<std::string>& rules) {
  nlohmann::json models = nlohmann::json::array();
  for (const ModelCheck& check : checks) {
    nlohmann::json findings = nlohmann::json::array();
    for (const Finding& finding : check.findings) {
      nlohmann::json json = findingJson(check.file, finding);
      json.erase("file");
      findings.push_back(std::move(json));
    }
    nlohmann::json model = {{"file", check.file}, {"valid", check.valid}, {"findings", std::move(findings)}};
    if (check.valid) model["opset"] = check.opset;
    models.push_back(std::move(model));
  }
  nlohmann::json document = {
      {"tool", {{"name", "bnfold"}, {"version", kVersion}}},
      {"fail_on", std::vector<std::string>(failOn.begin(), failOn.end())},
      {"rules", rules},
      {"models", std::move(models)},
      {"summary",
       {{"models", totals.models},
        {"clean", totals.clean},
        {"invalid", totals.invalid},
        {"findings", totals.findings},
        {"failing", totals.failing},
        {"by_category", totals.byCategory},
        {"failing_by_category", totals.failingByCategory},
        {"verified", totals.verified},
        {"verify_failed", totals.verifyFailed}}},
      {"exit_code", exitCodeOf(totals)}};
  std::cout << document.dump(2) << "\n";
}

void printNdjson(const std::vector<ModelCheck>& checks) {
  for (const ModelCheck& check : checks)
    for (const Finding& finding : check.findings) std::cout << findingJson(check.file, finding).dump() << "\n";
}

void printGithub(const std::vector<ModelCheck>& checks) {
  for (const ModelCheck& check : checks) {
    for (const Finding& finding : check.findings) {
      std::cout << "::" << severityOf(finding) << " file=" << githubEscape(check.file, true)
                << ",title=" << githubEscape("bnfold " + finding.category, true)
                << "::" << githubEscape(finding.message, false) << "\n";
    }
  }
}

int runCheck(const CheckOptions& options) {
  DriverOptions driverOptions = driverOptionsFrom(options.ruleFlags);
  const std::set<std::string> failOn = parseFailOn(options.failOn);
  const std::vector<ModelFile> files = collectModelFiles(options.inputs);
  if (effectiveJobs(options.jobs) > 1 && files.size() > 1)
    driverOptions.ruleOptions.concurrent = false;  // the models share the cores
  std::vector<ModelCheck> checks(files.size());
  runInParallel(
      files.size(), effectiveJobs(options.jobs),
      [&](std::size_t i) { checks[i] = checkOne(files[i], driverOptions, options.ruleFlags.targetOpset, failOn); }, [](std::size_t) {});
  const Totals totals = totalsOf(checks);
  if (options.format == "json") printJson(checks, totals, failOn, driverOptions.rules);
  else if (options.format == "ndjson") printNdjson(checks);
  else if (options.format == "github") printGithub(checks);
  else printText(checks, totals, failOn, options.ruleFlags.verify);
  std::cout.flush();
  return exitCodeOf(totals);
}

// "Categories:" and one line per category from the library's table, meanings wrapped under themselves.
std::string categoriesText() {
  constexpr std::size_t kWidth = 116;
  std::size_t nameWidth = 0;
  for (const FindingCategory& category : findingCategories())
    nameWidth = std::max(nameWidth, std::string(category.name).size());
  std::string text = "\nCategories:\n";
  for (const FindingCategory& category : findingCategories()) {
    std::string line = "  " + std::string(category.name);
    line.resize(nameWidth + 4, ' ');
    std::istringstream words(category.meaning);
    bool lineHasWords = false;
    for (std::string word; words >> word;) {
      if (lineHasWords && line.size() + 1 + word.size() > kWidth) {
        text += line + "\n";
        line.assign(nameWidth + 4, ' ');
        lineHasWords = false;
      }
      line += (lineHasWords ? " " : "") + word;
      lineHasWords = true;
    }
    text += line + "\n";
  }
  return text;
}

const char* kCheckFooter = R"(
Exit codes:
  0  no finding in a --fail-on category
  1  at least one finding in a --fail-on category
  2  usage error, or a model could not be read (reported as an invalid-model finding; the others are still checked)

Examples:
  bnfold check model.onnx
  bnfold check models/ --format github                       # annotations in a GitHub Actions log
  bnfold check models/ --format ndjson | jq -c 'select(.severity == "error")'
  bnfold check model.onnx --fail-on all                      # any finding fails
  bnfold check model.onnx --fail-on none --format json > findings.json

)";

}  // namespace

CommandRunner addCheckCommand(CLI::App& app) {
  auto options = std::make_shared<CheckOptions>();
  CLI::App* command =
      app.add_subcommand("check", "List what fold would change and what stops it (never writes a model); for CI");
  command->add_option("models", options->inputs, "ONNX model files, or folders searched recursively for *.onnx")
      ->required();
  command->add_option("--format", options->format, "Output: text, json (one document), ndjson (one finding per "
                                                   "line), github (workflow annotations)")
      ->check(CLI::IsMember({"text", "json", "ndjson", "github"}))
      ->capture_default_str();
  command->add_option("--fail-on", options->failOn,
                      "Comma list of categories that make the exit code 1 (or 'all', 'none')")
      ->type_name("CATEGORIES")
      ->capture_default_str();
  command->add_option("-j,--jobs", options->jobs, "Models checked in parallel (default: number of cores)")
      ->check(CLI::NonNegativeNumber);
  addRuleFlags(*command, options->ruleFlags);
  command->footer(categoriesText() + kCheckFooter + ruleListText());
  return [options] { return runCheck(*options); };
}

}  // namespace bnfold::cli
