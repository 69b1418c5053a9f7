// bn-fold: what must not break. Every condition that blocks the fold has a negative test asserting its reason
// code (and that the graph is untouched); the sharing, chaining, degenerate-parameter, subgraph, IR-version and
// clean-up cases are positive tests with an ONNX Runtime check where it has kernels.
#include <catch2/catch.hpp>
#include <onnx/checker.h>

#include <limits>
#include <set>

#include "test_bn_fold_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;

namespace {

constexpr double kAtol = 1e-6, kRtol = 1e-5;

// A Conv (2 -> 2 channels, 1x1) and its BN parameters, as text fragments for the cases below.
const char* const kWeight = "float[2,2,1,1] w = {0.5, -1.25, 2, 0.75}";
const char* const kParams =
    "float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375}, float[2] v = {0.5, 2}";

std::string header(int opset = 15, int irVersion = 8) {
  return "<ir_version: " + std::to_string(irVersion) + ", opset_import: [\"\" : " + std::to_string(opset) + "]>\n";
}

/// Runs bn-fold on a model that must not change: the BN stays, the reason is `code`, nothing is folded, and the
/// op sequence and initializers are what they were.
void expectSkipped(const std::string& text, const std::string& code, const RuleOptions& options = {},
                   const std::string& bn = "BatchNormalization_0") {
  auto model = parseModel(text);
  const std::string opsBefore = opSequence(model->graph());
  const std::size_t initializersBefore = model->graph().initializers().size();
  const Report report = applyRules(*model, {"bn-fold"}, options);
  INFO(report.dump());
  CHECK(report.section("folds").empty());
  CHECK(skipReason(report, bn) == code);
  CHECK_FALSE(skipMessage(report, bn).empty());
  CHECK(opSequence(model->graph()) == opsBefore);
  CHECK(model->graph().initializers().size() == initializersBefore);
}

/// Applies bn-fold and compares with ONNX Runtime; returns the report.
Report foldAndCompare(Model& model, const RuleOptions& options = {}) {
  auto outcome = applyRulesAndCompare(model, {"bn-fold"}, kAtol, kRtol, options);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  return outcome.report;
}

// Folds `model` (checked in ONNX Runtime): its one BN, inside the subgraph named `graph`, is folded, none is left.
void checkOneFoldInside(Model& model, const std::string& graph) {
  const Report report = foldAndCompare(model);
  REQUIRE(report.section("folds").size() == 1);
  CHECK(report.section("folds")[0]["graph"] == graph);
  CHECK(countOps(model, "BatchNormalization") == 0);
}

}  // namespace

TEST_CASE("bn-fold refuses: the layer output has another reader or is a graph output", "[bn-fold]") {
  expectSkipped(header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y, float[1,2,3,3] z)
<)" + kWeight + ", " + kParams + R"(>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
  z = Sigmoid (c)
}
)",
                "layer-has-other-consumers");
  expectSkipped(header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y, float[1,2,3,3] c)
<)" + kWeight + ", " + kParams + R"(>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)",
                "layer-has-other-consumers");
}

TEST_CASE("bn-fold refuses: BN params fed or computed at run time", "[bn-fold]") {
  // s is a plain graph input.
  expectSkipped(header() + R"(g (float[1,2,3,3] x, float[2] s) => (float[1,2,3,3] y)
<)" + kWeight + R"(, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375}, float[2] v = {0.5, 2}>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)",
                "params-not-constant");
  // m is computed by a node.
  expectSkipped(header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<)" + kWeight + R"(, float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1}, float[2] m0 = {0.125, -0.375}, float[2] v = {0.5, 2}>
{
  c = Conv (x, w)
  m = Abs (m0)
  y = BatchNormalization (c, s, b, m, v)
}
)",
                "params-not-constant");
}

