// scale-fold: a per-channel constant Mul after a layer (into its output channels, weights and bias) or before a
// Conv / Gemm (into its input channels). Expected weights are computed here with plain index arithmetic per
// layout; every positive case is also run in ONNX Runtime.

#include <catch2/catch.hpp>

#include "bnfold/check/fold.h"
#include "test_bn_fold_support.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;

namespace {

constexpr double kTol = 1e-5;

std::vector<double> seeded(const std::vector<int64_t>& dims, double seed) {
  return asFloats(sampleValues(product(dims, 0), seed));
}

std::string floats(const std::string& name, const std::vector<int64_t>& dims, double seed) {
  return tensorText("float", name, dims, seeded(dims, seed));
}

MatchFailure refusal(Model& model, const std::string& ruleName, const std::string& nodeName,
                     const RuleOptions& options = {}) {
  const Node* node = findNodeByName(model, nodeName);
  REQUIRE(node);
  RuleContext context(model, options);
  MatchResult result = findRule(ruleName)->match(*node, context);
  REQUIRE_FALSE(result.matched());
  return result.failure();
}

std::vector<double> inputValues(const Node* node, int slot) {
  REQUIRE(node);
  REQUIRE(node->input(static_cast<std::size_t>(slot)));
  return node->input(static_cast<std::size_t>(slot))->constantTensor()->toDoubles();
}

/// Conv weight [M, C/group, k...]: the input channel a flat index reads.
std::function<std::size_t(std::size_t)> convInputChannel(const std::vector<int64_t>& dims, int64_t group) {
  const std::size_t kernel = product(dims, 2), perGroupIn = static_cast<std::size_t>(dims[1]);
  const std::size_t outputsPerGroup = static_cast<std::size_t>(dims[0] / group);
  return [=](std::size_t i) {
    const std::size_t o = i / (perGroupIn * kernel), j = (i / kernel) % perGroupIn;
    return (o / outputsPerGroup) * perGroupIn + j;
  };
}

std::vector<double> times(const std::vector<double>& a, const std::vector<double>& b, double factor = 1.0) {
  std::vector<double> out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = a[i] * b[i] * factor;
  return out;
}

void checkFoldsInOrt(const FoldOutcome& outcome) {
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
}

}  // namespace

TEST_CASE("scale-fold: a per-channel Mul after a Conv scales its weights and bias", "[scale-fold]") {
  const std::vector<int64_t> wDims{2, 3, 3, 3};
  const std::vector<double> w = seeded(wDims, 1.0);
  const std::vector<double> k{0.5, -1.5};
  for (const char* order : {"Mul (conv, k)", "Mul (k, conv)"}) {
    DYNAMIC_SECTION(order) {
      auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,5,5] x) => (float[1,2,5,5] y)
<)" + tensorText("float", "w", wDims, w) + R"(, float[2] b = {0.25, 2}, float[1,2,1,1] k = {0.5, -1.5}>
{
  conv = Conv <pads = [1,1,1,1]> (x, w, b)
  y = )" + order + R"(
}
)");
      FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, kTol, kTol);
      checkFoldsInOrt(outcome);
      const Node* conv = findNode(model->graph(), "Conv");
      CHECK(opSequence(model->graph()) == "Conv");
      CHECK(conv->output(0)->name() == "y");
      checkClose(inputValues(conv, 1), asFloats(scaledBy(w, k, convChannel(wDims))), 0);
      CHECK(inputValues(conv, 2) == std::vector<double>{0.125, -3});
      const auto& entry = outcome.report.section("scale_folded").at(0);
      CHECK(entry["rule"] == "scale-fold");
      CHECK(entry["mul"] == "Mul_0");
      CHECK(entry["layer"] == "Conv_0");
      CHECK(entry["position"] == "after");
      CHECK(entry["weight_before"] == "w");
      CHECK(entry["weight_after"] == conv->input(1)->name());
      CHECK(entry["bias_before"] == "b");
      CHECK(entry["bias_after"] == conv->input(2)->name());
      CHECK(entry["scale"].get<std::vector<double>>() == k);
    }
  }
}

