// bn-forward: an inference BatchNormalization whose only reader is a Conv or Gemm folds into that following
// layer: its scale into the weights' input channels, its shift into the bias (only when the Conv does no zero
// padding). Expected weights and biases are computed here by plain loops over the weights; every fold is also
// run in ONNX Runtime.

#include <catch2/catch.hpp>

#include <cmath>

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

std::vector<double> valuesOf(const Value* value) {
  REQUIRE(value);
  REQUIRE(value->constantTensor());
  return value->constantTensor()->toDoubles();
}

/// The BN as x * k + t per channel.
std::vector<double> bnShift(const BnParams& p) {
  const auto k = bnMultiplier(p);
  std::vector<double> t(k.size());
  for (std::size_t c = 0; c < t.size(); ++c) t[c] = p.beta[c] - p.mean[c] * k[c];
  return t;
}

/// Conv weight [M, C/group, k...]: (output channel, input channel) of a flat index.
struct ConvIndex {
  std::size_t kernel, perGroupIn, outputsPerGroup;
  ConvIndex(const std::vector<int64_t>& dims, int64_t group)
      : kernel(product(dims, 2)),
        perGroupIn(static_cast<std::size_t>(dims[1])),
        outputsPerGroup(static_cast<std::size_t>(dims[0] / group)) {}
  std::size_t output(std::size_t i) const { return i / (perGroupIn * kernel); }
  std::size_t input(std::size_t i) const {
    return (output(i) / outputsPerGroup) * perGroupIn + (i / kernel) % perGroupIn;
  }
};

/// Reference: Conv(x * k + t) = Conv'(x) with W' = W * k[input channel] and bias + sum W * t[input channel].
void expectedConvFold(const std::vector<double>& w, const std::vector<int64_t>& dims, int64_t group,
                      const BnParams& p, const std::vector<double>& oldBias, std::vector<double>* weights,
                      std::vector<double>* bias) {
  const ConvIndex index(dims, group);
  const auto k = bnMultiplier(p);
  const auto t = bnShift(p);
  weights->assign(w.size(), 0.0);
  *bias = oldBias.empty() ? std::vector<double>(static_cast<std::size_t>(dims[0]), 0.0) : oldBias;
  for (std::size_t i = 0; i < w.size(); ++i) {
    (*weights)[i] = w[i] * k[index.input(i)];
    (*bias)[index.output(i)] += w[i] * t[index.input(i)];
  }
}

void checkFoldsInOrt(const FoldOutcome& outcome, double limit = 1e-4) {
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  CHECK(outcome.comparison.maxAbs < limit);
}

std::string bnText(const BnParams& p, const std::string& extra = "") {
  char eps[32];
  std::snprintf(eps, sizeof eps, "%.9g", p.epsilon);
  return std::string("BatchNormalization <epsilon = ") + eps + extra + ">";
}

}  // namespace

TEST_CASE("bn-forward: BN before an unpadded Conv folds scale and shift", "[bn-forward]") {
  struct Case {
    std::string name;
    std::vector<int64_t> wDims;
    int64_t group;
    std::string convAttributes;
    bool withBias;
    std::string outputDims;
  };
  const std::vector<Case> cases = {
      {"3x3, no bias", {4, 3, 3, 3}, 1, "", false, "1,4,4,4"},
      {"grouped, strided, with bias", {4, 2, 2, 2}, 2, ", strides = [2,2]", true, "1,4,3,3"},
      {"depthwise, dilated, auto_pad VALID", {4, 1, 3, 3}, 4, ", dilations = [2,2], auto_pad = \"VALID\"", false,
       "1,4,2,2"},
      {"explicit zero pads", {4, 3, 1, 1}, 1, ", pads = [0,0,0,0]", true, "1,4,6,6"},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      const int64_t inChannels = c.wDims[1] * c.group;
      const BnParams p = makeBnParams(static_cast<std::size_t>(inChannels), 1.0);
      const std::vector<double> w = seeded(c.wDims, 2.0);
      const std::vector<double> b = seeded({c.wDims[0]}, 3.0);
      auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,)" + std::to_string(inChannels) + R"(,6,6] x) => (float[)" + c.outputDims + R"(] y)