TEST_CASE("bn-fold: initializers that are also graph inputs", "[bn-fold]") {
  // Declared in the input list with a value: an initializer that is also a graph input.
  auto text = [](int irVersion) {
    // IR 3 goes with opsets up to 8.
    return header(irVersion == 3 ? 8 : 15, irVersion) + R"(g (float[1,2,3,3] x, float[2] v = {0.5, 2}) => (float[1,2,3,3] y)
<)" + kWeight + R"(, float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375}>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)";
  };
  SECTION("IR 8: an overridable default, not folded") { expectSkipped(text(8), "params-overridable"); }
  SECTION("IR 8 with inputDefaultsAreConstant: folded") {
    auto model = parseModel(text(8));
    RuleOptions options;
    options.inputDefaultsAreConstant = true;
    const Report report = applyRules(*model, {"bn-fold"}, options);
    CHECK(report.section("folds").size() == 1);
    CHECK(opSequence(model->graph()) == "Conv");
    // A graph input is part of the model's interface: it stays even without readers.
    CHECK(model->graph().findLocal("v") != nullptr);
    CHECK(model->graph().inputs().size() == 2);
  }
  SECTION("IR 3: every initializer is listed as an input, and they are constants") {
    // A valid IR-3 model lists every initializer among the graph inputs.
    auto model = parseModel(header(8, 3) + R"(g (float[1,2,3,3] x, )" + kWeight +
                            R"(, float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375},
   float[2] v = {0.5, 2}) => (float[1,2,3,3] y)
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)");
    REQUIRE_NOTHROW(onnx::checker::check_model(modelToProto(*model)));
    const Report report = foldAndCompare(*model);
    CHECK(report.section("folds").size() == 1);
    CHECK(opSequence(model->graph()) == "Conv");
    // The new weight and bias are listed as inputs too, so the result is still valid IR 3.
    std::set<std::string> inputNames;
    for (const auto& input : model->graph().inputs())
      if (input.value) inputNames.insert(input.value->name());
    CHECK(model->graph().initializers().size() >= 2);
    for (const Value* initializer : model->graph().initializers()) {
      CAPTURE(initializer->name());
      CHECK(inputNames.count(initializer->name()) == 1);
    }
    CHECK_NOTHROW(onnx::checker::check_model(modelToProto(*model)));
  }
  SECTION("IR 3: a fold inside an If branch puts its new tensors in the main graph") {
    // IR 3 wants every initializer among its own graph's inputs, and an If branch takes no inputs: the folded
    // weight and bias can only live in the main graph, which the branch reads.
    auto model = parseModel(header(8, 3) + R"(g (float[1,2,3,3] x, bool[1] cond, )" + kWeight +
                            R"(, float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375},
   float[2] v = {0.5, 2}) => (float[1,2,3,3] y)
{
  y = If (cond) <
    then_branch = then_g () => (float[1,2,3,3] t) {
      tc = Conv (x, w)
      t = BatchNormalization (tc, s, b, m, v)
    },
    else_branch = else_g () => (float[1,2,3,3] e) {
      e = Identity (x)
    }
  >
}
)");
    REQUIRE_NOTHROW(onnx::checker::check_model(modelToProto(*model)));
    checkOneFoldInside(*model, "then_g");
    const Node* ifNode = findNode(model->graph(), "If");
    REQUIRE(ifNode);
    const Graph& thenGraph = *ifNode->subgraphs()[0].graph;
    CHECK(opSequence(thenGraph) == "Conv");
    CHECK(thenGraph.initializers().empty());
    const Node* conv = findNode(thenGraph, "Conv");
    REQUIRE(conv);
    REQUIRE(conv->inputs().size() == 3);
    for (std::size_t slot : {1, 2}) {
      CAPTURE(slot);
      CHECK(conv->input(slot)->graph() == &model->graph());
      CHECK(conv->input(slot)->isGraphInput());
    }
    CHECK_NOTHROW(onnx::checker::check_model(modelToProto(*model)));
  }
}