TEST_CASE("scale-fold: after a bias-less Conv a scalar Mul creates no bias", "[scale-fold]") {
  const std::vector<int64_t> wDims{2, 3, 1, 1};
  const std::vector<double> w = seeded(wDims, 2.0);
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + tensorText("float", "w", wDims, w) + R"(, float k = {-0.75}>
{
  conv = Conv (x, w)
  y = Mul (conv, k)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, kTol, kTol);
  checkFoldsInOrt(outcome);
  const Node* conv = findNode(model->graph(), "Conv");
  CHECK(conv->inputs().size() == 2);
  checkClose(inputValues(conv, 1), asFloats(scaledBy(w, {-0.75, -0.75}, convChannel(wDims))), 0);
  CHECK(outcome.report.section("scale_folded").at(0)["bias_after"].is_null());
}

TEST_CASE("scale-fold: after a grouped ConvTranspose, a Gemm and a MatMul", "[scale-fold]") {
  SECTION("ConvTranspose group=2: output channel on weight axis 1 within each group") {
    const std::vector<int64_t> wDims{4, 2, 2, 2};
    const std::vector<double> w = seeded(wDims, 3.0);
    const std::vector<double> k{1.5, -0.5, 2, 0.25};
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,4,3,3] x) => (float[1,4,4,4] y)
<)" + tensorText("float", "w", wDims, w) + R"(, float[4] b = {1, 2, 3, 4}, float[4,1,1] k = {1.5, -0.5, 2, 0.25}>
{
  conv = ConvTranspose <group = 2> (x, w, b)
  y = Mul (conv, k)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    const Node* conv = findNode(model->graph(), "ConvTranspose");
    checkClose(inputValues(conv, 1), asFloats(scaledBy(w, k, convTransposeChannel(wDims, 2))), 0);
    CHECK(inputValues(conv, 2) == times({1, 2, 3, 4}, k));
  }
  SECTION("Gemm transB=1 with C and beta=0.5: C' = beta*C*k, beta becomes 1") {
    const std::vector<int64_t> wDims{3, 4};
    const std::vector<double> w = seeded(wDims, 4.0);
    const std::vector<double> k{2, -1, 0.5};
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[2,4] x) => (float[2,3] y)
<)" + tensorText("float", "w", wDims, w) + R"(, float[1,3] c = {1, 2, 3}, float[1,3] k = {2, -1, 0.5}>
{
  gemm = Gemm <transB = 1, beta = 0.5, alpha = 1.5> (x, w, c)
  y = Mul (gemm, k)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    const Node* gemm = findNode(model->graph(), "Gemm");
    checkClose(inputValues(gemm, 1), asFloats(scaledBy(w, k, rowChannel(4))), 0);
    CHECK(inputValues(gemm, 2) == times({1, 2, 3}, k, 0.5));
    CHECK(gemm->input(2)->constantTensor()->dims() == std::vector<int64_t>{1, 3});
    CHECK(gemm->attributeFloat("beta", 1.0f) == 1.0f);
  }
  SECTION("MatMul on a 3-D input: [N] scales the weight columns") {
    const std::vector<int64_t> wDims{4, 3};
    const std::vector<double> w = seeded(wDims, 5.0);
    const std::vector<double> k{-2, 0.5, 3};
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[2,5,4] x) => (float[2,5,3] y)
<)" + tensorText("float", "w", wDims, w) + R"(, float[3] k = {-2, 0.5, 3}>
{
  mm = MatMul (x, w)
  y = Mul (mm, k)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(opSequence(model->graph()) == "MatMul");
    checkClose(inputValues(findNode(model->graph(), "MatMul"), 1), asFloats(scaledBy(w, k, columnChannel(3))), 0);
  }
}

