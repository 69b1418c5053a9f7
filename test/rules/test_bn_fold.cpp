// bn-fold, positive cases: every layer and weight layout (Conv 1-D/2-D/3-D, grouped, depthwise; ConvTranspose
// grouped; Gemm transB/alpha/beta/C shapes; MatMul), every BatchNormalization form (opsets 1, 6, 7, 9, 14, 15,
// spatial=0) and weight type (float, double, float16, bfloat16). Each case checks the rewritten structure, the new
// tensors against a reference computed here, and — where ONNX Runtime has kernels — the numbers end to end.
#include <catch2/catch.hpp>

#include "test_bn_fold_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;

namespace {

constexpr double kAtol = 1e-6, kRtol = 1e-5;          // float32 end to end
constexpr double kAtol16 = 1e-2, kRtol16 = 1e-2;      // float16 end to end
constexpr double kWeightTolerance = 1e-6;             // float32 tensors vs the double reference (a few ulp)

std::string dimsText(const std::vector<int64_t>& dims) {
  std::string text;
  for (std::size_t i = 0; i < dims.size(); ++i) text += (i ? "," : "") + std::to_string(dims[i]);
  return text;
}

/// A Conv or ConvTranspose followed by BatchNormalization, with its values kept for the reference.
struct ConvCase {
  std::string op = "Conv";
  int64_t batch = 2, inChannels = 3, outChannels = 4, group = 1;
  std::vector<int64_t> spatial{5, 5}, kernel{3, 3};
  bool bias = false;
  int opset = 15;
  double seed = 1.0;

  std::vector<int64_t> weightDims() const {
    std::vector<int64_t> dims = op == "Conv" ? std::vector<int64_t>{outChannels, inChannels / group}
                                             : std::vector<int64_t>{inChannels, outChannels / group};
    dims.insert(dims.end(), kernel.begin(), kernel.end());
    return dims;
  }
  std::vector<double> weights() const { return asFloats(sampleValues(product(weightDims(), 0), seed + 0.5)); }
  std::vector<double> biasValues() const {
    return asFloats(sampleValues(static_cast<std::size_t>(outChannels), seed + 0.6));
  }
  BnParams bn() const { return makeBnParams(static_cast<std::size_t>(outChannels), seed); }
  std::function<std::size_t(std::size_t)> channelOf() const {
    return op == "Conv" ? convChannel(weightDims()) : convTransposeChannel(weightDims(), group);
  }

