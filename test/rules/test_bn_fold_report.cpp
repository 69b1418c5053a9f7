// bn-fold's report entries, the report JSON Schema (schema/report.schema.json, checked with
// scripts/validate_report.py — which must also reject broken reports), and the sample models in models/.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "bnfold/check/fold.h"
#include "bnfold/rewrite/rewriter.h"
#include "check/fold_testing.h"
#include "test_bn_fold_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;
namespace fs = std::filesystem;

namespace {

constexpr double kAtol = 1e-6, kRtol = 1e-5;

std::string shellQuote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

void writeJson(const std::string& path, const nlohmann::json& json) { std::ofstream(path) << json.dump(2); }

std::vector<std::string> sampleModels() {
  std::vector<std::string> models;
  for (const auto& entry : fs::directory_iterator(sourceDir() + "/models"))
    if (entry.path().extension() == ".onnx") models.push_back(entry.path().string());
  std::sort(models.begin(), models.end());
  return models;
}

}  // namespace

TEST_CASE("bn-fold report entry: names before and after, and the BN's own parameters", "[bn-fold][report]") {
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<float[2,2,1,1] w = {0.5, -1.25, 2, 0.75}, float[2] bias = {0.1, -0.2},
 float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375}, float[2] v = {0.5, 2}>
{
  c = Conv (x, w, bias)
  y = BatchNormalization <epsilon = 0.25> (c, s, b, m, v)
}
)");
  const Report report = applyRules(*model, {"bn-fold"});
  REQUIRE(report.section("folds").size() == 1);
  CHECK(report.section("skipped").empty());
  const auto entry = report.section("folds")[0];
  const Node* conv = findNode(model->graph(), "Conv");
  CHECK(entry["rule"] == "bn-fold");
  CHECK(entry["bn"] == "BatchNormalization_0");
  CHECK(entry["into"] == "Conv_0");
  CHECK(entry["into_op"] == "Conv");
  CHECK(entry["graph"] == "g");
  CHECK(entry["direction"] == "backward");
  CHECK(entry["bn_form"] == "opset-15 (training_mode)");
  CHECK(entry["weight_before"] == "w");
  CHECK(entry["weight_after"] == conv->input(1)->name());
  CHECK(entry["bias_before"] == "bias");
  CHECK(entry["bias_after"] == conv->input(2)->name());
  CHECK(entry["bias_created"] == false);
  CHECK(entry["gamma"] == nlohmann::json({1.5, -0.5}));
  CHECK(entry["beta"] == nlohmann::json({0.25, -1.0}));
  CHECK(entry["mean"] == nlohmann::json({0.125, -0.375}));
  CHECK(entry["var"] == nlohmann::json({0.5, 2.0}));
  CHECK(entry["epsilon"].get<double>() == 0.25);
  CHECK_FALSE(entry.contains("replaced_node"));
  // The report names real nodes and tensors of the output model.
  CHECK(findNodeByName(*model, entry["into"]) == conv);
  CHECK(findInitializer(*model, entry["weight_after"]) != nullptr);
  CHECK(findInitializer(*model, entry["bias_after"]) != nullptr);
}

TEST_CASE("bn-fold: a BN left in place gets bn-fold's reason first, with every rule's reason in details",
          "[bn-fold][report]") {
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375}, float[2] v = {0.5, 2}>
{
  r = Relu (x)
  y = BatchNormalization (r, s, b, m, v)
}
)");
  const Report report = applyRules(*model, {"bn-fold", "train-bn-expand"});
  REQUIRE(report.section("skipped").size() == 1);
  const auto entry = report.section("skipped")[0];
  CHECK(entry["reason"] == "no-foldable-producer");
  REQUIRE(entry["details"].is_array());
  CHECK(entry["details"][0]["rule"] == "bn-fold");
  CHECK(entry["message"].get<std::string>().find("Relu") != std::string::npos);
}

// The driver lists the BatchNormalizations once before the rules run and reports the ones left from that list; these
// pin down that it reports exactly what a look through every graph afterwards would.
namespace {

const char* kBatchNormsInTwoGraphs = R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,3,3] x, bool cond) => (float[1,2,3,3] y, float[1,2,3,3] z)
<float[2,2,1,1] w = {1, 0.5, -0.25, 2}, float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375},
 float[2] v = {0.5, 2}>
{
  r = Relu (x)
  y = BatchNormalization (r, s, b, m, v)
  c = Conv (x, w)
  z = BatchNormalization (c, s, b, m, v)
  u = If (cond) <
    then_branch = t () => (float[1,2,3,3] ty) { ty = BatchNormalization (x, s, b, m, v) },
    else_branch = e () => (float[1,2,3,3] ey) { ey = Identity (x) }>
}
)";

std::vector<std::string> skippedGraphs(const Report& report) {
  std::vector<std::string> graphs;
  for (const auto& entry : report.section("skipped")) graphs.push_back(entry["graph"].get<std::string>());
  return graphs;
}

}  // namespace