TEST_CASE("bn-fold refuses: no layer right before the BN", "[bn-fold]") {
  // A non-linearity in between.
  expectSkipped(header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<)" + kWeight + ", " + kParams + R"(>
{
  c = Conv (x, w)
  r = Relu (c)
  y = BatchNormalization (r, s, b, m, v)
}
)",
                "no-foldable-producer");
  // BN straight on a graph input.
  expectSkipped(header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<)" + std::string(kParams) + R"(>
{
  y = BatchNormalization (x, s, b, m, v)
}
)",
                "no-foldable-producer");
}

TEST_CASE("bn-fold refuses: layer weights not constant", "[bn-fold]") {
  expectSkipped(header() + R"(g (float[1,2,3,3] x, float[2,2,1,1] w) => (float[1,2,3,3] y)
<)" + std::string(kParams) + R"(>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)",
                "weights-not-constant");
  // The bias is computed at run time.
  expectSkipped(header() + R"(g (float[1,2,3,3] x, float[2] bias0) => (float[1,2,3,3] y)
<)" + kWeight + ", " + kParams + R"(>
{
  bias = Abs (bias0)
  c = Conv (x, w, bias)
  y = BatchNormalization (c, s, b, m, v)
}
)",
                "weights-not-constant");
  // MatMul whose constant is the left operand: its output channels come from the run-time right operand.
  expectSkipped(header() + R"(g (float[2,2] x) => (float[2,2] y)
<float[2,2] w = {1, 2, 3, 4}, )" + kParams + R"(>
{
  c = MatMul (w, x)
  y = BatchNormalization (c, s, b, m, v)
}
)",
                "weights-not-constant");
}

TEST_CASE("bn-fold: kept nodes", "[bn-fold]") {
  const std::string text = header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<)" + kWeight + ", " + kParams + R"(>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)";
  RuleOptions options;
  SECTION("the BN itself: the driver skips it") {
    options.keepNodes = {"Batch*"};
    expectSkipped(text, "kept-by-user", options);
  }
  SECTION("the layer, by name") {
    options.keepNodes = {"Conv_0"};
    expectSkipped(text, "layer-kept-by-user", options);
  }
  SECTION("the layer, by op type") {
    options.keepOps = {"Conv"};
    expectSkipped(text, "layer-kept-by-user", options);
  }
  SECTION("a kept Constant node holding a BN parameter, which the fold would remove") {
    options.keepOps = {"Constant"};
    expectSkipped(header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<)" + kWeight + R"(, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375}, float[2] v = {0.5, 2}>
{
  s = Constant <value = float[2] {1.5, -0.5}> ()
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)",
                  "param-kept-by-user", options);
  }
}

TEST_CASE("bn-fold refuses: training-mode BatchNormalization", "[bn-fold]") {
  expectSkipped(header(15) + R"(g (float[2,2,3,3] x) => (float[2,2,3,3] y, float[2] rm, float[2] rv)
<)" + kWeight + ", " + kParams + R"(>
{
  c = Conv (x, w)
  y, rm, rv = BatchNormalization <training_mode = 1> (c, s, b, m, v)
}
)",
                "training-mode");
  // Opset 9: training is signalled by the optional outputs.
  expectSkipped(header(9) + R"(g (float[2,2,3,3] x) => (float[2,2,3,3] y, float[2] rm)
<)" + kWeight + ", " + kParams + R"(>
{
  c = Conv (x, w)
  y, rm, rv, sm, sv = BatchNormalization (c, s, b, m, v)
}
)",
                "training-mode");
  // Opset 6: is_test defaults to 0.
  expectSkipped(header(6) + R"(g (float[2,2,3,3] x) => (float[2,2,3,3] y)
<)" + kWeight + ", " + kParams + R"(>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)",
                "training-mode");
}

TEST_CASE("bn-fold refuses: optional outputs read in inference mode", "[bn-fold]") {
  expectSkipped(header(15) + R"(g (float[2,2,3,3] x) => (float[2,2,3,3] y, float[2] rm)
<)" + kWeight + ", " + kParams + R"(>
{
  c = Conv (x, w)
  y, rm = BatchNormalization <training_mode = 0> (c, s, b, m, v)
}
)",
                "optional-outputs-used");
}