  std::string text() const {
    std::vector<int64_t> inputDims{batch, inChannels};
    inputDims.insert(inputDims.end(), spatial.begin(), spatial.end());
    std::string outputDims = "N," + std::to_string(outChannels);
    for (std::size_t i = 0; i < spatial.size(); ++i) outputDims += ",d" + std::to_string(i);
    std::string pads;
    for (int side = 0; side < 2; ++side)
      for (int64_t k : kernel) pads += (pads.empty() ? "" : ",") + std::to_string(op == "Conv" ? k / 2 : 0);
    std::string initializers = tensorText("float", "w", weightDims(), weights());
    if (bias) initializers += ", " + tensorText("float", "bias", {outChannels}, biasValues());
    initializers += ", " + bnInitializers(bn());
    const std::string attributes = "<group = " + std::to_string(group) + ", pads = [" + pads + "]>";
    const std::string bnAttributes = opset < 7 ? "<epsilon = 0.001, is_test = 1>" : "<epsilon = 0.001>";
    return "<ir_version: 8, opset_import: [\"\" : " + std::to_string(opset) + "]>\n" + "g (float[" +
           dimsText(inputDims) + "] x) => (float[" + outputDims + "] y)\n<" + initializers + ">\n{\n" +
           "  c = " + op + " " + attributes + " (x, w" + (bias ? ", bias" : "") + ")\n" +
           "  y = BatchNormalization " + bnAttributes + " (c, s, b, m, v)\n}\n";
  }
};

/// Checks the structure, the report entry and the new tensors of a folded ConvCase.
void checkConvFold(Model& model, const Report& report, const ConvCase& spec) {
  CHECK(opSequence(model.graph()) == spec.op);
  CHECK(countOps(model, "BatchNormalization") == 0);
  const Node* layer = findNode(model.graph(), spec.op);
  REQUIRE(layer);
  REQUIRE(layer->output(0)->name() == "y");
  CHECK(layer->output(0)->isGraphOutput());
  REQUIRE(report.section("folds").size() == 1);
  const auto entry = report.section("folds")[0];
  CHECK(entry["rule"] == "bn-fold");
  CHECK(entry["into_op"] == spec.op);
  CHECK(entry["into"] == layer->name());
  CHECK(entry["bias_created"] == !spec.bias);
  CHECK(entry["weight_before"] == "w");
  CHECK(entry["weight_after"] == layer->input(1)->name());
  CHECK(layer->input(1)->name() != "w");
  REQUIRE(layer->input(2));
  CHECK(entry["bias_after"] == layer->input(2)->name());
  if (spec.bias) CHECK(entry["bias_before"] == "bias");
  else CHECK(entry["bias_before"].is_null());

  const BnParams bn = spec.bn();
  checkClose(initializerValues(model, layer->input(1)->name()), scaledBy(spec.weights(), bnMultiplier(bn), spec.channelOf()),
             kWeightTolerance);
  checkClose(initializerValues(model, layer->input(2)->name()),
             expectedBias(bn, spec.bias ? spec.biasValues() : std::vector<double>{}), kWeightTolerance);
  // The old weight and the BN's parameters lost their only reader and are gone.
  CHECK(findInitializer(model, "w") == nullptr);
  for (const char* name : {"s", "b", "m", "v", "bias"}) CHECK(findInitializer(model, name) == nullptr);
  CHECK(model.graph().initializers().size() == 2);
}

void foldConvCase(const ConvCase& spec) {
  auto model = parseModel(spec.text());
  auto outcome = applyRulesAndCompare(*model, {"bn-fold"}, kAtol, kRtol);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  INFO("max abs " << outcome.comparison.maxAbs << ", max rel " << outcome.comparison.maxRel);
  checkConvFold(*model, outcome.report, spec);
}

}  // namespace

TEST_CASE("bn-fold: Conv 2-D without bias creates the bias", "[bn-fold]") {
  foldConvCase(ConvCase{});
}

TEST_CASE("bn-fold: Conv 2-D with bias rewrites it", "[bn-fold]") {
  ConvCase spec;
  spec.bias = true;
  spec.seed = 2;
  foldConvCase(spec);
}

TEST_CASE("bn-fold: Conv 1-D and 3-D, with and without bias", "[bn-fold]") {
  ConvCase oneD;
  oneD.spatial = {7};
  oneD.kernel = {3};
  oneD.bias = true;
  oneD.seed = 3;
  foldConvCase(oneD);

  ConvCase threeD;
  threeD.spatial = {4, 3, 5};
  threeD.kernel = {3, 1, 3};
  threeD.seed = 4;
  foldConvCase(threeD);

  threeD.bias = true;
  threeD.seed = 5;
  foldConvCase(threeD);
}

TEST_CASE("bn-fold: grouped and depthwise Conv scale axis 0", "[bn-fold]") {
  ConvCase grouped;
  grouped.inChannels = 4;
  grouped.outChannels = 6;
  grouped.group = 2;
  grouped.bias = true;
  grouped.seed = 6;
  foldConvCase(grouped);

  ConvCase depthwise;  // group = channels
  depthwise.inChannels = 4;
  depthwise.outChannels = 4;
  depthwise.group = 4;
  depthwise.seed = 7;
  foldConvCase(depthwise);

  ConvCase multiplier;  // depthwise with channel multiplier 2
  multiplier.inChannels = 3;
  multiplier.outChannels = 6;
  multiplier.group = 3;
  multiplier.bias = true;
  multiplier.seed = 8;
  foldConvCase(multiplier);
}

TEST_CASE("bn-fold: ConvTranspose scales axis 1 within each group", "[bn-fold]") {
  ConvCase plain;
  plain.op = "ConvTranspose";
  plain.bias = true;
  plain.seed = 9;
  foldConvCase(plain);

  ConvCase grouped;  // W [4, 3, 2, 2], group 2: output channels 0-2 from rows 0-1, 3-5 from rows 2-3
  grouped.op = "ConvTranspose";
  grouped.inChannels = 4;
  grouped.outChannels = 6;
  grouped.group = 2;
  grouped.kernel = {2, 2};
  grouped.seed = 10;
  foldConvCase(grouped);

  grouped.bias = true;
  grouped.group = 3;  // W [6, 2, 2, 2] needs C_in divisible by 3
  grouped.inChannels = 6;
  grouped.seed = 11;
  foldConvCase(grouped);

  ConvCase oneD;
  oneD.op = "ConvTranspose";
  oneD.spatial = {6};
  oneD.kernel = {3};
  oneD.seed = 12;
  foldConvCase(oneD);
}