<)" + bnInitializers(p) + ", " + tensorText("float", "w", c.wDims, w) +
                              (c.withBias ? ", " + tensorText("float", "cb", {c.wDims[0]}, b) : "") + R"(>
{
  n = )" + bnText(p) + R"( (x, s, b, m, v)
  y = Conv <group = )" + std::to_string(c.group) + c.convAttributes + "> (n, w" + (c.withBias ? ", cb" : "") +
                              R"()
}
)");
      FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-fold", "bn-forward"}, kTol, kTol);
      checkFoldsInOrt(outcome);
      const Graph& graph = model->graph();
      CHECK(opSequence(graph) == "Conv");
      const Node* conv = findNode(graph, "Conv");
      CHECK(conv->input(0)->name() == "x");
      CHECK(conv->output(0)->name() == "y");
      std::vector<double> weights, bias;
      expectedConvFold(w, c.wDims, c.group, p, c.withBias ? b : std::vector<double>{}, &weights, &bias);
      checkClose(valuesOf(conv->input(1)), weights, 1e-7);
      checkClose(valuesOf(conv->input(2)), bias, 1e-6);
      const nlohmann::json entry = foldEntry(outcome.report, "BatchNormalization_0");
      REQUIRE(entry.is_object());
      CHECK(entry["rule"] == "bn-forward");
      CHECK(entry["direction"] == "forward");
      CHECK(entry["into"] == "Conv_0");
      CHECK(entry["into_op"] == "Conv");
      CHECK(entry["bias_created"] == !c.withBias);
      CHECK(entry["weight_before"] == "w");
      CHECK(entry["weight_after"] == conv->input(1)->name());
      CHECK(entry["bias_after"] == conv->input(2)->name());
      CHECK(entry["gamma"].get<std::vector<double>>() == p.gamma);
      CHECK(entry["var"].get<std::vector<double>>() == p.var);
      CHECK(entry["epsilon"].get<double>() == p.epsilon);
      CHECK(outcome.report.section("skipped").empty());
    }
  }
}

TEST_CASE("bn-forward: with zero padding only a shift-free BN folds", "[bn-forward]") {
  const std::vector<int64_t> wDims{2, 3, 3, 3};
  const std::vector<double> w = seeded(wDims, 4.0);
  auto text = [&](const BnParams& p, const std::string& padding) {
    return R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,3,5,5] x) => (float[1,2,5,5] y)
<)" + bnInitializers(p) + ", " + tensorText("float", "w", wDims, w) + R"(>
{
  n = )" + bnText(p) + R"( (x, s, b, m, v)
  y = Conv <)" + padding + R"(> (n, w)
}
)";
  };
  for (const char* padding : {"pads = [1,1,1,1]", "auto_pad = \"SAME_UPPER\"", "auto_pad = \"SAME_LOWER\""}) {
    DYNAMIC_SECTION(padding) {
      const BnParams p = makeBnParams(3, 5.0);
      auto model = parseModel(text(p, padding));
      Report report = applyRules(*model, {"bn-fold", "bn-forward"});
      CHECK(opSequence(model->graph()) == "BatchNormalization,Conv");
      const auto& skipped = report.section("skipped");
      REQUIRE(skipped.size() == 1);
      // bn-fold speaks first (there is no layer before the BN); bn-forward's reason is in the details.
      CHECK(skipped[0]["reason"] == "no-foldable-producer");
      REQUIRE(skipped[0]["details"].size() == 2);
      CHECK(skipped[0]["details"][1]["rule"] == "bn-forward");
      CHECK(skipped[0]["details"][1]["reason"] == "layer-pads-input");
      Report alone = applyRules(*model, {"bn-forward"});
      CHECK(skipReason(alone, "BatchNormalization_0") == "layer-pads-input");
    }
  }
  SECTION("a BN with zero shift (mean 0, beta 0) folds through the padding") {
    BnParams p = makeBnParams(3, 6.0);
    p.beta.assign(3, 0.0);
    p.mean.assign(3, 0.0);
    auto model = parseModel(text(p, "pads = [1,1,1,1]"));
    FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-forward"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    const Node* conv = findNode(model->graph(), "Conv");
    CHECK(opSequence(model->graph()) == "Conv");
    CHECK(conv->inputs().size() == 2);  // no shift, no bias needed
    std::vector<double> weights, bias;
    expectedConvFold(w, wDims, 1, p, {}, &weights, &bias);
    checkClose(valuesOf(conv->input(1)), weights, 1e-7);
    CHECK(foldEntry(outcome.report, "BatchNormalization_0")["bias_created"] == false);
  }
}