TEST_CASE("scale-fold: Conv -> Mul -> Add (SimplifyInference's leftovers) becomes one Conv", "[scale-fold][bias-add]") {
  const std::vector<int64_t> wDims{2, 3, 3, 3};
  const std::vector<double> w = seeded(wDims, 6.0);
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,5,5] x) => (float[1,2,3,3] y)
<)" + tensorText("float", "w", wDims, w) + R"(, float[2] b = {1, -1}, float[2,1,1] k = {0.5, 4},
  float[2,1,1] a = {0.25, 0.5}>
{
  conv = Conv (x, w, b)
  m = Mul (conv, k)
  y = Add (m, a)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add", "scale-fold"}, kTol, kTol);
  checkFoldsInOrt(outcome);
  CHECK(opSequence(model->graph()) == "Conv");
  const Node* conv = findNode(model->graph(), "Conv");
  checkClose(inputValues(conv, 1), asFloats(scaledBy(w, {0.5, 4}, convChannel(wDims))), 0);
  CHECK(inputValues(conv, 2) == std::vector<double>{1 * 0.5 + 0.25, -1 * 4 + 0.5});
}

TEST_CASE("scale-fold: a per-input-channel Mul before a Conv folds into its input channels", "[scale-fold]") {
  SECTION("zero padding stays exact") {
    const std::vector<int64_t> wDims{2, 3, 3, 3};
    const std::vector<double> w = seeded(wDims, 7.0);
    const std::vector<double> k{0.5, -2, 1.25};
    for (const char* order : {"Mul (x, k)", "Mul (k, x)"}) {
      DYNAMIC_SECTION(order) {
        auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,5,5] x) => (float[1,2,5,5] y)
<)" + tensorText("float", "w", wDims, w) + R"(, float[2] b = {0.5, 1}, float[3,1,1] k = {0.5, -2, 1.25}>
{
  m = )" + order + R"(
  y = Conv <pads = [1,1,1,1]> (m, w, b)
}
)");
        FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, kTol, kTol);
        checkFoldsInOrt(outcome);
        CHECK(opSequence(model->graph()) == "Conv");
        const Node* conv = findNode(model->graph(), "Conv");
        CHECK(conv->input(0)->name() == "x");
        checkClose(inputValues(conv, 1), asFloats(scaledBy(w, k, convInputChannel(wDims, 1))), 0);
        CHECK(conv->input(2)->name() == "b");  // the bias does not see an input scale
        const auto& entry = outcome.report.section("scale_folded").at(0);
        CHECK(entry["position"] == "before");
        CHECK(entry["layer"] == "Conv_0");
      }
    }
  }
  SECTION("group=2: input channel c belongs to group c / 2") {
    const std::vector<int64_t> wDims{4, 2, 3, 3};
    const std::vector<double> w = seeded(wDims, 8.0);
    const std::vector<double> k{0.5, -2, 1.25, 3};
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,4,5,5] x) => (float[1,4,3,3] y)
<)" + tensorText("float", "w", wDims, w) + R"(, float[1,4,1,1] k = {0.5, -2, 1.25, 3}>
{
  m = Mul (x, k)
  y = Conv <group = 2> (m, w)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    checkClose(inputValues(findNode(model->graph(), "Conv"), 1), asFloats(scaledBy(w, k, convInputChannel(wDims, 2))),
               0);
  }
  SECTION("depthwise (group = channels) after an inferred Conv -> Relu shape") {
    // x2's channel count is known only by following Conv -> Relu back to the first weight.
    const std::vector<int64_t> wDims{3, 1, 3, 3};
    const std::vector<double> w = seeded(wDims, 9.0);
    const std::vector<double> k{-1, 0.5, 2};
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,2,6,6] x) => (float[1,3,6,6] y)
<)" + floats("w0", {3, 2, 1, 1}, 10.0) + ", " + tensorText("float", "w", wDims, w) +
                            R"(, float[3,1,1] k = {-1, 0.5, 2}>
{
  c0 = Conv (x, w0)
  x2 = Relu (c0)
  m = Mul (x2, k)
  y = Conv <group = 3, pads = [1,1,1,1]> (m, w)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(opSequence(model->graph()) == "Conv,Relu,Conv");
    checkClose(inputValues(model->graph().findLocal("y")->producer(), 1),
               asFloats(scaledBy(w, k, convInputChannel(wDims, 3))), 0);
  }
}