namespace {

/// Gemm (or MatMul) on [M, K] input with N outputs followed by BatchNormalization (BatchNorm1d).
struct GemmCase {
  int64_t m = 3, k = 5, n = 4;
  bool transA = false, transB = false;
  double alpha = 1.0, beta = 1.0;
  std::vector<int64_t> cDims;  // empty with hasC: scalar
  bool hasC = false;
  int opset = 15;
  double seed = 20;

  std::vector<int64_t> weightDims() const { return transB ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}; }
  std::vector<double> weights() const { return asFloats(sampleValues(static_cast<std::size_t>(k * n), seed + 0.5)); }
  std::vector<double> cValues() const { return asFloats(sampleValues(product(cDims, 0), seed + 0.6)); }
  BnParams bn() const { return makeBnParams(static_cast<std::size_t>(n), seed); }

  std::string text() const {
    std::string initializers = tensorText("float", "w", weightDims(), weights());
    if (hasC) initializers += ", " + tensorText("float", "cb", cDims, cValues());
    initializers += ", " + bnInitializers(bn());
    // %.1f keeps a decimal point: ONNX text reads "1" as an INT attribute, and Gemm wants FLOAT.
    char attributes[160];
    std::snprintf(attributes, sizeof attributes, "<alpha = %.6f, beta = %.6f, transA = %d, transB = %d>", alpha,
                  beta, transA ? 1 : 0, transB ? 1 : 0);
    const std::string inputDims = transA ? std::to_string(k) + "," + std::to_string(m)
                                         : std::to_string(m) + "," + std::to_string(k);
    return "<ir_version: 8, opset_import: [\"\" : " + std::to_string(opset) + "]>\n" + "g (float[" +
           inputDims + "] x) => (float[" + std::to_string(m) + "," +
           std::to_string(n) + "] y)\n<" + initializers + ">\n{\n  c = Gemm " + attributes + " (x, w" +
           (hasC ? ", cb" : "") + ")\n  y = BatchNormalization <epsilon = 0.001> (c, s, b, m, v)\n}\n";
  }

  /// Reference C': beta * C * k + (beta_bn - mean * k), broadcast to the folded shape.
  std::vector<double> expectedC(std::vector<int64_t>* dims) const {
    const BnParams p = bn();
    const auto mult = bnMultiplier(p);
    const auto c = hasC ? cValues() : std::vector<double>{};
    const bool perRow = cDims.size() == 2 && cDims[0] != 1;
    const int64_t rows = perRow ? m : 1;
    const int64_t cColumns = cDims.empty() ? 1 : cDims.back();
    *dims = perRow ? std::vector<int64_t>{m, n} : (cDims.size() == 2 ? std::vector<int64_t>{1, n}
                                                                      : std::vector<int64_t>{n});
    std::vector<double> out;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) {
        const double old = hasC ? c[static_cast<std::size_t>(r * cColumns + (cColumns == 1 ? 0 : j))] : 0.0;
        out.push_back(beta * old * mult[j] + p.beta[j] - p.mean[j] * mult[j]);
      }
    return out;
  }
};