TEST_CASE("bn-fold refuses: spatial=0 params that vary within a channel", "[bn-fold]") {
  expectSkipped(header(7) + R"(g (float[1,2,2,1] x) => (float[1,2,2,1] y)
<)" + kWeight + R"(, float[2,2,1] s = {1, 1, 2, 2}, float[2,2,1] b = {0, 0, 0, 0}, float[2,2,1] m = {0.5, 0.25, 0, 0}, float[2,2,1] v = {1, 1, 1, 1}>
{
  c = Conv (x, w)
  y = BatchNormalization <spatial = 0> (c, s, b, m, v)
}
)",
                "spatial-params-vary");
}

TEST_CASE("bn-fold refuses: invalid parameters", "[bn-fold]") {
  // var + epsilon <= 0 would divide by zero or take the root of a negative number.
  expectSkipped(header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<)" + kWeight + R"(, float[2] s = {1, 1}, float[2] b = {0, 0}, float[2] m = {0, 0}, float[2] v = {1, -2}>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)",
                "invalid-variance");
  expectSkipped(header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<)" + kWeight + R"(, float[2] s = {1, 1}, float[2] b = {0, 0}, float[2] m = {0, 0}, float[2] v = {0, 1}>
{
  c = Conv (x, w)
  y = BatchNormalization <epsilon = 0.0> (c, s, b, m, v)
}
)",
                "invalid-variance");
  // Param count does not match the layer's channels.
  expectSkipped(header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<)" + kWeight + R"(, float[3] s = {1, 1, 1}, float[3] b = {0, 0, 0}, float[3] m = {0, 0, 0}, float[3] v = {1, 1, 1}>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)",
                "param-shape-mismatch");

  // A non-finite mean (ONNX text cannot spell inf: set it in the proto).
  onnx::ModelProto proto = parseModelProto(header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<)" + kWeight + ", " + kParams + R"(>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)");
  for (auto& tensor : *proto.mutable_graph()->mutable_initializer())
    if (tensor.name() == "m") tensor.set_float_data(1, std::numeric_limits<float>::infinity());
  auto model = modelFromProto(std::move(proto));
  const Report report = applyRules(*model, {"bn-fold"});
  CHECK(skipReason(report, "BatchNormalization_0") == "non-finite-params");
  CHECK(countOps(*model, "BatchNormalization") == 1);
}

TEST_CASE("bn-fold refuses: MatMul whose column axis is not the BN's channel axis", "[bn-fold]") {
  // [2,3,4] x [4,3] -> [2,3,3]: BN normalizes axis 1 (size 3), MatMul's columns are axis 2.
  expectSkipped(header() + R"(g (float[2,3,4] x) => (float[2,3,3] y)
<float[4,3] w = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, float[3] s = {1, 2, 3}, float[3] b = {0, 1, 0}, float[3] m = {0, 0, 1}, float[3] v = {1, 1, 1}>
{
  c = MatMul (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)",
                "channel-axis-mismatch");
  // Nothing says the rank: refuse rather than guess.
  expectSkipped(header() + R"(g (float[] x) => (float[] y)
<float[4,3] w = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, float[3] s = {1, 2, 3}, float[3] b = {0, 1, 0}, float[3] m = {0, 0, 1}, float[3] v = {1, 1, 1}>
{
  c = MatMul (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)",
                "rank-unknown");
}

TEST_CASE("bn-fold refuses: the layer is in an enclosing graph", "[bn-fold]") {
  expectSkipped(header() + R"(g (float[1,2,3,3] x, bool cond) => (float[1,2,3,3] y)
<)" + kWeight + ", " + kParams + R"(>
{
  c = Conv (x, w)
  y = If (cond) <
    then_branch = then_g () => (float[1,2,3,3] t) { t = BatchNormalization (c, s, b, m, v) },
    else_branch = else_g () => (float[1,2,3,3] e) { e = Identity (c) }
  >
}
)",
                "layer-has-other-consumers");
  // Read only by the BN in the subgraph: still not this graph's layer.
  expectSkipped(header() + R"(g (float[1,2,3,3] x, bool cond) => (float[1,2,3,3] y)
<)" + kWeight + ", " + kParams + R"(>
{
  c = Conv (x, w)
  y = If (cond) <
    then_branch = then_g () => (float[1,2,3,3] t) { t = BatchNormalization (c, s, b, m, v) },
    else_branch = else_g () => (float[1,2,3,3] e) { e = Identity (x) }
  >
}
)",
                "layer-in-other-graph");
}