TEST_CASE("bn-forward: BN1d before a Gemm folds into B and C", "[bn-forward]") {
  SECTION("transB=0 with C, alpha=0.5, beta=2: C' = beta*C + alpha * t.B") {
    const BnParams p = makeBnParams(4, 7.0);
    const std::vector<double> w = seeded({4, 3}, 8.0);
    const std::vector<double> c{0.5, -1, 2};
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[5,4] x) => (float[5,3] y)
<)" + bnInitializers(p) + ", " + tensorText("float", "w", {4, 3}, w) + ", " + tensorText("float", "c", {3}, c) +
                            R"(>
{
  n = )" + bnText(p) + R"( (x, s, b, m, v)
  y = Gemm <alpha = 0.5, beta = 2.0> (n, w, c)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-forward"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    const Node* gemm = findNode(model->graph(), "Gemm");
    CHECK(opSequence(model->graph()) == "Gemm");
    CHECK(gemm->attributeFloat("beta", 1.0f) == 1.0f);
    CHECK(gemm->attributeFloat("alpha", 1.0f) == 0.5f);
    const auto k = bnMultiplier(p);
    const auto t = bnShift(p);
    std::vector<double> weights(w.size()), bias(3);
    for (std::size_t n = 0; n < 3; ++n) {
      bias[n] = 2.0 * c[n];
      for (std::size_t row = 0; row < 4; ++row) {
        weights[row * 3 + n] = w[row * 3 + n] * k[row];
        bias[n] += 0.5 * t[row] * w[row * 3 + n];
      }
    }
    checkClose(valuesOf(gemm->input(1)), weights, 1e-7);
    checkClose(valuesOf(gemm->input(2)), bias, 1e-6);
  }
  SECTION("transB=1 without C: C is created") {
    const BnParams p = makeBnParams(4, 9.0);
    const std::vector<double> w = seeded({3, 4}, 10.0);
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[5,4] x) => (float[5,3] y)
<)" + bnInitializers(p) + ", " + tensorText("float", "w", {3, 4}, w) + R"(>
{
  n = )" + bnText(p) + R"( (x, s, b, m, v)
  y = Gemm <transB = 1> (n, w)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-forward"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    const Node* gemm = findNode(model->graph(), "Gemm");
    const auto k = bnMultiplier(p);
    const auto t = bnShift(p);
    std::vector<double> weights(w.size()), bias(3, 0.0);
    for (std::size_t n = 0; n < 3; ++n)
      for (std::size_t col = 0; col < 4; ++col) {
        weights[n * 4 + col] = w[n * 4 + col] * k[col];
        bias[n] += t[col] * w[n * 4 + col];
      }
    checkClose(valuesOf(gemm->input(1)), weights, 1e-7);
    checkClose(valuesOf(gemm->input(2)), bias, 1e-6);
    CHECK(foldEntry(outcome.report, "BatchNormalization_0")["bias_created"] == true);
  }
}