void foldGemmCase(const GemmCase& spec) {
  auto model = parseModel(spec.text());
  auto outcome = applyRulesAndCompare(*model, {"bn-fold"}, kAtol, kRtol);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  CHECK(opSequence(model->graph()) == "Gemm");
  const Node* gemm = findNode(model->graph(), "Gemm");
  REQUIRE(gemm);
  CHECK(gemm->output(0)->name() == "y");
  // alpha stays; beta is now 1 (folded into C').
  CHECK(gemm->attributeFloat("alpha", 1.0f) == Approx(spec.alpha));
  CHECK(gemm->attributeFloat("beta", 1.0f) == 1.0f);
  CHECK(gemm->attributeInt("transB", 0) == (spec.transB ? 1 : 0));
  const auto entry = foldEntry(outcome.report, "BatchNormalization_0");
  REQUIRE(entry.is_object());
  CHECK(entry["into_op"] == "Gemm");
  CHECK(entry["bias_created"] == !spec.hasC);

  const auto mult = bnMultiplier(spec.bn());
  checkClose(initializerValues(*model, gemm->input(1)->name()),
             scaledBy(spec.weights(), mult, spec.transB ? rowChannel(spec.k) : columnChannel(spec.n)),
             kWeightTolerance);
  REQUIRE(gemm->input(2));
  std::vector<int64_t> cDims;
  const auto expected = spec.expectedC(&cDims);
  CHECK(findInitializer(*model, gemm->input(2)->name())->dims() == cDims);
  checkClose(initializerValues(*model, gemm->input(2)->name()), expected, kWeightTolerance);
}

}  // namespace

TEST_CASE("bn-fold: Gemm transB 0 and 1 without C", "[bn-fold]") {
  GemmCase spec;
  foldGemmCase(spec);
  spec.transB = true;
  spec.seed = 21;
  foldGemmCase(spec);
}

TEST_CASE("bn-fold: Gemm with transA (the output columns still come from B)", "[bn-fold]") {
  GemmCase spec;
  spec.transA = true;
  spec.transB = true;
  spec.hasC = true;
  spec.cDims = {4};
  spec.seed = 25;
  foldGemmCase(spec);
}

TEST_CASE("bn-fold: before opset 7 a new or rewritten Gemm C comes with broadcast=1", "[bn-fold]") {
  // Gemm-6 broadcasts C only when told to. ONNX Runtime has no BatchNormalization-6: structure and values only.
  GemmCase spec;
  spec.opset = 6;
  spec.hasC = true;
  spec.cDims = {4};
  spec.seed = 26;
  std::string text = spec.text();
  text.replace(text.find("transB = 0>"), 11, "transB = 0, broadcast = 1>");
  text.replace(text.find("<epsilon = 0.001>"), 17, "<epsilon = 0.001, is_test = 1>");
  auto model = parseModel(text);
  applyRules(*model, {"bn-fold"});
  const Node* gemm = findNode(model->graph(), "Gemm");
  REQUIRE(gemm);
  CHECK(opSequence(model->graph()) == "Gemm");
  CHECK(gemm->attributeInt("broadcast", 0) == 1);
  std::vector<int64_t> cDims;
  checkClose(initializerValues(*model, gemm->input(2)->name()), spec.expectedC(&cDims), kWeightTolerance);

  auto matmul = parseModel(R"(<ir_version: 3, opset_import: ["" : 6]>
g (float[2,2] x, float[2,2] w = {1, 2, 3, 4}, float[2] s = {2, -0.5}, float[2] b = {1, 0}, float[2] m = {0.5, 0}, float[2] v = {3, 0.25}) => (float[2,2] y)
{
  h = MatMul (x, w)
  y = BatchNormalization <is_test = 1> (h, s, b, m, v)
}
)");
  applyRules(*matmul, {"bn-fold"});
  CHECK(opSequence(matmul->graph()) == "Gemm");
  CHECK(findNode(matmul->graph(), "Gemm")->attributeInt("broadcast", 0) == 1);
}

TEST_CASE("bn-fold: Gemm with alpha and beta other than 1 and C of every per-channel shape", "[bn-fold]") {
  for (const auto& cDims : std::vector<std::vector<int64_t>>{{}, {1}, {4}, {1, 4}, {1, 1}}) {
    for (const bool transB : {false, true}) {
      GemmCase spec;
      spec.hasC = true;
      spec.cDims = cDims;
      spec.transB = transB;
      spec.alpha = 0.75;
      spec.beta = -1.5;
      spec.seed = 22 + static_cast<double>(cDims.size()) + (transB ? 0.5 : 0.0);
      DYNAMIC_SECTION("C dims [" << dimsText(cDims) << "] transB " << transB) { foldGemmCase(spec); }
    }
  }
}