TEST_CASE("bn-fold: a shared weight is never edited, and the other reader keeps the old values", "[bn-fold]") {
  auto model = parseModel(header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y, float[1,2,3,3] z)
<)" + kWeight + R"(, float[2] bias = {0.5, -0.5}, )" + kParams + R"(>
{
  c = Conv (x, w, bias)
  y = BatchNormalization (c, s, b, m, v)
  z = Conv (x, w, bias)
}
)");
  const std::vector<double> before = initializerValues(*model, "w");
  const Report report = foldAndCompare(*model);
  CHECK(opSequence(model->graph()) == "Conv,Conv");
  const Node* folded = model->graph().findLocal("y")->producer();
  const Node* other = model->graph().findLocal("z")->producer();
  CHECK(other->input(1)->name() == "w");
  CHECK(other->input(2)->name() == "bias");
  CHECK(initializerValues(*model, "w") == before);
  CHECK(initializerValues(*model, "bias") == std::vector<double>{0.5, -0.5});
  CHECK(folded->input(1)->name() == "w_folded");
  CHECK(folded->input(2)->name() == "bias_folded");
  CHECK(report.section("folds")[0]["weight_after"] == "w_folded");
}

TEST_CASE("bn-fold: a shared weight of more than 64 bytes, whose bytes the folded copy reads, is written intact",
          "[bn-fold]") {
  // Tensor::byteSource moves such bytes into a source shared with the folded weight instead of copying them: the
  // other reader's weight is then written from that source.
  std::string weight = "float[4,5,1,1] w = {";
  for (int i = 0; i < 20; ++i) weight += (i ? ", " : "") + std::to_string(0.25 * i - 2.0);
  weight += "}";
  auto model = parseModel(header() + R"(g (float[1,5,3,3] x) => (float[1,4,3,3] y, float[1,4,3,3] z)
<)" + weight + R"(, float[4] s = {1.5, -0.5, 2, 0.25}, float[4] b = {0.25, -1, 0, 3}, float[4] m = {0.125, -0.375, 1, 0},
float[4] v = {0.5, 2, 1, 0.25}>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
  z = Conv (x, w)
}
)");
  const std::vector<double> before = initializerValues(*model, "w");
  const Report report = foldAndCompare(*model);
  REQUIRE(report.section("folds").size() == 1);
  CHECK(model->graph().findLocal("z")->producer()->input(1)->name() == "w");
  CHECK(initializerValues(*model, "w") == before);
  const auto reloaded = modelFromProto(modelToProto(*model));
  CHECK(initializerValues(*reloaded, "w") == before);
}

TEST_CASE("bn-fold: BN params shared between BNs (and another reader)", "[bn-fold]") {
  auto model = parseModel(header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y1, float[1,2,3,3] y2, float[2] z)
<)" + kWeight + R"(, float[2,2,1,1] w2 = {1, 0.5, -0.25, 2}, )" + kParams + R"(>
{
  c1 = Conv (x, w)
  y1 = BatchNormalization (c1, s, b, m, v)
  c2 = Conv (x, w2)
  y2 = BatchNormalization (c2, s, b, m, v)
  z = Neg (s)
}
)");
  const Report report = foldAndCompare(*model);
  CHECK(report.section("folds").size() == 2);
  CHECK(opSequence(model->graph()) == "Conv,Conv,Neg");
  // s is still read by Neg and unchanged; b, m, v lost their readers.
  CHECK(initializerValues(*model, "s") == std::vector<double>{1.5, -0.5});
  for (const char* name : {"b", "m", "v", "w", "w2"}) CHECK(findInitializer(*model, name) == nullptr);
}