TEST_CASE("skipped: each BN left, in graph order, a subgraph's after the main graph's", "[bn-fold][report]") {
  auto model = parseModel(kBatchNormsInTwoGraphs);
  const Report report = applyRules(*model, {"bn-fold"});
  CHECK(report.section("folds").size() == 1);
  CHECK(skippedGraphs(report) == std::vector<std::string>{"g", "t"});
  const Node* mainBatchNorm = findNode(model->graph(), "BatchNormalization");
  REQUIRE(mainBatchNorm);
  CHECK(report.section("skipped")[0]["node"] == mainBatchNorm->name());
  CHECK(report.section("skipped")[1]["reason"] == "no-foldable-producer");
}

TEST_CASE("skipped: a BN in a subgraph whose node a rewrite removed is not reported", "[bn-fold][report]") {
  auto model = parseModel(kBatchNormsInTwoGraphs);
  Node* ifNode = nullptr;
  for (const auto& node : model->graph().nodes())
    if (node->opType() == "If") ifNode = node.get();
  REQUIRE(ifNode);
  // No rule removes an If today: the test hook does, after the fold, so that the subgraph goes with it.
  bool removed = false;
  DriverOptions options;
  options.rules = {"bn-fold"};
  auto removeIf = [&](Rewriter& rewriter, const std::vector<Node*>&) {
    if (removed) return;
    rewriter.eraseNode(ifNode);  // its output is read by nothing
    removed = true;
  };
  Report report;
  runRulesInjectingFaults(*model, options, removeIf, report);
  REQUIRE(removed);
  CHECK(ifNode->isErased());
  CHECK(report.section("folds").size() == 1);
  CHECK(skippedGraphs(report) == std::vector<std::string>{"g"});
}

TEST_CASE("reports validate against schema/report.schema.json", "[bn-fold][report][schema]") {
  TempDir dir;
  std::vector<std::string> reports;
  // Every sample model, with bn-fold alone, with the default rules (the other rules' sections must fit the
  // schema's open part), and with every rule and --verify (each entry's "verify" object, the summary).
  for (const std::string& model : sampleModels()) {
    for (const std::string rules : {"bn-fold", "default", "all --freeze-train-bn --verify"}) {
      const std::string stem = fs::path(model).stem().string() + "-" + rules.substr(0, rules.find(' '));
      const std::string report = dir.file(stem + ".json");
      std::string out, err;
      const int code = runCommand(shellQuote(bnfoldExecutable()) + " fold " + shellQuote(model) + " -o " +
                                      shellQuote(dir.file(stem + ".onnx")) + " --report " + shellQuote(report) +
                                      " --rules " + rules,
                                  &out, &err);
      INFO(model << ": " << err);
      REQUIRE(code == 0);
      reports.push_back(report);
    }
  }
  // A report with a MatMul replaced by a Gemm, a fold in a subgraph and a BN left, from the library.
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[4,2] x, bool c) => (float[4,2] y, float[4,2] z)
<float[2,2] w = {1, 2, 3, 4}, float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375}, float[2] v = {0.5, 2}>
{
  h = MatMul (x, w)
  y = BatchNormalization (h, s, b, m, v)
  z = If (c) <
    then_branch = t_g () => (float[4,2] t) { th = Gemm (x, w)  t = BatchNormalization (th, s, b, m, v) },
    else_branch = e_g () => (float[4,2] e) { e = BatchNormalization (x, s, b, m, v) }
  >
}
)");
  const Report report = applyRules(*model, {"bn-fold"});
  CHECK(report.section("folds").size() == 2);
  CHECK(report.section("skipped").size() == 1);
  reports.push_back(dir.file("library.json"));
  report.write(reports.back());

  std::string out;
  CHECK(validateReports(reports, &out) == 0);
  INFO(out);
  CHECK(out.empty());
}