TEST_CASE("bn-fold: Gemm with a per-row C ([M, N], [M, 1]) folds exactly into an [M, N] C", "[bn-fold]") {
  // C that varies per row still adds before the BN, so C' = beta*C*k + shift is exact; it is just [M, N].
  for (const auto& cDims : std::vector<std::vector<int64_t>>{{3, 4}, {3, 1}}) {
    GemmCase spec;
    spec.hasC = true;
    spec.cDims = cDims;
    spec.beta = 0.5;
    spec.seed = 30 + static_cast<double>(cDims[1]);
    DYNAMIC_SECTION("C dims [" << dimsText(cDims) << "]") { foldGemmCase(spec); }
  }
}

TEST_CASE("bn-fold: Gemm with beta 0 ignores C", "[bn-fold]") {
  GemmCase spec;
  spec.hasC = true;
  spec.cDims = {4};
  spec.beta = 0.0;
  spec.seed = 33;
  auto model = parseModel(spec.text());
  auto outcome = applyRulesAndCompare(*model, {"bn-fold"}, kAtol, kRtol);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  const Node* gemm = findNode(model->graph(), "Gemm");
  REQUIRE(gemm);
  CHECK(gemm->attributeFloat("beta", 1.0f) == 1.0f);
  checkClose(initializerValues(*model, gemm->input(2)->name()), expectedBias(spec.bn()), kWeightTolerance);
}

TEST_CASE("bn-fold: 2-D MatMul with a constant weight becomes a Gemm with the bias", "[bn-fold]") {
  const auto weights = asFloats(sampleValues(15, 40.5));
  const BnParams bn = makeBnParams(3, 40);
  // x's shape is declared, so the MatMul output is known to be 2-D (BN's axis 1 is MatMul's column axis).
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[4,5] x) => (float[4,3] r)
<)" + tensorText("float", "w", {5, 3}, weights) + ", " + bnInitializers(bn) + R"(>
{
  h = MatMul (x, w)
  y = BatchNormalization <epsilon = 0.001> (h, s, b, m, v)
  r = Relu (y)
}
)");
  auto outcome = applyRulesAndCompare(*model, {"bn-fold"}, kAtol, kRtol);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  CHECK(opSequence(model->graph()) == "Gemm,Relu");
  const Node* gemm = findNode(model->graph(), "Gemm");
  CHECK(gemm->output(0)->name() == "y");
  CHECK(gemm->input(0)->name() == "x");
  CHECK(gemm->attributeFloat("alpha", 1.0f) == 1.0f);
  CHECK(gemm->attributeInt("transB", 0) == 0);
  checkClose(initializerValues(*model, gemm->input(1)->name()), scaledBy(weights, bnMultiplier(bn), columnChannel(3)),
             kWeightTolerance);
  checkClose(initializerValues(*model, gemm->input(2)->name()), expectedBias(bn), kWeightTolerance);
  CHECK(findInitializer(*model, gemm->input(2)->name())->dims() == std::vector<int64_t>{3});
  const auto entry = foldEntry(outcome.report, "BatchNormalization_0");
  CHECK(entry["into"] == gemm->name());
  CHECK(entry["into_op"] == "Gemm");
  CHECK(entry["replaced_node"] == "MatMul_0");
  CHECK(entry["replaced_op"] == "MatMul");
  CHECK(entry["bias_created"] == true);
  CHECK(entry["bias_before"].is_null());
  CHECK(countOps(*model, "MatMul") == 0);
}

TEST_CASE("bn-fold: MatMul whose BN shift is zero keeps the MatMul and needs no bias", "[bn-fold]") {
  // beta = mean * k exactly when beta = 0 and mean = 0.
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[2,2] x) => (float[2,2] y)
<float[2,2] w = {1, 2, 3, 4}, float[2] s = {2, -0.5}, float[2] b = {0, 0}, float[2] m = {0, 0}, float[2] v = {3, 0.25}>
{
  h = MatMul (x, w)
  y = BatchNormalization <epsilon = 1.0> (h, s, b, m, v)
}
)");
  auto outcome = applyRulesAndCompare(*model, {"bn-fold"}, kAtol, kRtol);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  CHECK(opSequence(model->graph()) == "MatMul");
  const Node* matmul = findNode(model->graph(), "MatMul");
  // k = {2 / 2, -0.5 / 1.118...}: columns scaled.
  const double k1 = -0.5 / std::sqrt(1.25);
  checkClose(initializerValues(*model, matmul->input(1)->name()), {1, 2 * k1, 3, 4 * k1}, kWeightTolerance);
  const auto entry = foldEntry(outcome.report, "BatchNormalization_0");
  CHECK(entry["bias_created"] == false);
  CHECK(entry["bias_after"].is_null());
}