TEST_CASE("bn-fold: two BNs in a row both fold", "[bn-fold]") {
  auto model = parseModel(header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<)" + kWeight + ", " + kParams +
                          R"(, float[2] s2 = {-2, 0.75}, float[2] b2 = {1, 0.5}, float[2] m2 = {-0.25, 0.5}, float[2] v2 = {1.5, 0.25}>
{
  c = Conv (x, w)
  t = BatchNormalization (c, s, b, m, v)
  y = BatchNormalization <epsilon = 0.01> (t, s2, b2, m2, v2)
}
)");
  const Report report = foldAndCompare(*model);
  CHECK(opSequence(model->graph()) == "Conv");
  REQUIRE(report.section("folds").size() == 2);
  CHECK(report.section("folds")[1]["weight_before"] == report.section("folds")[0]["weight_after"]);
  CHECK(report.section("folds")[1]["bias_before"] == report.section("folds")[0]["bias_after"]);
  CHECK(report.section("folds")[1]["bias_created"] == false);
  CHECK(model->graph().initializers().size() == 2);
  CHECK(model->graph().findLocal("y")->producer()->opType() == "Conv");
}

TEST_CASE("bn-fold: degenerate params fold exactly", "[bn-fold]") {
  // var = 0 (epsilon keeps it positive), gamma = 0 (the channel becomes the constant beta), large epsilon.
  auto model = parseModel(header() + R"(g (float[2,3,4,4] x) => (float[2,3,4,4] y)
<float[3,3,1,1] w = {0.5, -1, 2, 1.5, 0.25, -0.75, 1, 1, -2}, float[3] bias = {0.1, 0.2, 0.3},
 float[3] s = {1.5, 0, 2}, float[3] b = {0.25, -1, 0.5}, float[3] m = {0.5, 3, -1}, float[3] v = {0, 2, 1}>
{
  c = Conv (x, w, bias)
  y = BatchNormalization <epsilon = 0.01> (c, s, b, m, v)
}
)");
  foldAndCompare(*model);
  const Node* conv = findNode(model->graph(), "Conv");
  const auto weights = initializerValues(*model, conv->input(1)->name());
  CHECK(weights[3] == 0.0);  // channel 1 had gamma 0
  CHECK(weights[4] == 0.0);
  CHECK(weights[5] == 0.0);
  CHECK(initializerValues(*model, conv->input(2)->name())[1] == -1.0);  // ... and outputs beta exactly

  auto large = parseModel(header() + R"(g (float[2,2,3,3] x) => (float[2,2,3,3] y)
<)" + kWeight + ", " + kParams + R"(>
{
  c = Conv (x, w)
  y = BatchNormalization <epsilon = 1000.0> (c, s, b, m, v)
}
)");
  foldAndCompare(*large);
  CHECK(opSequence(large->graph()) == "Conv");
}

