// `bnfold check MODEL...`: a CI gate. Runs the rules `fold` would run, as a dry run that never writes a model,
// and turns what they would do into findings: the report's sections become categories, so check does not
// need to know the rules by name, and new rules show up here as soon as they record what they do.

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "batch.h"
#include "bnfold/error.h"
#include "bnfold/io/model_io.h"
#include "bnfold/report/report.h"
#include "bnfold/rewrite/driver.h"
#include "bnfold/version.h"
#include "commands.h"
#include "output.h"
#include "rules/batch_norm.h"

namespace bnfold::cli {
namespace {

/// Every category, in the order they are listed in help; --fail-on takes these names.
const std::vector<std::string> kCategories = {"foldable-bn",     "training-bn", "unfoldable-bn", "kept-bn", "bias-add",
                                              "scale-fold", "decomposable-bn", "other-rewrite", "unsorted-graph",
                                              "input-defaults", "invalid-model"};
const char* kDefaultFailOn = "foldable-bn,training-bn";

struct CheckOptions {
  std::vector<std::string> inputs;
  std::string format = "text";
  std::string failOn = kDefaultFailOn;
  unsigned jobs = 0;
  RuleFlags ruleFlags;
};

struct Finding {
  std::string category;
  std::string node;
  std::string op;
  std::string graph;
  std::string rule;
  std::string reason;
  std::string message;
  nlohmann::json entry;  // the report entry it came from (null for invalid-model)
  bool failing = false;
};

struct ModelCheck {
  std::string file;
  bool valid = false;
  int64_t opset = 0;
  std::vector<Finding> findings;
};

std::set<std::string> parseFailOn(const std::string& text) {
  std::set<std::string> chosen;
  std::stringstream stream(text);
  for (std::string token; std::getline(stream, token, ',');) {
    token.erase(0, token.find_first_not_of(" \t"));
    token.erase(token.find_last_not_of(" \t") + 1);
    if (token.empty()) continue;
    if (token == "none") {
      chosen.clear();
    } else if (token == "all") {
      chosen.insert(kCategories.begin(), kCategories.end());
    } else if (std::find(kCategories.begin(), kCategories.end(), token) != kCategories.end()) {
      chosen.insert(token);
    } else {
      std::string known;
      for (const auto& category : kCategories) known += (known.empty() ? "" : ", ") + category;
      throw Error("", "--fail-on: unknown category '" + token + "' (known: " + known + ", all, none)");
    }
  }
  return chosen;
}

std::string stringField(const nlohmann::json& entry, const char* key) {
  auto it = entry.find(key);
  return it != entry.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string singleQuoted(const std::string& name) { return "'" + name + "'"; }

// The category of a rewrite recorded in `section`. A frozen BN is a training-mode BN in the checked model.
std::string categoryOfSection(const std::string& section) {
  static const std::map<std::string, std::string> categories = {
      {"folds", "foldable-bn"},    {"expanded", "training-bn"},   {"frozen", "training-bn"},
      {"bias_absorbed", "bias-add"}, {"scale_folded", "scale-fold"}, {"decomposed", "decomposable-bn"}};
  auto it = categories.find(section);
  return it == categories.end() ? "other-rewrite" : it->second;
}

// Report entries name the node a rewrite removes and the layer it goes into with a few conventional fields
// (not one per rule): "node" (with "op"), or "bn" / "add" / "mul"; and "into" / "layer" with "<field>_op".
struct NamedField {
  const char* field;
  const char* op;  // the op the field implies, or the field holding the op
};
constexpr NamedField kRemovedNodeFields[] = {
    {"node", nullptr}, {"bn", "BatchNormalization"}, {"add", "Add"}, {"mul", "Mul"}};
constexpr NamedField kTargetFields[] = {{"into", "into_op"}, {"layer", "layer_op"}};

std::string rewriteMessage(const std::string& section, const Finding& finding) {
  const std::string who = (finding.op.empty() ? std::string("node") : finding.op) + " " + singleQuoted(finding.node);
  std::string target;
  for (const NamedField& field : kTargetFields) {
    const std::string name = stringField(finding.entry, field.field);
    if (name.empty()) continue;
    const std::string op = stringField(finding.entry, field.op);
    target = (op.empty() ? "" : op + " ") + singleQuoted(name);
    break;
  }
  const std::string into = target.empty() ? "" : " into " + target;
  const std::string by = finding.rule.empty() ? "" : " (" + finding.rule + ")";
  const std::string cause = stringField(finding.entry, "cause");
  const std::string because = cause.empty() ? "" : " [" + cause + "]";
  if (section == "folds") return who + " can be folded" + into + by;
  if (section == "expanded")
    return "training-mode " + who + because + " computes batch statistics; fold would expand it into primitive ops" + by;
  if (section == "frozen") return "training-mode " + who + because + " would be frozen to inference mode" + by;
  if (section == "bias_absorbed") return who + " can be absorbed into the bias of " + (target.empty() ? "a layer" : target) + by;
  if (section == "scale_folded") return who + " can be folded into the weights of " + (target.empty() ? "a layer" : target) + by;
  if (section == "decomposed") return who + " would be decomposed into elementwise ops" + by;
  return who + ": " + section + into + by;
}

// A report section's entry in the checked model as a finding (every section but "skipped").
Finding rewriteFinding(const std::string& section, const nlohmann::json& entry) {
  Finding finding;
  finding.category = categoryOfSection(section);
  finding.entry = entry;
  for (const NamedField& field : kRemovedNodeFields) {
    finding.node = stringField(entry, field.field);
    if (finding.node.empty()) continue;
    finding.op = field.op ? field.op : stringField(entry, "op");
    break;
  }
  if (finding.op.empty() && finding.category.find("-bn") != std::string::npos) finding.op = "BatchNormalization";
  finding.graph = stringField(entry, "graph");
  finding.rule = stringField(entry, "rule");
  finding.message = rewriteMessage(section, finding);
  return finding;
}

// A graph whose nodes were not stored in topological order (sorted on load; fold writes it sorted).
Finding reorderedFinding(const nlohmann::json& entry) {
  Finding finding;
  finding.category = "unsorted-graph";
  finding.entry = entry;
  finding.graph = stringField(entry, "graph");
  const std::string owner = stringField(entry, "subgraph_of");
  const std::string where = owner.empty() ? "graph " + singleQuoted(finding.graph)
                                          : "subgraph " + singleQuoted(finding.graph) + " of node " + singleQuoted(owner);
  const auto moved = entry.value("moved_nodes", std::size_t{0});
  finding.message = "the nodes of " + where + " are not in topological order (" + std::to_string(moved) +
                    (moved == 1 ? " node" : " nodes") + " out of place); fold writes them sorted";
  return finding;
}

// A BatchNormalization left in place. Training mode is decided from the node itself, so a training-mode BN is
// found even when no rule that handles training mode ran.
Finding skippedFinding(const nlohmann::json& entry, const Node* node, int64_t opset) {
  Finding finding;
  finding.entry = entry;
  finding.node = stringField(entry, "node");
  finding.op = stringField(entry, "op");
  finding.graph = stringField(entry, "graph");
  finding.reason = stringField(entry, "reason");
  const auto details = entry.find("details");
  if (details != entry.end() && details->is_array() && !details->empty())
    finding.rule = stringField(details->front(), "rule");
  const std::string why = finding.reason + ": " + stringField(entry, "message");
  const std::string who = (finding.op.empty() ? std::string("BatchNormalization") : finding.op) + " " + singleQuoted(finding.node);
  const rules::BatchNormForm form = node ? rules::readBatchNormForm(*node, opset) : rules::BatchNormForm{};
  if (form.training) {
    // Keeping a training-mode BN does not make it an inference model: it stays a training-bn finding.
    finding.category = "training-bn";
    finding.message = "training-mode " + who + " [" + form.trainingCause + "] is left in place: " + why;
  } else if (finding.reason == "kept-by-user") {
    finding.category = "kept-bn";
    finding.message = who + " is kept by --keep/--keep-op";
  } else {
    finding.category = "unfoldable-bn";
    finding.message = who + " cannot be folded: " + why;
  }
  return finding;
}

ModelCheck checkOne(const ModelFile& file, const DriverOptions& driverOptions, const std::set<std::string>& failOn) {
  ModelCheck result;
  result.file = file.path;
  try {
    auto model = loadModel(file.path);
    result.opset = model->opsetVersion("");
    Report report;
    report.setInput(file.path);
    report.setReorderedGraphs(model->reorderedGraphs());
    for (const auto& entry : report.section(kReorderedSection)) result.findings.push_back(reorderedFinding(entry));
    runRules(*model, driverOptions, report);  // the model is changed in memory only; it is never saved
    for (const char* section : kReportSections) {
      // A constant chain evaluated for a rule is part of that rule's rewrite, found there.
      if (std::string(section) == "skipped" || std::string(section) == "evaluated") continue;
      for (const auto& entry : report.section(section)) result.findings.push_back(rewriteFinding(section, entry));
    }
    // Sections a newer rule may add are findings too.
    for (const auto& [key, value] : report.json().items()) {
      if (!value.is_array() || key == "rules" || key == "skipped" || key == kReorderedSection) continue;
      if (std::find(std::begin(kReportSections), std::end(kReportSections), key) != std::end(kReportSections)) continue;
      for (const auto& entry : value) result.findings.push_back(rewriteFinding(key, entry));
    }
    // The BNs left in place, by graph and name, to read their form.
    std::map<std::pair<std::string, std::string>, const Node*> remaining;
    for (Graph* graph : model->allGraphs())
      for (const auto& node : graph->nodes())
        if (node->isOnnxOp("BatchNormalization")) remaining.emplace(std::make_pair(graph->name(), node->name()), node.get());
    // BNs that would fold with --input-defaults-are-constant make one finding for the model, not one each.
    const InputDefaultsHint hint = inputDefaultsHint(*model, report);
    for (const auto& entry : report.section("skipped")) {
      if (entry.contains("would_fold_with")) continue;
      auto it = remaining.find({stringField(entry, "graph"), stringField(entry, "node")});
      result.findings.push_back(skippedFinding(entry, it == remaining.end() ? nullptr : it->second, result.opset));
    }
    if (hint.wouldFold > 0) {
      Finding finding;
      finding.category = "input-defaults";
      finding.op = "BatchNormalization";
      finding.reason = "params-overridable";
      finding.message = hint.message();
      result.findings.push_back(std::move(finding));
    }
    result.valid = true;
  } catch (...) {
    Finding finding;
    finding.category = "invalid-model";
    finding.message = currentErrorMessage(file.path);
    result.findings = {finding};
    result.valid = false;
  }
  for (Finding& finding : result.findings)
    finding.failing = finding.category == "invalid-model" || failOn.count(finding.category) > 0;
  return result;
}

const char* severityOf(const Finding& finding) { return finding.failing ? "error" : "warning"; }

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
      ++totals.findings;
      ++totals.byCategory[finding.category];
      if (finding.failing) {
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
  for (const std::string& category : kCategories) {
    auto it = counts.find(category);
    if (it != counts.end()) text += (text.empty() ? "" : ", ") + category + " " + std::to_string(it->second);
  }
  return text;
}

void printText(const std::vector<ModelCheck>& checks, const Totals& totals, const std::set<std::string>& failOn) {
  const Painter paint(colourAllowed(stdout));
  std::size_t categoryWidth = 0;
  for (const std::string& category : kCategories) categoryWidth = std::max(categoryWidth, category.size());
  for (const ModelCheck& check : checks) {
    if (check.findings.empty()) {
      std::cout << paint(Colour::Bold, check.file) << ": " << paint(Colour::Green, "clean") << "\n";
      continue;
    }
    std::cout << paint(Colour::Bold, check.file) << "\n";
    for (const Finding& finding : check.findings) {
      const std::string severity = severityOf(finding);
      std::cout << "  " << paint(finding.failing ? Colour::Red : Colour::Yellow, severity)
                << std::string(9 - severity.size(), ' ') << paint(Colour::Cyan, finding.category)
                << std::string(categoryWidth + 2 - finding.category.size(), ' ') << finding.message << "\n";
    }
  }
  std::string failing = "--fail-on ";
  if (failOn.empty()) failing += "none";
  for (const std::string& category : kCategories)
    if (failOn.count(category)) failing += (failing.back() == ' ' ? "" : ",") + category;
  std::cout << "\n" << totals.models << (totals.models == 1 ? " model" : " models") << ": " << totals.clean
            << " clean, " << totals.models - totals.clean - totals.invalid << " with findings, " << totals.invalid
            << " invalid; " << totals.findings << (totals.findings == 1 ? " finding" : " findings");
  if (totals.findings) std::cout << " (" << categoryCounts(totals.byCategory) << ")";
  std::cout << "; " << totals.failing << " failing under " << failing << "\n";
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
        {"failing_by_category", totals.failingByCategory}}},
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
  const DriverOptions driverOptions = driverOptionsFrom(options.ruleFlags);
  const std::set<std::string> failOn = parseFailOn(options.failOn);
  const std::vector<ModelFile> files = collectModelFiles(options.inputs);
  std::vector<ModelCheck> checks(files.size());
  runInParallel(
      files.size(), effectiveJobs(options.jobs),
      [&](std::size_t i) { checks[i] = checkOne(files[i], driverOptions, failOn); }, [](std::size_t) {});
  const Totals totals = totalsOf(checks);
  if (options.format == "json") printJson(checks, totals, failOn, driverOptions.rules);
  else if (options.format == "ndjson") printNdjson(checks);
  else if (options.format == "github") printGithub(checks);
  else printText(checks, totals, failOn);
  std::cout.flush();
  return exitCodeOf(totals);
}

const char* kCheckFooter = R"(
Categories:
  foldable-bn      a BatchNormalization `fold` would fold into a layer before or after it
  training-bn      a training-mode BatchNormalization (expanded, frozen, or left in place)
  unfoldable-bn    an inference-mode BatchNormalization no rule can remove (with the rule's reason code)
  kept-bn          an inference-mode BatchNormalization kept by --keep/--keep-op
  bias-add         an Add that would become a layer's bias
  scale-fold       a Mul that would be folded into a layer's weights
  decomposable-bn  a BatchNormalization that would be decomposed into elementwise ops
  other-rewrite    any other rewrite a rule would do
  unsorted-graph   a graph whose nodes are not stored in topological order (fold sorts them and says so)
  input-defaults   BatchNormalization left only because its parameters are initializers that are also graph
                   inputs; one finding per model saying how many would fold with --input-defaults-are-constant
  invalid-model    the model cannot be read or is structurally invalid (always fails, exit code 2)

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
  command->footer(std::string(kCheckFooter) + ruleListText());
  return [options] { return runCheck(*options); };
}

}  // namespace bnfold::cli