TEST_CASE("bn-fold: MatMul output rank known only from the BN's declared output", "[bn-fold]") {
  // x has no shape; y (the BN output) is declared 2-D, so the MatMul output is 2-D too.
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[] x) => (float[N,2] y)
<float[3,2] w = {1, -2, 3, 0.5, -1, 2}, float[2] s = {1.5, -2}, float[2] b = {0.25, 1}, float[2] m = {0.5, -1}, float[2] v = {2, 0.5}>
{
  h = MatMul (x, w)
  y = BatchNormalization (h, s, b, m, v)
}
)");
  const Report report = applyRules(*model, {"bn-fold"});
  CHECK(opSequence(model->graph()) == "Gemm");
  CHECK(report.section("folds").size() == 1);
}

TEST_CASE("bn-fold: BatchNormalization forms of every opset", "[bn-fold]") {
  // Opsets 1 and 6: ONNX Runtime has no BatchNormalization kernel there, so these are checked structurally and
  // against the reference only.
  SECTION("opset 6 is_test=1") {
    ConvCase spec;
    spec.opset = 6;
    spec.seed = 50;
    auto model = parseModel(spec.text());
    const Report report = applyRules(*model, {"bn-fold"});
    checkConvFold(*model, report, spec);
    CHECK(report.section("folds")[0]["bn_form"] == "opset-6 (is_test)");
  }
  SECTION("opset 1 is_test=1 with consumed_inputs") {
    ConvCase spec;
    spec.seed = 51;
    spec.bias = true;
    std::string text = spec.text();
    text.replace(text.find("\"\" : 15"), 7, "\"\" : 1");
    text.replace(text.find("<epsilon = 0.001>"), 17, "<epsilon = 0.001, is_test = 1, consumed_inputs = [0, 0, 0, 1, 1]>");
    auto model = parseModel(text);
    const Report report = applyRules(*model, {"bn-fold"});
    checkConvFold(*model, report, spec);
    CHECK(report.section("folds")[0]["bn_form"] == "opset-1 (is_test)");
  }
  for (const int opset : {7, 9, 14, 15}) {
    DYNAMIC_SECTION("opset " << opset) {
      ConvCase spec;
      spec.opset = opset;
      spec.seed = 52 + opset;
      spec.bias = opset % 2 == 1;
      foldConvCase(spec);
    }
  }
}

TEST_CASE("bn-fold: spatial=0 folds when the params are constant within each channel", "[bn-fold]") {
  // Opset 7 BatchNormalization with spatial=0 takes [C, H, W] params; these repeat one value per channel.
  const BnParams p = makeBnParams(2, 60);
  auto expand = [](const std::vector<double>& perChannel) {
    std::vector<double> out;
    for (double v : perChannel) out.insert(out.end(), 9, v);
    return out;
  };
  const auto weights = asFloats(sampleValues(2 * 3 * 9, 60.5));
  const std::string text = R"(<ir_version: 8, opset_import: ["" : 7]>
g (float[1,3,3,3] x) => (float[1,2,3,3] y)
<)" + tensorText("float", "w", {2, 3, 3, 3}, weights) + ", " + tensorText("float", "s", {2, 3, 3}, expand(p.gamma)) +
                           ", " + tensorText("float", "b", {2, 3, 3}, expand(p.beta)) + ", " +
                           tensorText("float", "m", {2, 3, 3}, expand(p.mean)) + ", " +
                           tensorText("float", "v", {2, 3, 3}, expand(p.var)) + R"(>
{
  c = Conv <pads = [1, 1, 1, 1]> (x, w)
  y = BatchNormalization <epsilon = 0.001, spatial = 0> (c, s, b, m, v)
}
)";
  auto model = parseModel(text);
  auto outcome = applyRulesAndCompare(*model, {"bn-fold"}, kAtol, kRtol);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  CHECK(opSequence(model->graph()) == "Conv");
  const Node* conv = findNode(model->graph(), "Conv");
  checkClose(initializerValues(*model, conv->input(1)->name()),
             scaledBy(weights, bnMultiplier(p), convChannel({2, 3, 3, 3})), kWeightTolerance);
  checkClose(initializerValues(*model, conv->input(2)->name()), expectedBias(p), kWeightTolerance);
  // The report carries one value per channel.
  const auto entry = outcome.report.section("folds")[0];
  CHECK(entry["gamma"].size() == 2);
  CHECK(entry["gamma"][1].get<double>() == p.gamma[1]);
}