TEST_CASE("bn-fold: BNs inside If, Loop and Scan bodies, with params from the outer graph", "[bn-fold]") {
  // then: the Conv weight and BN params come from the outer graph; else: its own initializers.
  const std::string ifModel = header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<)" + kWeight + ", " + kParams + R"(, bool[1] cond = {COND}>
{
  y = If (cond) <
    then_branch = then_g () => (float[1,2,3,3] t) {
      tc = Conv (x, w)
      t = BatchNormalization (tc, s, b, m, v)
    },
    else_branch = else_g () => (float[1,2,3,3] e)
      <float[2,2,1,1] ew = {1, -0.5, 0.25, 2}, float[2] es = {0.5, 2}, float[2] eb = {1, 0}, float[2] em = {0, 1}, float[2] ev = {4, 0.5}> {
      ec = Conv (x, ew)
      e = BatchNormalization (ec, es, eb, em, ev)
    }
  >
}
)";
  for (const char* cond : {"1", "0"}) {
    DYNAMIC_SECTION("If with cond " << cond) {
      std::string text = ifModel;
      text.replace(text.find("COND"), 4, cond);
      auto model = parseModel(text);
      const Report report = foldAndCompare(*model);
      CHECK(report.section("folds").size() == 2);
      CHECK(countOps(*model, "BatchNormalization") == 0);
      const Node* ifNode = findNode(model->graph(), "If");
      REQUIRE(ifNode);
      Graph& thenGraph = *ifNode->subgraphs()[0].graph;
      CHECK(opSequence(thenGraph) == "Conv");
      // New tensors live in the graph that holds the layer; the outer ones lost their readers and are gone.
      const Node* thenConv = findNode(thenGraph, "Conv");
      CHECK(thenGraph.findLocal(thenConv->input(1)->name()) != nullptr);
      CHECK(thenGraph.findLocal(thenConv->input(2)->name()) != nullptr);
      for (const char* name : {"w", "s", "b", "m", "v"}) CHECK(model->graph().findLocal(name) == nullptr);
      std::set<std::string> graphs;
      for (const auto& entry : report.section("folds")) graphs.insert(entry["graph"].get<std::string>());
      CHECK(graphs == std::set<std::string>{"then_g", "else_g"});
    }
  }

  auto loop = parseModel(header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<)" + kWeight + ", " + kParams + R"(, int64 trips = {3}, bool go = {1}>
{
  y = Loop (trips, go, x) <
    body = body_g (int64 i, bool cond_in, float[1,2,3,3] acc) => (bool cond_out, float[1,2,3,3] next) {
      cond_out = Identity (cond_in)
      lc = Conv (acc, w)
      next = BatchNormalization (lc, s, b, m, v)
    }
  >
}
)");
  checkOneFoldInside(*loop, "body_g");

  // Scan hands its body one [1, 2, 3, 3] slice of xs per iteration; the body's Conv + BN read outer tensors.
  auto scan = parseModel(header() + R"(g (float[1] init, float[4,1,2,3,3] xs) => (float[1] last, float[4,1,2,3,3] ys)
<)" + kWeight + ", " + kParams + R"(>
{
  last, ys = Scan (init, xs) <
    num_scan_inputs = 1,
    body = scan_g (float[1] state_in, float[1,2,3,3] x_t) => (float[1] state_out, float[1,2,3,3] y_t) {
      state_out = Identity (state_in)
      sc = Conv (x_t, w)
      y_t = BatchNormalization (sc, s, b, m, v)
    }
  >
}
)");
  checkOneFoldInside(*scan, "scan_g");
  const Node* scanNode = findNode(scan->graph(), "Scan");
  REQUIRE(scanNode);
  CHECK(opSequence(*scanNode->subgraphs()[0].graph) == "Identity,Conv");
  for (const char* name : {"w", "s", "b", "m", "v"}) CHECK(scan->graph().findLocal(name) == nullptr);
}

TEST_CASE("bn-fold: Constant nodes as params and weights are removed once unread, and nothing else is", "[bn-fold]") {
  auto model = parseModel(header() + R"(g (float[1,2,3,3] x) => (float[1,2,3,3] y, float[2] keepme)
<float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375}, float[2] v = {0.5, 2}, float[3] unused = {1, 2, 3}>
{
  w = Constant <value = float[2,2,1,1] {0.5, -1.25, 2, 0.75}> ()
  s = Constant <value = float[2] {1.5, -0.5}> ()
  keepme = Constant <value = float[2] {7, 8}> ()
  lonely = Constant <value = float[1] {9}> ()
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)");
  foldAndCompare(*model);
  // The Constants that fed the fold are gone; a Constant that is a graph output, one that was never read and an
  // initializer that was never read all stay.
  CHECK(opSequence(model->graph()) == "Constant,Constant,Conv");
  CHECK(model->graph().findLocal("keepme") != nullptr);
  CHECK(model->graph().findLocal("lonely") != nullptr);
  CHECK(findInitializer(*model, "unused") != nullptr);
  for (const char* name : {"b", "m", "v"}) CHECK(findInitializer(*model, name) == nullptr);
}