TEST_CASE("scale-fold: a Mul before a ConvTranspose scales the rows of its weight", "[scale-fold]") {
  // ConvTranspose W [C_in, C_out/group, k, k]: input channel c is row c (here with group 2).
  const std::vector<int64_t> wDims{4, 3, 2, 2};
  const std::vector<double> w = seeded(wDims, 32.0);
  const std::vector<double> k{0.5, -1, 2, 1.5};
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,4,3,3] x) => (float[1,6,5,5] y)
<)" + tensorText("float", "w", wDims, w) + R"(, float[1,4,1,1] k = {0.5, -1, 2, 1.5}>
{
  m = Mul (x, k)
  y = ConvTranspose <group = 2, strides = [2,2], pads = [1,1,0,0]> (m, w)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, kTol, kTol);
  checkFoldsInOrt(outcome);
  CHECK(opSequence(model->graph()) == "ConvTranspose");
  checkClose(inputValues(findNode(model->graph(), "ConvTranspose"), 1), asFloats(scaledBy(w, k, convChannel(wDims))),
             0);
}

TEST_CASE("scale-fold: the input's channel count is followed back through pooling", "[scale-fold]") {
  // Conv -> MaxPool -> Mul [C,1,1] -> Conv: nothing declares the pooled shape; the first weight gives C.
  const std::vector<int64_t> wDims{2, 4, 1, 1};
  const std::vector<double> w = seeded(wDims, 30.0);
  const std::vector<double> k{2, -1, 0.5, 3};
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,6,6] x) => (float[1,2,3,3] y)
<)" + floats("w0", {4, 3, 1, 1}, 31.0) + ", " + tensorText("float", "w", wDims, w) +
                          R"(, float[4,1,1] k = {2, -1, 0.5, 3}>
{
  c0 = Conv (x, w0)
  p = MaxPool <kernel_shape = [2,2], strides = [2,2]> (c0)
  m = Mul (p, k)
  y = Conv (m, w)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, kTol, kTol);
  checkFoldsInOrt(outcome);
  CHECK(opSequence(model->graph()) == "Conv,MaxPool,Conv");
  checkClose(inputValues(model->graph().findLocal("y")->producer(), 1),
             asFloats(scaledBy(w, k, convInputChannel(wDims, 1))), 0);
}

TEST_CASE("scale-fold: a Mul before a Gemm scales the K axis of its weight", "[scale-fold]") {
  SECTION("transA=0, transB=0: [K] on A [M,K] scales the rows of B [K,N]") {
    const std::vector<int64_t> wDims{4, 3};
    const std::vector<double> w = seeded(wDims, 11.0);
    const std::vector<double> k{1, -2, 0.5, 4};
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[2,4] x) => (float[2,3] y)
<)" + tensorText("float", "w", wDims, w) + R"(, float[3] c = {1, 2, 3}, float[4] k = {1, -2, 0.5, 4}>
{
  m = Mul (x, k)
  y = Gemm (m, w, c)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(opSequence(model->graph()) == "Gemm");
    checkClose(inputValues(findNode(model->graph(), "Gemm"), 1), asFloats(scaledBy(w, k, rowChannel(3))), 0);
  }
  SECTION("transA=1, transB=1: [K,1] on A [K,M] scales the columns of B [N,K]") {
    const std::vector<int64_t> wDims{3, 4};
    const std::vector<double> w = seeded(wDims, 12.0);
    const std::vector<double> k{1, -2, 0.5, 4};
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[4,2] x) => (float[2,3] y)
<)" + tensorText("float", "w", wDims, w) + R"(, float[4,1] k = {1, -2, 0.5, 4}>
{
  m = Mul (x, k)
  y = Gemm <transA = 1, transB = 1> (m, w)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    checkClose(inputValues(findNode(model->graph(), "Gemm"), 1), asFloats(scaledBy(w, k, columnChannel(4))), 0);
  }
}