TEST_CASE("bn-fold: spatial=0 on a 2-D Gemm output is per-channel already", "[bn-fold]") {
  GemmCase spec;
  spec.opset = 7;
  spec.hasC = true;
  spec.cDims = {4};
  spec.seed = 61;
  std::string text = spec.text();
  text.replace(text.find("<epsilon = 0.001>"), 17, "<epsilon = 0.001, spatial = 0>");
  auto model = parseModel(text);
  auto outcome = applyRulesAndCompare(*model, {"bn-fold"}, kAtol, kRtol);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  CHECK(opSequence(model->graph()) == "Gemm");
}

TEST_CASE("bn-fold: float16 weights are folded in double and rounded once", "[bn-fold]") {
  ConvCase spec;
  spec.bias = true;
  spec.seed = 70;
  auto model = parseModelAs(spec.text(), onnx::TensorProto::FLOAT16);
  REQUIRE(findInitializer(*model, "w")->dataType() == DataType::Float16);
  const auto oldWeights = initializerValues(*model, "w");
  const auto oldBias = initializerValues(*model, "bias");
  BnParams bn;
  bn.gamma = initializerValues(*model, "s");
  bn.beta = initializerValues(*model, "b");
  bn.mean = initializerValues(*model, "m");
  bn.var = initializerValues(*model, "v");
  bn.epsilon = static_cast<double>(0.001f);
  auto outcome = applyRulesAndCompare(*model, {"bn-fold"}, kAtol16, kRtol16);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  INFO("max abs " << outcome.comparison.maxAbs << ", max rel " << outcome.comparison.maxRel);
  const Node* conv = findNode(model->graph(), "Conv");
  const Tensor* folded = findInitializer(*model, conv->input(1)->name());
  CHECK(folded->dataType() == DataType::Float16);
  CHECK(findInitializer(*model, conv->input(2)->name())->dataType() == DataType::Float16);
  // Within half an fp16 ulp (2^-11 relative) of the exact product: one rounding, not one per step.
  checkClose(folded->toDoubles(), scaledBy(oldWeights, bnMultiplier(bn), spec.channelOf()), 1.0 / 2048);
  checkClose(initializerValues(*model, conv->input(2)->name()), expectedBias(bn, oldBias), 1.0 / 2048);
}

TEST_CASE("bn-fold: float16 Gemm and MatMul", "[bn-fold]") {
  GemmCase spec;
  spec.hasC = true;
  spec.cDims = {4};
  spec.transB = true;
  spec.seed = 71;
  auto gemm = parseModelAs(spec.text(), onnx::TensorProto::FLOAT16);
  auto outcome = applyRulesAndCompare(*gemm, {"bn-fold"}, kAtol16, kRtol16);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  CHECK(opSequence(gemm->graph()) == "Gemm");
  CHECK(findInitializer(*gemm, findNode(gemm->graph(), "Gemm")->input(2)->name())->dataType() == DataType::Float16);

  auto matmul = parseModelAs(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[3,4] x) => (float[3,2] y)
<float[4,2] w = {0.5, -1, 0.25, 2, -0.75, 1.5, 1, -0.5}, float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1}, float[2] m = {0.1, 0.2}, float[2] v = {0.5, 2}>
{
  h = MatMul (x, w)
  y = BatchNormalization (h, s, b, m, v)
}
)", onnx::TensorProto::FLOAT16);
  outcome = applyRulesAndCompare(*matmul, {"bn-fold"}, kAtol16, kRtol16);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  CHECK(opSequence(matmul->graph()) == "Gemm");
}