TEST_CASE("the report validator rejects broken reports", "[bn-fold][report][schema]") {
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,3,3] x) => (float[1,2,3,3] y, float[1,2,3,3] z)
<float[2,2,1,1] w = {0.5, -1.25, 2, 0.75}, float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375}, float[2] v = {0.5, 2}>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
  z = BatchNormalization (x, s, b, m, v)
}
)");
  const nlohmann::json good = applyRules(*model, {"bn-fold"}).json();
  REQUIRE(good["folds"].size() == 1);
  REQUIRE(good["skipped"].size() == 1);
  TempDir dir;
  writeJson(dir.file("good.json"), good);
  std::string out;
  REQUIRE(validateReports({dir.file("good.json")}, &out) == 0);

  // Each breaks one promise of the format; the validator must say where.
  const std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> breakages = {
      {"/folds/0", [](nlohmann::json& r) { r["folds"][0].erase("gamma"); }},
      {"/folds/0/bias_created", [](nlohmann::json& r) { r["folds"][0]["bias_created"] = "true"; }},
      {"/folds/0/mean/1", [](nlohmann::json& r) { r["folds"][0]["mean"][1] = nullptr; }},
      {"/folds/0/unexpected", [](nlohmann::json& r) { r["folds"][0]["unexpected"] = 1; }},
      {"/folds/0/direction", [](nlohmann::json& r) { r["folds"][0]["direction"] = "sideways"; }},
      {"/folds/0/bias_before", [](nlohmann::json& r) { r["folds"][0]["bias_before"] = "b0"; }},  // created => null
      {"/skipped/0/reason", [](nlohmann::json& r) { r["skipped"][0]["reason"] = "Layer has other consumers"; }},
      {"/skipped/0", [](nlohmann::json& r) { r["skipped"][0].erase("message"); }},
      {"/tool/name", [](nlohmann::json& r) { r["tool"]["name"] = "other"; }},
      {"/opset", [](nlohmann::json& r) { r["opset"] = "15"; }},
      {"/new_section", [](nlohmann::json& r) { r["new_section"] = nlohmann::json::object(); }},
      {"/new_section/0", [](nlohmann::json& r) { r["new_section"] = {{{"no_rule_field", 1}}}; }},
      {"/", [](nlohmann::json& r) { r.erase("expanded"); }},
  };
  for (const auto& [where, breakIt] : breakages) {
    DYNAMIC_SECTION("broken at " << where) {
      nlohmann::json bad = good;
      breakIt(bad);
      writeJson(dir.file("bad.json"), bad);
      std::string problems;
      CHECK(validateReports({dir.file("bad.json")}, &problems) == 1);
      CHECK(problems.find("bad.json: " + where + ":") != std::string::npos);
      INFO(problems);
    }
  }
  // A future rule's section of proper entries is accepted.
  nlohmann::json extended = good;
  extended["new_section"] = {{{"rule", "some-new-rule"}, {"anything", 1}}};
  writeJson(dir.file("extended.json"), extended);
  CHECK(validateReports({dir.file("extended.json")}, &out) == 0);
  // Unreadable input is an error, not a verdict.
  CHECK(validateReports({dir.file("missing.json")}, &out) == 2);
}

TEST_CASE("bn-fold on the sample models: what each README line promises", "[bn-fold][models]") {
  struct Expectation {
    std::size_t folds;
    std::map<std::string, std::string> skipped;  // BN name -> reason
    std::string ops;                             // op sequence after
  };
  const std::map<std::string, Expectation> expected = {
      {"resnet_block.onnx", {3, {}, "Conv,Relu,Conv,Relu,Conv,Add,Relu,GlobalAveragePool,Flatten,Gemm"}},
      {"mlp_bn1d.onnx", {2, {}, "Gemm,Relu,Gemm"}},
      {"decoder_convtranspose.onnx", {2, {}, "ConvTranspose,Relu,ConvTranspose"}},
      {"training_bn.onnx", {0, {{"bn", "training-mode"}}, "Conv,BatchNormalization"}},
      {"bias_add.onnx", {0, {}, "Conv,Add,Mul,Relu,Conv,Add"}},
      {"unfoldable_bn.onnx",
       {0,
        {{"input_bn", "no-foldable-producer"},
         {"post_act/bn", "no-foldable-producer"},
         {"shared/bn", "layer-has-other-consumers"}},
        "BatchNormalization,Conv,Relu,BatchNormalization,Conv,BatchNormalization,Sigmoid"}},
  };
  const auto models = sampleModels();
  REQUIRE(models.size() == expected.size());
  for (const std::string& path : models) {
    const std::string name = fs::path(path).filename().string();
    DYNAMIC_SECTION(name) {
      REQUIRE(expected.count(name));
      const Expectation& want = expected.at(name);
      auto model = loadModel(path);
      std::vector<std::string> outputNames;
      for (const auto& output : model->graph().outputs()) outputNames.push_back(output.value->name());
      auto outcome = applyRulesAndCompare(*model, {"bn-fold"}, kAtol, kRtol);
      INFO(outcome.comparison.error);
      CHECK(outcome.comparison.ok);
      INFO("max abs " << outcome.comparison.maxAbs << ", max rel " << outcome.comparison.maxRel);
      CHECK(outcome.report.section("folds").size() == want.folds);
      CHECK(outcome.report.section("skipped").size() == want.skipped.size());
      for (const auto& [bn, reason] : want.skipped) CHECK(skipReason(outcome.report, bn) == reason);
      CHECK(opSequence(model->graph()) == want.ops);
      // Graph outputs keep their names.
      std::vector<std::string> after;
      for (const auto& output : model->graph().outputs()) after.push_back(output.value->name());
      CHECK(after == outputNames);
      for (const auto& entry : outcome.report.section("folds")) {
        CHECK(findNodeByName(*model, entry["into"]) != nullptr);
        CHECK(findInitializer(*model, entry["weight_after"]) != nullptr);
      }
    }
  }
}