TEST_CASE("bn-forward: BN forms of opsets 9 and 6", "[bn-forward]") {
  const BnParams p = makeBnParams(3, 11.0);
  const std::vector<int64_t> wDims{2, 3, 1, 1};
  const std::vector<double> w = seeded(wDims, 12.0);
  SECTION("opset 9 (ONNX Runtime checks it)") {
    auto model = parseModel(R"(<ir_version: 7, opset_import: ["" : 9]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + bnInitializers(p) + ", " + tensorText("float", "w", wDims, w) + R"(>
{
  n = )" + bnText(p) + R"( (x, s, b, m, v)
  y = Conv (n, w)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-forward"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(opSequence(model->graph()) == "Conv");
    CHECK(foldEntry(outcome.report, "BatchNormalization_0")["bn_form"] == "opset-9");
  }
  SECTION("opset 6 with is_test=1 (structure only: ONNX Runtime has no BN kernel below opset 7)") {
    auto model = parseModel(R"(<ir_version: 3, opset_import: ["" : 6]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + bnInitializers(p) + ", " + tensorText("float", "w", wDims, w) + R"(>
{
  n = )" + bnText(p, ", is_test = 1") + R"( (x, s, b, m, v)
  y = Conv (n, w)
}
)");
    Report report = applyRules(*model, {"bn-forward"});
    CHECK(opSequence(model->graph()) == "Conv");
    CHECK(foldEntry(report, "BatchNormalization_0")["bn_form"] == "opset-6 (is_test)");
    std::vector<double> weights, bias;
    expectedConvFold(w, wDims, 1, p, {}, &weights, &bias);
    const Node* conv = findNode(model->graph(), "Conv");
    checkClose(valuesOf(conv->input(1)), weights, 1e-7);
    checkClose(valuesOf(conv->input(2)), bias, 1e-6);
  }
  SECTION("opset 6 without is_test is training mode") {
    auto training = parseModel(R"(<ir_version: 3, opset_import: ["" : 6]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + bnInitializers(p) + ", " + tensorText("float", "w", wDims, w) + R"(>
{
  n = )" + bnText(p) + R"( (x, s, b, m, v)
  y = Conv (n, w)
}
)");
    CHECK(skipReason(applyRules(*training, {"bn-forward"}), "BatchNormalization_0") == "training-mode");
  }
}

TEST_CASE("bn-forward: refusals", "[bn-forward]") {
  const BnParams p = makeBnParams(3, 13.0);
  const std::string head = R"(<ir_version: 8, opset_import: ["" : 15]>
)";
  const std::string params =
      bnInitializers(p) + ", " + tensorText("float", "w", {2, 3, 1, 1}, seeded({2, 3, 1, 1}, 14.0));
  struct Case {
    std::string name;
    std::string signature;
    std::string body;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"the BN output is read by two Convs", "g (float[1,3,4,4] x) => (float[1,2,4,4] y, float[1,2,4,4] z)",
       "n = BN (x, s, b, m, v)\n y = Conv (n, w)\n z = Conv (n, w)", "bn-has-other-consumers"},
      {"the BN output is a graph output", "g (float[1,3,4,4] x) => (float[1,2,4,4] y, float[1,3,4,4] n)",
       "n = BN (x, s, b, m, v)\n y = Conv (n, w)", "bn-has-other-consumers"},
      {"a Relu between BN and Conv", "g (float[1,3,4,4] x) => (float[1,2,4,4] y)",
       "n = BN (x, s, b, m, v)\n r = Relu (n)\n y = Conv (r, w)", "no-foldable-consumer"},
      {"training mode", "g (float[1,3,4,4] x) => (float[1,2,4,4] y)",
       "n = BatchNormalization <training_mode = 1> (x, s, b, m, v)\n y = Conv (n, w)", "training-mode"},
      {"a scale fed at run time", "g (float[1,3,4,4] x, float[3] s2) => (float[1,2,4,4] y)",
       "n = BN (x, s2, b, m, v)\n y = Conv (n, w)", "params-not-constant"},
      {"the Conv's weight fed at run time", "g (float[1,3,4,4] x, float[2,3,1,1] w2) => (float[1,2,4,4] y)",
       "n = BN (x, s, b, m, v)\n y = Conv (n, w2)", "weights-not-constant"},
      {"channel count differs from the Conv's input channels", "g (float[1,3,4,4] x) => (float[1,2,4,4] y)",
       "n = BN (x, s, b, m, v)\n y = Conv (n, w6)", "param-shape-mismatch"},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      std::string body = c.body;
      for (std::size_t at; (at = body.find("BN (")) != std::string::npos;) body.replace(at, 2, bnText(p));
      auto model = parseModel(head + c.signature + "\n<" + params + ", " +
                              tensorText("float", "w6", {2, 6, 1, 1}, seeded({2, 6, 1, 1}, 15.0)) + ">\n{\n " + body +
                              "\n}\n");
      const std::string before = opSequence(model->graph());
      Report report = applyRules(*model, {"bn-forward"});
      CHECK(skipReason(report, "BatchNormalization_0") == c.reason);
      CHECK(opSequence(model->graph()) == before);
    }
  }
  SECTION("Gemm with transA=1 reads the BN's channels as its output rows") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[3,3] x) => (float[3,2] y)
<)" + bnInitializers(p) + ", " + tensorText("float", "w", {3, 2}, seeded({3, 2}, 16.0)) + R"(>
{
  n = )" + bnText(p) + R"( (x, s, b, m, v)
  y = Gemm <transA = 1> (n, w)
}
)");
    CHECK(skipReason(applyRules(*model, {"bn-forward"}), "BatchNormalization_0") == "channel-axis-mismatch");
  }
}

