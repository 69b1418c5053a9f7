// train-bn-freeze (--freeze-train-bn): training-mode BatchNormalization turned into inference mode, then folded by
// bn-fold like any other. Numbers are checked against hand-written inference-mode models in ONNX Runtime.

#include <catch2/catch.hpp>
#include <fstream>

#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;

namespace {

constexpr const char* kFreeze = "train-bn-freeze";
constexpr const char* kExpand = "train-bn-expand";

RuleOptions freezing() {
  RuleOptions options;
  options.freezeTrainingBatchNorm = true;
  return options;
}

const char* kParams =
    "<float[3] scale = {1.5, -0.5, 2}, float[3] bias = {0.25, -1, 0.5}, float[3] mean = {0.125, -0.25, 0.5}, "
    "float[3] var = {0.5, 1.5, 2.25}>";

std::string header(int64_t opset) { return "<ir_version: 8, opset_import: [\"\" : " + std::to_string(opset) + "]>\n"; }

// x [2,3,4,5] -> one BatchNormalization with the given attributes and outputs; the first `graphOutputs` of them
// (all by default) are graph outputs.
std::string bnModel(int64_t opset, const std::string& attributes, const std::vector<std::string>& outputs,
                    const std::string& params = kParams, std::size_t graphOutputs = 5) {
  std::string declared, produced;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const std::string& name = outputs[i];
    if (i < graphOutputs)
      declared += std::string(declared.empty() ? "" : ", ") + (name == "y" ? "float[2,3,4,5] " : "float[3] ") + name;
    produced += (produced.empty() ? "" : ", ") + name;
  }
  return header(opset) + "g (float[2,3,4,5] x) => (" + declared + ")\n" + params + "\n{\n  " + produced +
         " = BatchNormalization" + (attributes.empty() ? "" : " <" + attributes + ">") +
         " (x, scale, bias, mean, var)\n}\n";
}

const nlohmann::json& onlyEntry(const Report& report, const std::string& section) {
  const auto& entries = report.section(section);
  REQUIRE(entries.size() == 1);
  return entries[0];
}

std::vector<std::string> graphOutputNames(const Graph& graph) {
  std::vector<std::string> names;
  for (const auto& entry : graph.outputs()) names.push_back(entry.value->name());
  return names;
}

// Saves `model` and compares it in ONNX Runtime with the reference model stated in ONNX text.
OrtComparison compareWithReference(Model& model, const std::string& referenceText, double tolerance) {
  TempDir dir;
  saveModel(model, dir.file("frozen.onnx"));
  auto reference = parseModel(referenceText);
  saveModel(*reference, dir.file("reference.onnx"));
  return compareInOrt(dir.file("frozen.onnx"), dir.file("reference.onnx"), tolerance, tolerance);
}

}  // namespace

TEST_CASE("train-bn-freeze: opset 15 training BN becomes an inference BN, running outputs pass through",
          "[train-bn-freeze]") {
  auto model = parseModel(
      bnModel(15, "training_mode = 1, epsilon = 0.01, momentum = 0.8", {"y", "running_mean", "running_var"}));
  Report report = applyRules(*model, {kFreeze, kExpand}, freezing());
  const Graph& graph = model->graph();
  CHECK(opSequence(graph) == "BatchNormalization,Identity,Identity");
  const Node* bn = findNode(graph, "BatchNormalization");
  CHECK_FALSE(bn->hasAttribute("training_mode"));
  CHECK(bn->outputs().size() == 1);
  CHECK(bn->output(0)->name() == "y");
  CHECK(bn->attributeFloat("epsilon", 0) == 0.01f);
  std::vector<std::string> inputs;
  for (const Value* input : bn->inputs()) inputs.push_back(input->name());
  CHECK(inputs == std::vector<std::string>{"x", "scale", "bias", "mean", "var"});
  const Node* runningMean = graph.findLocal("running_mean")->producer();
  CHECK(runningMean->opType() == "Identity");
  CHECK(runningMean->input(0)->name() == "mean");
  CHECK(graph.findLocal("running_var")->producer()->input(0)->name() == "var");
  CHECK(graphOutputNames(graph) == std::vector<std::string>{"y", "running_mean", "running_var"});

  const auto& entry = onlyEntry(report, "frozen");
  CHECK(entry["rule"] == kFreeze);
  CHECK(entry["node"] == "BatchNormalization_0");
  CHECK(entry["replacement"] == bn->name());
  CHECK(entry["form"] == "opset-15 (training_mode)");
  CHECK(entry["outputs"] == nlohmann::json{"y", "running_mean", "running_var"});
  CHECK(report.section("expanded").empty());
  // The frozen BN is a node the rewrite made: it is reported as left in place, the training one it replaced is not.
  REQUIRE(report.section("skipped").size() == 1);
  CHECK(report.section("skipped")[0]["node"] == bn->name());
  CHECK(report.section("skipped")[0]["reason"] == "not-training-mode");

  // Same numbers as an inference-mode BN written by hand, bit for bit.
  const std::string reference =
      header(15) + "g (float[2,3,4,5] x) => (float[2,3,4,5] y, float[3] running_mean, float[3] running_var)\n" +
      kParams +
      "\n{\n  y = BatchNormalization <epsilon = 0.01, momentum = 0.8> (x, scale, bias, mean, var)\n"
      "  running_mean = Identity (mean)\n  running_var = Identity (var)\n}\n";
  const OrtComparison comparison = compareWithReference(*model, reference, 0.0);
  INFO(comparison.error);
  CHECK(comparison.ok);
}

