#include "test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <catch2/catch.hpp>
#include <onnx/defs/parser.h>

#include "bnfold/check/findings.h"

namespace bnfold::test {
namespace fs = std::filesystem;

std::string sourceDir() { return BNFOLD_TEST_SOURCE_DIR; }
std::string bnfoldExecutable() { return BNFOLD_TEST_EXECUTABLE; }

onnx::ModelProto parseModelProto(const std::string& text) {
  onnx::ModelProto proto;
  auto status = onnx::OnnxParser::Parse(proto, text.c_str());
  if (!status.IsOK()) throw std::runtime_error("ONNX text does not parse: " + status.ErrorMessage());
  return proto;
}

std::unique_ptr<Model> parseModel(const std::string& text) {
  return modelFromProto(parseModelProto(text), "<onnx text>", ".");
}

std::string opSequence(const Graph& graph) {
  std::string out;
  for (const auto& node : graph.nodes()) out += (out.empty() ? "" : ",") + node->opType();
  return out;
}

int countOps(Model& model, const std::string& opType) {
  int count = 0;
  for (Graph* graph : model.allGraphs())
    for (const auto& node : graph->nodes()) count += node->opType() == opType;
  return count;
}

const Node* findNode(const Graph& graph, const std::string& opType) {
  for (const auto& node : graph.nodes())
    if (node->opType() == opType) return node.get();
  return nullptr;
}

const Node* findNodeByName(Model& model, const std::string& name) {
  for (Graph* graph : model.allGraphs())
    for (const auto& node : graph->nodes())
      if (node->name() == name) return node.get();
  return nullptr;
}

Report applyRules(Model& model, const std::vector<std::string>& rules, const RuleOptions& options) {
  Report report;
  DriverOptions driverOptions;
  driverOptions.rules = rules;
  driverOptions.ruleOptions = options;
  driverOptions.verify = true;
  runRules(model, driverOptions, report);
  model.graph().verify();
  // Every rewrite of every rule test is also checked by --verify: it must pass wherever the rules rewrite.
  for (const Finding& failure : failedVerifications(report)) FAIL_CHECK(failure.message);
  return report;
}

TempDir::TempDir() {
  std::string pattern = (fs::temp_directory_path() / "bnfold-test-XXXXXX").string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("cannot create a temp folder");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

int runCommand(const std::string& command, std::string* out, std::string* err) {
  TempDir dir;
  const std::string outFile = dir.file("stdout"), errFile = dir.file("stderr");
  const int status = std::system((command + " >" + outFile + " 2>" + errFile).c_str());
  auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
  };
  if (out) *out = slurp(outFile);
  if (err) *err = slurp(errFile);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

namespace {
std::string shellQuote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}
}  // namespace

OrtComparison compareInOrt(const std::string& modelA, const std::string& modelB, double atol, double rtol) {
  OrtComparison result;
  std::ostringstream command;
  command << "node " << shellQuote(sourceDir() + "/scripts/ort/compare.js") << " " << shellQuote(modelA) << " "
          << shellQuote(modelB) << " --json --atol " << atol << " --rtol " << rtol;
  std::string out, err;
  const int code = runCommand(command.str(), &out, &err);
  try {
    result.details = nlohmann::json::parse(out);
  } catch (const std::exception&) {
    result.error = "compare.js exited " + std::to_string(code) + ": " + err + out;
    return result;
  }
  if (result.details.contains("error") && !result.details["error"].is_null())
    result.error = result.details["error"].dump();
  for (const auto& output : result.details.value("outputs", nlohmann::json::array())) {
    if (output.contains("max_abs") && output["max_abs"].is_number())
      result.maxAbs = std::max(result.maxAbs, output["max_abs"].get<double>());
    if (output.contains("max_rel") && output["max_rel"].is_number())
      result.maxRel = std::max(result.maxRel, output["max_rel"].get<double>());
  }
  result.ok = code == 0 && result.error.empty() && result.details.value("ok", false);
  if (!result.ok && result.error.empty()) result.error = "outputs differ: " + result.details.dump();
  return result;
}

FoldOutcome applyRulesAndCompare(Model& model, const std::vector<std::string>& rules, double atol, double rtol,
                                 const RuleOptions& options) {
  TempDir dir;
  saveModel(model, dir.file("original.onnx"));
  FoldOutcome outcome{applyRules(model, rules, options), {}};
  saveModel(model, dir.file("rewritten.onnx"));
  outcome.comparison = compareInOrt(dir.file("original.onnx"), dir.file("rewritten.onnx"), atol, rtol);
  return outcome;
}

std::string cli(const std::string& args) { return bnfoldExecutable() + " " + args; }

std::string sample(const std::string& name) { return sourceDir() + "/models/" + name; }

std::string readFile(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) return {};
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void writeFile(const std::string& path, const std::string& bytes) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream(path, std::ios::binary) << bytes;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) out.push_back(line);
  return out;
}

}  // namespace bnfold::test