TEST_CASE("bn-fold: double weights", "[bn-fold]") {
  // ONNX Runtime runs double Gemm and BatchNormalization; it has no double Conv kernel, so the Conv case is
  // checked against the reference only.
  GemmCase spec;
  spec.hasC = true;
  spec.cDims = {1, 4};
  spec.seed = 72;
  auto gemm = parseModelAs(spec.text(), onnx::TensorProto::DOUBLE);
  auto outcome = applyRulesAndCompare(*gemm, {"bn-fold"}, 1e-12, 1e-12);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  const Node* node = findNode(gemm->graph(), "Gemm");
  CHECK(findInitializer(*gemm, node->input(1)->name())->dataType() == DataType::Double);

  ConvCase conv;
  conv.seed = 73;
  auto model = parseModelAs(conv.text(), onnx::TensorProto::DOUBLE);
  const Report report = applyRules(*model, {"bn-fold"});
  const Node* layer = findNode(model->graph(), "Conv");
  REQUIRE(layer);
  CHECK(countOps(*model, "BatchNormalization") == 0);
  CHECK(findInitializer(*model, layer->input(1)->name())->dataType() == DataType::Double);
  checkClose(initializerValues(*model, layer->input(1)->name()),
             scaledBy(conv.weights(), bnMultiplier(conv.bn()), conv.channelOf()), 1e-14);
  checkClose(initializerValues(*model, layer->input(2)->name()), expectedBias(conv.bn()), 1e-14);
}

TEST_CASE("bn-fold: bfloat16 weights", "[bn-fold]") {
  // ONNX Runtime's CPU provider has no bfloat16 Gemm/MatMul/BatchNormalization: checked against the reference.
  GemmCase spec;
  spec.hasC = true;
  spec.cDims = {4};
  spec.seed = 74;
  auto model = parseModelAs(spec.text(), onnx::TensorProto::BFLOAT16);
  const auto oldWeights = initializerValues(*model, "w");
  const auto oldC = initializerValues(*model, "cb");
  BnParams bn;
  bn.gamma = initializerValues(*model, "s");
  bn.beta = initializerValues(*model, "b");
  bn.mean = initializerValues(*model, "m");
  bn.var = initializerValues(*model, "v");
  bn.epsilon = static_cast<double>(0.001f);
  applyRules(*model, {"bn-fold"});
  const Node* gemm = findNode(model->graph(), "Gemm");
  REQUIRE(gemm);
  CHECK(countOps(*model, "BatchNormalization") == 0);
  const Tensor* weights = findInitializer(*model, gemm->input(1)->name());
  CHECK(weights->dataType() == DataType::BFloat16);
  // Half a bfloat16 ulp is 2^-8 relative.
  checkClose(weights->toDoubles(), scaledBy(oldWeights, bnMultiplier(bn), columnChannel(spec.n)), 1.0 / 256);
  checkClose(initializerValues(*model, gemm->input(2)->name()), expectedBias(bn, oldC), 1.0 / 256);
}

TEST_CASE("bn-fold: opset 15 BN params of other float types than the layer", "[bn-fold]") {
  // T = float16 (X, W), T1 = float (scale, B), T2 = double (mean, var).
  ConvCase spec;
  spec.seed = 75;
  std::string text = spec.text();
  const BnParams p = spec.bn();
  const std::string meanVar = tensorText("double", "m", {4}, p.mean) + ", " + tensorText("double", "v", {4}, p.var);
  const std::string floatMeanVar = tensorText("float", "m", {4}, p.mean) + ", " + tensorText("float", "v", {4}, p.var);
  text.replace(text.find(floatMeanVar), floatMeanVar.size(), meanVar);
  auto model = parseModelAs(text, onnx::TensorProto::FLOAT16, {"s", "b"});
  REQUIRE(findInitializer(*model, "s")->dataType() == DataType::Float);
  REQUIRE(findInitializer(*model, "m")->dataType() == DataType::Double);
  const auto oldWeights = initializerValues(*model, "w");
  const Report report = applyRules(*model, {"bn-fold"});
  REQUIRE(report.section("folds").size() == 1);
  const Node* conv = findNode(model->graph(), "Conv");
  const Tensor* weights = findInitializer(*model, conv->input(1)->name());
  CHECK(weights->dataType() == DataType::Float16);
  CHECK(findInitializer(*model, conv->input(2)->name())->dataType() == DataType::Float16);
  checkClose(weights->toDoubles(), scaledBy(oldWeights, bnMultiplier(p), spec.channelOf()), 1.0 / 2048);
}