TEST_CASE("train-bn-freeze: opset 9 loses its optional outputs, opset 6 gets is_test=1", "[train-bn-freeze]") {
  SECTION("opset 9") {
    // Opsets 7-13 allow 1 or 5 outputs: saved_mean/saved_var are declared but not read.
    auto model = parseModel(
        bnModel(9, "epsilon = 0.001", {"y", "running_mean", "running_var", "saved_mean", "saved_var"}, kParams, 3));
    Report report = applyRules(*model, {kFreeze}, freezing());
    const Node* bn = findNode(model->graph(), "BatchNormalization");
    REQUIRE(bn);
    CHECK(bn->outputs().size() == 1);
    CHECK(opSequence(model->graph()) == "BatchNormalization,Identity,Identity");
    CHECK(onlyEntry(report, "frozen")["cause"] == "optional outputs present");
    const std::string reference =
        header(9) + "g (float[2,3,4,5] x) => (float[2,3,4,5] y, float[3] running_mean, float[3] running_var)\n" +
        kParams +
        "\n{\n  y = BatchNormalization <epsilon = 0.001> (x, scale, bias, mean, var)\n"
        "  running_mean = Identity (mean)\n  running_var = Identity (var)\n}\n";
    const OrtComparison comparison = compareWithReference(*model, reference, 0.0);
    INFO(comparison.error);
    CHECK(comparison.ok);
  }
  SECTION("opset 6 (structure only: ONNX Runtime has no kernel below opset 7)") {
    auto model = parseModel(bnModel(6, "is_test = 0", {"y"}));
    Report report = applyRules(*model, {kFreeze}, freezing());
    const Node* bn = findNode(model->graph(), "BatchNormalization");
    REQUIRE(bn);
    CHECK(bn->attributeInt("is_test", 0) == 1);
    CHECK(onlyEntry(report, "frozen")["cause"] == "is_test=0");
  }
}

TEST_CASE("train-bn-freeze: without --freeze-train-bn the BN is expanded, and frozen when asked", "[train-bn-freeze]") {
  const std::string text = bnModel(15, "training_mode = 1", {"y", "running_mean", "running_var"});
  SECTION("not requested: expansion, the freeze rule's reason only in the details") {
    auto model = parseModel(text);
    Report report = applyRules(*model, {kFreeze, kExpand});
    CHECK(report.section("frozen").empty());
    CHECK(report.section("expanded").size() == 1);
    CHECK(countOps(*model, "BatchNormalization") == 0);
  }
  SECTION("not requested and nothing else enabled: the reason says so") {
    auto model = parseModel(text);
    Report report = applyRules(*model, {kFreeze});
    CHECK(onlyEntry(report, "skipped")["reason"] == "freeze-not-requested");
  }
  SECTION("requested with the default rules: freezing wins over expanding") {
    auto model = parseModel(text);
    Report report = applyRules(*model, parseRuleSelection("default"), freezing());
    CHECK(report.section("frozen").size() == 1);
    CHECK(report.section("expanded").empty());
  }
}