TEST_CASE("scale-fold: a Mul between two Convs goes into the first one's output channels", "[scale-fold]") {
  const std::vector<int64_t> wDims{2, 3, 1, 1};
  const std::vector<double> w1 = seeded(wDims, 13.0);
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + tensorText("float", "w1", wDims, w1) + ", " + floats("w2", {2, 2, 1, 1}, 14.0) +
                          R"(, float[1,2,1,1] k = {3, -0.5}>
{
  c1 = Conv (x, w1)
  m = Mul (c1, k)
  y = Conv (m, w2)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, kTol, kTol);
  checkFoldsInOrt(outcome);
  const Node* first = model->graph().nodeList()[0];
  const Node* second = model->graph().nodeList()[1];
  checkClose(inputValues(first, 1), asFloats(scaledBy(w1, {3, -0.5}, convChannel(wDims))), 0);
  CHECK(second->input(1)->name() == "w2");
  CHECK(outcome.report.section("scale_folded").at(0)["position"] == "after");
}

TEST_CASE("scale-fold: refusals", "[scale-fold]") {
  SECTION("a [C] constant after a 4-D Conv output runs along W") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,5,5] x) => (float[1,3,3,3] y)
<)" + floats("w", {3, 3, 3, 3}, 15.0) + R"(, float[3] k = {1, 2, 3}>
{
  conv = Conv (x, w)
  y = Mul (conv, k)
}
)");
    const MatchFailure why = refusal(*model, "scale-fold", "Mul_0");
    CHECK(why.code == reason::kNotPerChannel);
    CHECK_THAT(why.message, Catch::Contains("axis 3"));
    FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(opSequence(model->graph()) == "Conv,Mul");
  }
  SECTION("a [C] constant before a Conv runs along W") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,3,3] x) => (float[1,2,1,1] y)
<)" + floats("w", {2, 3, 3, 3}, 16.0) + R"(, float[3] k = {1, 2, 3}>
{
  m = Mul (x, k)
  y = Conv (m, w)
}
)");
    CHECK(refusal(*model, "scale-fold", "Mul_0").code == reason::kNotPerChannel);
  }
  SECTION("a Mul that spreads a 1-channel input over 3 channels before the Conv") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,1,4,4] x) => (float[1,2,4,4] y)
<)" + floats("w", {2, 3, 1, 1}, 17.0) + R"(, float[1,3,1,1] k = {1, 2, 3}>
{
  m = Mul (x, k)
  y = Conv (m, w)
}
)");
    const MatchFailure why = refusal(*model, "scale-fold", "Mul_0");
    CHECK(why.code == reason::kMulMayBroadcastInput);
    FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(opSequence(model->graph()) == "Mul,Conv");
  }
  SECTION("an input whose channel count is not known, unless the scale is a scalar") {
    auto perChannel = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[N,C,4,4] x) => (float[N,2,4,4] y)
<)" + floats("w", {2, 3, 1, 1}, 18.0) + R"(, float[1,3,1,1] k = {1, 2, 3}>
{
  m = Mul (x, k)
  y = Conv (m, w)
}
)");
    CHECK(refusal(*perChannel, "scale-fold", "Mul_0").code == reason::kMulMayBroadcastInput);
    // A scalar cannot spread anything, so it folds without knowing C.
    auto scalarUnknownC = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[N,C,4,4] x) => (float[N,2,4,4] y)