TEST_CASE("bn-forward: keeps, and bn-fold wins for Conv -> BN -> Conv", "[bn-forward]") {
  const BnParams p = makeBnParams(2, 17.0);
  const std::string text = R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + bnInitializers(p) + ", " + tensorText("float", "w1", {2, 3, 1, 1}, seeded({2, 3, 1, 1}, 18.0)) + ", " +
                           tensorText("float", "w2", {2, 2, 1, 1}, seeded({2, 2, 1, 1}, 19.0)) + R"(>
{
  c1 = Conv (x, w1)
  n = )" + bnText(p) + R"( (c1, s, b, m, v)
  y = Conv (n, w2)
}
)";
  SECTION("both rules on: folded backward into the first Conv") {
    auto model = parseModel(text);
    FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-fold", "bn-forward"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(foldEntry(outcome.report, "BatchNormalization_0")["direction"] == "backward");
    CHECK(model->graph().nodeList()[1]->input(1)->name() == "w2");
  }
  SECTION("bn-forward alone: folded into the second Conv") {
    auto model = parseModel(text);
    FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-forward"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(foldEntry(outcome.report, "BatchNormalization_0")["into"] == "Conv_1");
    CHECK(model->graph().nodeList()[0]->input(1)->name() == "w1");
  }
  SECTION("the following Conv kept") {
    auto model = parseModel(text);
    RuleOptions options;
    options.keepNodes = {"Conv_1"};
    Report report = applyRules(*model, {"bn-forward"}, options);
    CHECK(skipReason(report, "BatchNormalization_0") == "layer-kept-by-user");
    CHECK(opSequence(model->graph()) == "Conv,BatchNormalization,Conv");
  }
  SECTION("the BN kept") {
    auto model = parseModel(text);
    RuleOptions options;
    options.keepOps = {"BatchNormalization"};
    Report report = applyRules(*model, {"bn-fold", "bn-forward"}, options);
    CHECK(skipReason(report, "BatchNormalization_0") == "kept-by-user");
    CHECK(opSequence(model->graph()) == "Conv,BatchNormalization,Conv");
  }
}

TEST_CASE("bn-forward: float16 Conv", "[bn-forward]") {
  const BnParams p = makeBnParams(3, 20.0);
  auto model = parseModelAs(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,3,4,4] x) => (float[1,2,3,3] y)
<)" + bnInitializers(p) + ", " + tensorText("float", "w", {2, 3, 2, 2}, seeded({2, 3, 2, 2}, 21.0)) + R"(>
{
  n = )" + bnText(p) + R"( (x, s, b, m, v)
  y = Conv (n, w)
}
)",
                            onnx::TensorProto::FLOAT16);
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-forward"}, 2e-2, 2e-2);
  checkFoldsInOrt(outcome, 5e-2);
  const Node* conv = findNode(model->graph(), "Conv");
  CHECK(opSequence(model->graph()) == "Conv");
  CHECK(conv->input(1)->constantTensor()->dataType() == DataType::Float16);
  CHECK(conv->input(2)->constantTensor()->dataType() == DataType::Float16);
}