TEST_CASE("train-bn-freeze: BNs it refuses keep their reason", "[train-bn-freeze]") {
  auto skippedReason = [](const std::string& text, const RuleOptions& options) {
    auto model = parseModel(text);
    Report report = applyRules(*model, {kFreeze}, options);
    CHECK(report.section("frozen").empty());
    return onlyEntry(report, "skipped")["reason"].get<std::string>();
  };
  SECTION("already in inference mode") {
    CHECK(skippedReason(bnModel(15, "", {"y"}), freezing()) == "not-training-mode");
  }
  SECTION("empty mean/var: nothing to freeze to") {
    const std::string params =
        "<float[3] scale = {1, 2, 3}, float[3] bias = {0, 0, 0}, float[0] mean = {}, float[0] var = {}>";
    CHECK(skippedReason(bnModel(15, "", {"y"}, params), freezing()) == "empty-statistics");
  }
  SECTION("saved statistics read (opset 9): inference mode has none") {
    const std::string text = bnModel(9, "", {"y", "running_mean", "running_var", "saved_mean", "saved_var"});
    CHECK(skippedReason(text, freezing()) == "saved-statistics-read");
    // With expansion enabled it falls back to expanding.
    auto model = parseModel(text);
    Report report = applyRules(*model, {kFreeze, kExpand}, freezing());
    CHECK(report.section("expanded").size() == 1);
  }
  SECTION("kept by the user") {
    RuleOptions options = freezing();
    options.keepNodes = {"Batch*"};
    CHECK(skippedReason(bnModel(15, "training_mode = 1", {"y"}), options) == "kept-by-user");
  }
}

TEST_CASE("train-bn-freeze: a frozen BN after a Conv is folded by bn-fold", "[train-bn-freeze]") {
  REQUIRE(findRule("bn-fold"));
  const std::string body =
      "g (float[2,2,5,5] input) => (float[2,3,5,5] r)\n"
      "<float[3,2,1,1] w = {0.5, -1, 1.5, 0.25, -0.75, 1}, float[3] scale = {1, -2, 0.5}, float[3] bias = {0, 0.5, -1},"
      " float[3] mean = {0.25, -0.5, 0}, float[3] var = {1, 0.5, 2}>\n{\n  x = Conv (input, w)\n";
  auto model = parseModel(header(15) + body +
                          "  y, rm, rv = BatchNormalization <training_mode = 1> (x, scale, bias, mean, var)\n"
                          "  r = Relu (y)\n}\n");
  Report report = applyRules(*model, parseRuleSelection("default"), freezing());
  CHECK(opSequence(model->graph()) == "Conv,Relu");
  CHECK(report.section("frozen").size() == 1);
  CHECK(report.section("folds").size() == 1);
  CHECK(report.section("skipped").empty());
  const std::string reference =
      header(15) + body + "  y = BatchNormalization (x, scale, bias, mean, var)\n  r = Relu (y)\n}\n";
  const OrtComparison comparison = compareWithReference(*model, reference, 1e-5);
  INFO(comparison.error);
  CHECK(comparison.ok);
}

TEST_CASE("train-bn-freeze: the CLI flag freezes the sample model, which then folds", "[train-bn-freeze][cli]") {
  TempDir dir;
  const std::string sample = sourceDir() + "/models/training_bn.onnx";
  auto readReport = [&](const std::string& path) {
    std::ifstream in(path);
    return nlohmann::json::parse(in);
  };
  std::string out, err;
  REQUIRE(runCommand(bnfoldExecutable() + " fold " + sample + " -o " + dir.file("frozen.onnx") + " --report " +
                         dir.file("frozen.json") + " --freeze-train-bn",
                     &out, &err) == 0);
  const auto frozen = readReport(dir.file("frozen.json"));
  CHECK(frozen["frozen"].size() == 1);
  CHECK(frozen["expanded"].empty());
  auto frozenModel = loadModel(dir.file("frozen.onnx"));
  CHECK(countOps(*frozenModel, "BatchNormalization") == 0);
  CHECK(frozen["folds"].size() == 1);

  REQUIRE(runCommand(bnfoldExecutable() + " fold " + sample + " -o " + dir.file("expanded.onnx") + " --report " +
                         dir.file("expanded.json"),
                     &out, &err) == 0);
  const auto expanded = readReport(dir.file("expanded.json"));
  CHECK(expanded["frozen"].empty());
  CHECK(expanded["expanded"].size() == 1);
  // The expansion keeps the function: ONNX Runtime gives the same outputs as for the original.
  const OrtComparison comparison = compareInOrt(sample, dir.file("expanded.onnx"), 1e-5, 1e-5);
  INFO(comparison.error);
  CHECK(comparison.ok);
}