<)" + floats("w", {2, 3, 1, 1}, 18.0) + R"(, float k = {2.5}>
{
  m = Mul (x, k)
  y = Conv (m, w)
}
)");
    applyRules(*scalarUnknownC, {"scale-fold"});
    CHECK(opSequence(scalarUnknownC->graph()) == "Conv");
    // The same with C = 3 spelled out, so ONNX Runtime can run it (it takes symbolic dims as 1).
    auto scalar = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[N,3,4,4] x) => (float[N,2,4,4] y)
<)" + floats("w", {2, 3, 1, 1}, 18.0) + R"(, float k = {2.5}>
{
  m = Mul (x, k)
  y = Conv (m, w)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*scalar, {"scale-fold"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(opSequence(scalar->graph()) == "Conv");
  }
  SECTION("the Mul output is read by two layers") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y, float[1,2,4,4] z)
<)" + floats("w", {2, 3, 1, 1}, 19.0) + R"(, float[1,3,1,1] k = {1, 2, 3}>
{
  m = Mul (x, k)
  y = Conv (m, w)
  z = Conv (m, w)
}
)");
    CHECK(refusal(*model, "scale-fold", "Mul_0").code == reason::kNoFoldableLayer);
  }
  SECTION("the Conv output is also read elsewhere") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y, float[1,2,4,4] r)
<)" + floats("w", {2, 3, 1, 1}, 20.0) + R"(, float[1,2,1,1] k = {1, 2}>
{
  conv = Conv (x, w)
  y = Mul (conv, k)
  r = Sigmoid (conv)
}
)");
    CHECK(refusal(*model, "scale-fold", "Mul_0").code == reason::kLayerHasOtherConsumers);
  }
  SECTION("a weight fed at run time") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x, float[2,3,1,1] w) => (float[1,2,4,4] y)
<float[1,2,1,1] k = {1, 2}>
{
  conv = Conv (x, w)
  y = Mul (conv, k)
}
)");
    CHECK(refusal(*model, "scale-fold", "Mul_0").code == reason::kParamsNotConstant);
  }
  SECTION("a kept layer") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + floats("w", {2, 3, 1, 1}, 21.0) + R"(, float[1,2,1,1] k = {1, 2}>
{
  conv = Conv (x, w)
  y = Mul (conv, k)
}
)");
    RuleOptions options;
    options.keepNodes = {"Conv_0"};
    CHECK(refusal(*model, "scale-fold", "Mul_0", options).code == reason::kKeptByUser);
    applyRules(*model, {"scale-fold"}, options);
    CHECK(opSequence(model->graph()) == "Conv,Mul");
  }
}

TEST_CASE("scale-fold: float16 weights are scaled in double and rounded once", "[scale-fold]") {
  auto model = parseModelAs(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + floats("w", {2, 3, 3, 3}, 22.0) + R"(, float[2] b = {0.5, 1}, float[1,2,1,1] k = {0.3, -3}>
{
  conv = Conv <pads = [1,1,1,1]> (x, w, b)
  y = Mul (conv, k)
}
)",
                            onnx::TensorProto::FLOAT16);
  const std::vector<double> w = inputValues(findNode(model->graph(), "Conv"), 1);
  const std::vector<double> k = model->graph().findLocal("k")->initializer()->toDoubles();
  FoldOutcome outcome = applyRulesAndCompare(*model, {"scale-fold"}, 1e-2, 1e-2);
  checkFoldsInOrt(outcome);
  const Node* conv = findNode(model->graph(), "Conv");
  CHECK(conv->input(1)->constantTensor()->dataType() == DataType::Float16);
  // Within half a float16 ulp of the exact product (the reference's own rounding goes through float).
  checkClose(inputValues(conv, 1), scaledBy(w, k, convChannel({2, 3, 3, 3})), 4.9e-4);
}
