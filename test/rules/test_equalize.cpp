// equalize: cross-layer equalization between layers joined by a positively homogeneous activation. Weights have
// per-channel magnitudes spanning two orders (as BN folding leaves them), so the scales are far from 1. Every
// positive case is run in ONNX Runtime (and through --verify by applyRules); every blocker has its reason code.

#include <catch2/catch.hpp>
#include <cmath>
#include <functional>

#include "bnfold/rewrite/driver.h"
#include "test_bn_fold_support.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;

namespace {

constexpr double kTol = 1e-4;

/// Float values whose channel c (channelOf(flat index)) is scaled by 10^u, u in [-1, 1) per channel.
std::vector<double> spread(const std::vector<int64_t>& dims, double seed,
                           const std::function<std::size_t(std::size_t)>& channelOf) {
  const auto values = sampleValues(product(dims, 0), seed);
  const auto magnitudes = sampleValues(64, seed + 0.5);
  std::vector<double> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = values[i] * std::pow(10.0, magnitudes[channelOf(i) % 64]);
  return asFloats(out);
}

/// Weight whose rows (axis 0: Conv output channels, Gemm transB rows) have spread magnitudes.
std::string rowSpread(const std::string& name, const std::vector<int64_t>& dims, double seed) {
  return tensorText("float", name, dims, spread(dims, seed, convChannel(dims)));
}

std::string floats(const std::string& name, const std::vector<int64_t>& dims, double seed) {
  return tensorText("float", name, dims, asFloats(sampleValues(product(dims, 0), seed)));
}

const nlohmann::json& section(const Report& report, const std::string& name) { return report.section(name); }

/// Each equalized link lowered the chain's int8 noise, says what it did, and, where it took the sweep's full
/// step, has equal ranges on both sides.
void checkEqualizedLinks(const Report& report, std::size_t links) {
  const auto& entries = section(report, "equalized");
  INFO("not_equalized: " << section(report, "not_equalized").dump());
  INFO("verification: " << report.json().value("verification", nlohmann::json()).dump());
  REQUIRE(entries.size() == links);
  // Ranges come out equal where every link of the chain took the sweep's full step (the sweep's fixed point).
  bool allFullSweeps = true;
  for (const auto& entry : entries)
    allFullSweeps = allFullSweeps && entry["scale_method"] == "sweep" && entry["scale_power"].get<double>() == 1.0;
  for (const auto& entry : section(report, "not_equalized"))
    allFullSweeps = allFullSweeps && entry["reason"] != "not-improving";
  for (const auto& entry : entries) {
    INFO(entry.dump());
    CHECK(entry["rule"] == "equalize");
    CHECK(entry["converged"] == true);
    const auto& r1 = entry["ranges_after"]["layer1_output"];
    const auto& r2 = entry["ranges_after"]["layer2_input"];
    REQUIRE(r1.size() == r2.size());
    REQUIRE(entry["scales"].size() == r1.size());
    const double power = entry["scale_power"].get<double>();
    CHECK((power == 0.5 || power == 1.0));
    bool nonTrivial = false;
    for (std::size_t i = 0; i < r1.size(); ++i) {
      if (allFullSweeps) CHECK(r1[i].get<double>() == Approx(r2[i].get<double>()).epsilon(1e-5));
      const double s = entry["scales"][i].get<double>();
      CHECK(s > 0.0);
      nonTrivial = nonTrivial || std::abs(std::log(s)) > 0.1;
    }
    CHECK(nonTrivial);
    // Never worse: the link lowered its two layers' int8 noise against the chain without it.
    CHECK(entry["quant_error_after"]["sum"].get<double>() < entry["quant_error_without_link"].get<double>());
  }
}

void checkSameFunction(const FoldOutcome& outcome) {
  INFO(outcome.comparison.error);
  INFO(outcome.comparison.details.dump());
  CHECK(outcome.comparison.ok);
}

std::string header(int opset = 13) { return "<ir_version: 8, opset_import: [\"\" : " + std::to_string(opset) + "]>\n"; }

}  // namespace

TEST_CASE("equalize: Conv -> Relu -> Conv gets sqrt(r1/r2) scales, weights and bias rescaled", "[equalize]") {
  auto model = parseModel(header() + R"(g (float[1,3,6,6] x) => (float[1,4,6,6] y)
<)" + rowSpread("w1", {8, 3, 3, 3}, 1.0) +
                          ", " + floats("b1", {8}, 2.0) + ", " + floats("w2", {4, 8, 3, 3}, 3.0) + ", " +
                          floats("b2", {4}, 4.0) + R"(>
{
  c1 = Conv <pads = [1,1,1,1]> (x, w1, b1)
  r1 = Relu (c1)
  y = Conv <pads = [1,1,1,1]> (r1, w2, b2)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"equalize"}, kTol, kTol);
  checkSameFunction(outcome);
  CHECK(opSequence(model->graph()) == "Conv,Relu,Conv");
  checkEqualizedLinks(outcome.report, 1);
  const auto& entry = section(outcome.report, "equalized")[0];
  CHECK(entry["layer1"] == findNode(model->graph(), "Conv")->name());
  CHECK(entry["activation"] == "Relu");
  CHECK(entry["chain_layers"] == 2);
  // A pair converges in one sweep: the scales are AIMET's sqrt(r1 / r2) of the original ranges.
  const auto& before1 = entry["ranges_before"]["layer1_output"];
  const auto& before2 = entry["ranges_before"]["layer2_input"];
  for (std::size_t i = 0; i < before1.size(); ++i)
    CHECK(entry["scales"][i].get<double>() ==
          Approx(std::sqrt(before1[i].get<double>() / before2[i].get<double>())).epsilon(1e-9));
  // New initializers; the bias is divided by the scale too.
  const Node* conv1 = findNode(model->graph(), "Conv");
  CHECK(conv1->input(1)->name() != "w1");
  const auto b1 = initializerValues(*model, conv1->input(2)->name());
  const auto b1Before = asFloats(sampleValues(8, 2.0));
  for (std::size_t i = 0; i < 8; ++i)
    CHECK(b1[i] == Approx(b1Before[i] / entry["scales"][i].get<double>()).epsilon(1e-6));
  CHECK(section(outcome.report, "not_equalized").empty());
}

TEST_CASE("equalize: a depthwise separable triple Conv -> dw Conv -> Conv is swept to convergence", "[equalize]") {
  auto model = parseModel(header() + R"(g (float[1,3,7,7] x) => (float[1,5,7,7] y)
<)" + rowSpread("w1", {8, 3, 1, 1}, 5.0) +
                          ", " + floats("b1", {8}, 6.0) + ", " + rowSpread("dw", {8, 1, 3, 3}, 7.0) + ", " +
                          floats("bdw", {8}, 8.0) + ", " + floats("w3", {5, 8, 1, 1}, 9.0) + R"(>
{
  c1 = Conv (x, w1, b1)
  r1 = Relu (c1)
  c2 = Conv <group = 8, pads = [1,1,1,1]> (r1, dw, bdw)
  r2 = Relu (c2)
  y = Conv (r2, w3)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"equalize"}, kTol, kTol);
  checkSameFunction(outcome);
  checkEqualizedLinks(outcome.report, 2);
  const auto& entries = section(outcome.report, "equalized");
  CHECK(entries[0]["chain_layers"] == 3);
  CHECK(entries[0]["sweeps"].get<int>() > 2);  // the two links pull on the middle layer: more than one pass
  // The depthwise layer's input and output channels are its rows: after convergence all three ranges of a
  // channel agree (AIMET's closed form gives the same equal ranges).
  for (std::size_t i = 0; i < 8; ++i)
    CHECK(entries[0]["ranges_after"]["layer1_output"][i].get<double>() ==
          Approx(entries[1]["ranges_after"]["layer2_input"][i].get<double>()).epsilon(1e-5));
}

TEST_CASE("equalize: a chain of five Gemm layers converges and reports its sweeps", "[equalize]") {
  std::string inits;
  const int sizes[] = {6, 8, 8, 8, 8, 3};
  for (int k = 0; k < 5; ++k) {
    // transB = 1: [N, K], rows are output channels.
    inits += (k ? ", " : "") + rowSpread("w" + std::to_string(k), {sizes[k + 1], sizes[k]}, 10.0 + k) + ", " +
             floats("b" + std::to_string(k), {sizes[k + 1]}, 20.0 + k);
  }
  auto model = parseModel(header() + "g (float[2,6] x) => (float[2,3] y)\n<" + inits + R"(>
{
  g0 = Gemm <transB = 1> (x, w0, b0)
  r0 = Relu (g0)
  g1 = Gemm <transB = 1> (r0, w1, b1)
  r1 = Relu (g1)
  g2 = Gemm <transB = 1> (r1, w2, b2)
  r2 = Relu (g2)
  g3 = Gemm <transB = 1> (r2, w3, b3)
  r3 = Relu (g3)
  y = Gemm <transB = 1> (r3, w4, b4)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"equalize"}, kTol, kTol);
  checkSameFunction(outcome);
  checkEqualizedLinks(outcome.report, 4);
  const auto& entry = section(outcome.report, "equalized")[0];
  CHECK(entry["chain_layers"] == 5);
  CHECK(entry["sweeps"].get<int>() > 3);
}

TEST_CASE("equalize: grouped Conv layers map channels through their groups", "[equalize]") {
  auto model = parseModel(header() + R"(g (float[1,4,6,6] x) => (float[1,6,6,6] y)
<)" + rowSpread("w1", {8, 2, 3, 3}, 30.0) +
                          ", " + floats("b1", {8}, 31.0) + ", " + floats("w2", {6, 4, 3, 3}, 32.0) +
                          R"(>
{
  c1 = Conv <group = 2, pads = [1,1,1,1]> (x, w1, b1)
  r1 = Relu (c1)
  y = Conv <group = 2, pads = [1,1,1,1]> (r1, w2)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"equalize"}, kTol, kTol);
  checkSameFunction(outcome);
  checkEqualizedLinks(outcome.report, 1);
}

TEST_CASE("equalize: ConvTranspose before and after a Conv", "[equalize]") {
  // ConvTranspose W [C, M/group, k, k]: output channel g*(M/group)+j is axis 1 within group g.
  std::vector<int64_t> ctDims{4, 6, 2, 2};
  auto ctWeights = spread(ctDims, 40.0, [](std::size_t i) { return (i / 4) % 6; });
  auto model = parseModel(header() + R"(g (float[1,4,5,5] x) => (float[1,3,10,10] y)
<)" + tensorText("float", "wt", ctDims, ctWeights) +
                          ", " + floats("bt", {6}, 41.0) + ", " + rowSpread("w2", {4, 6, 3, 3}, 42.0) + ", " +
                          floats("b2", {4}, 43.0) + ", " + floats("wt2", {4, 3, 1, 1}, 44.0) + R"(>
{
  t1 = ConvTranspose <strides = [2,2]> (x, wt, bt)
  r1 = Relu (t1)
  c2 = Conv <pads = [1,1,1,1]> (r1, w2, b2)
  r2 = LeakyRelu <alpha = 0.1> (c2)
  y = ConvTranspose (r2, wt2)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"equalize"}, kTol, kTol);
  checkSameFunction(outcome);
  checkEqualizedLinks(outcome.report, 2);
  CHECK(section(outcome.report, "equalized")[1]["activation"] == "LeakyRelu");
}

TEST_CASE("equalize: Gemm (transB) -> Relu -> MatMul -> PRelu -> Gemm with beta and a [1,N] C", "[equalize]") {
  auto model = parseModel(header() + R"(g (float[3,5] x) => (float[3,4] y)
<)" + rowSpread("w1", {7, 5}, 50.0) +
                          ", " + floats("c1", {7}, 51.0) + ", " +
                          tensorText("float", "w2", {7, 6}, spread({7, 6}, 52.0, [](std::size_t i) { return i % 6; })) +
                          ", " + floats("slope", {6}, 53.0) + ", " + floats("w3", {6, 4}, 54.0) + ", " +
                          floats("c3", {1, 4}, 55.0) + R"(>
{
  g1 = Gemm <transB = 1> (x, w1, c1)
  r1 = Relu (g1)
  m2 = MatMul (r1, w2)
  p2 = PRelu (m2, slope)
  y = Gemm <beta = 0.5> (p2, w3, c3)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"equalize"}, kTol, kTol);
  checkSameFunction(outcome);
  checkEqualizedLinks(outcome.report, 2);
  CHECK(section(outcome.report, "equalized")[1]["activation"] == "PRelu");
}

TEST_CASE("equalize: a per-channel PRelu slope stays with its channel", "[equalize]") {
  auto model = parseModel(header() + R"(g (float[1,3,5,5] x) => (float[1,4,5,5] y)
<)" + rowSpread("w1", {6, 3, 3, 3}, 60.0) +
                          ", " + floats("b1", {6}, 61.0) + ", " + floats("slope", {6, 1, 1}, 62.0) + ", " +
                          floats("w2", {4, 6, 1, 1}, 63.0) + R"(>
{
  c1 = Conv <pads = [1,1,1,1]> (x, w1, b1)
  p1 = PRelu (c1, slope)
  y = Conv (p1, w2)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"equalize"}, kTol, kTol);
  checkSameFunction(outcome);
  checkEqualizedLinks(outcome.report, 1);
  CHECK(initializerValues(*model, "slope") == asFloats(sampleValues(6, 62.0)));
}

TEST_CASE("equalize: float16 weights are computed in double and rounded once", "[equalize]") {
  auto model = parseModelAs(header() + R"(g (float[1,3,5,5] x) => (float[1,4,5,5] y)
<)" + rowSpread("w1", {6, 3, 3, 3}, 70.0) +
                                ", " + floats("b1", {6}, 71.0) + ", " + floats("w2", {4, 6, 3, 3}, 72.0) + R"(>
{
  c1 = Conv <pads = [1,1,1,1]> (x, w1, b1)
  r1 = Relu (c1)
  y = Conv <pads = [1,1,1,1]> (r1, w2)
}
)",
                            onnx::TensorProto::FLOAT16);
  FoldOutcome outcome = applyRulesAndCompare(*model, {"equalize"}, 2e-2, 2e-2);
  checkSameFunction(outcome);
  REQUIRE(section(outcome.report, "equalized").size() == 1);
  const Node* conv1 = findNode(model->graph(), "Conv");
  CHECK(conv1->input(1)->constantTensor()->dataType() == DataType::Float16);
  CHECK(conv1->input(2)->constantTensor()->dataType() == DataType::Float16);
}

TEST_CASE("equalize: after bn-fold, and a second run changes nothing", "[equalize]") {
  const BnParams bn = makeBnParams(8, 80.0);
  const std::string text = header() + R"(g (float[1,3,6,6] x) => (float[1,4,6,6] y)
<)" + floats("w1", {8, 3, 3, 3}, 81.0) +
                           ", " + bnInitializers(bn) + ", " + floats("w2", {4, 8, 3, 3}, 82.0) + ", " +
                           floats("w3", {4, 4, 1, 1}, 83.0) + R"(>
{
  c1 = Conv <pads = [1,1,1,1]> (x, w1)
  n1 = BatchNormalization (c1, s, b, m, v)
  r1 = Relu (n1)
  c2 = Conv <pads = [1,1,1,1]> (r1, w2)
  r2 = Relu (c2)
  y = Conv (r2, w3)
}
)";
  auto model = parseModel(text);
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-fold", "equalize"}, kTol, kTol);
  checkSameFunction(outcome);
  CHECK(section(outcome.report, "folds").size() == 1);
  CHECK(opSequence(model->graph()) == "Conv,Relu,Conv,Relu,Conv");
  // The folded first layer has the spread; the second link joins two uniform random weights, which the spread
  // the first link moves into the middle layer's inputs makes worth equalizing too.
  checkEqualizedLinks(outcome.report, 2);
  CHECK(section(outcome.report, "not_equalized").empty());

  std::vector<std::pair<std::string, std::vector<double>>> weights;
  for (const auto& node : model->graph().nodes())
    if (node->isOnnxOp("Conv"))
      weights.emplace_back(node->input(1)->name(), node->input(1)->constantTensor()->toDoubles());
  const Report again = applyRules(*model, {"bn-fold", "equalize"});
  CHECK(again.rewriteCount() == 0);
  CHECK(section(again, "equalized").empty());
  // Scales of 1 are no candidate worth an entry; a refused one would be said.
  for (const auto& entry : section(again, "not_equalized")) CHECK(entry["reason"] == "not-improving");
  std::size_t k = 0;
  for (const auto& node : model->graph().nodes())
    if (node->isOnnxOp("Conv")) {
      CHECK(node->input(1)->name() == weights[k].first);
      CHECK(node->input(1)->constantTensor()->toDoubles() == weights[k].second);
      ++k;
    }
}

TEST_CASE("equalize: off by default, enabled by fold --equalize", "[equalize][cli]") {
  CHECK_FALSE(findRule("equalize")->enabledByDefault());
  TempDir dir;
  auto model = parseModel(header() + R"(g (float[1,3,6,6] x) => (float[1,4,6,6] y)
<)" + rowSpread("w1", {8, 3, 3, 3}, 90.0) +
                          ", " + floats("w2", {4, 8, 3, 3}, 91.0) + R"(>
{
  c1 = Conv <pads = [1,1,1,1]> (x, w1)
  r1 = Relu (c1)
  y = Conv <pads = [1,1,1,1]> (r1, w2)
}
)");
  saveModel(*model, dir.file("in.onnx"));
  std::string err;
  REQUIRE(runCommand(cli("fold " + dir.file("in.onnx") + " -o " + dir.file("plain.onnx") + " --report " +
                         dir.file("plain.json")),
                     nullptr, &err) == 0);
  CHECK(nlohmann::json::parse(readFile(dir.file("plain.json"))).value("equalized", nlohmann::json::array()).empty());
  REQUIRE(runCommand(cli("fold " + dir.file("in.onnx") + " -o " + dir.file("out.onnx") +
                         " --equalize --verify --report " + dir.file("out.json")),
                     nullptr, &err) == 0);
  const auto report = nlohmann::json::parse(readFile(dir.file("out.json")));
  INFO(report.dump());
  CHECK(report["equalized"].size() == 1);
  CHECK(report["verification"]["failed"] == 0);
  CHECK(report["verification"]["passed"] == 1);
  const OrtComparison comparison = compareInOrt(dir.file("in.onnx"), dir.file("out.onnx"), kTol, kTol);
  INFO(comparison.error);
  CHECK(comparison.ok);
}

// ---------------------------------------------------------------------------------------------------------------
// Blockers: each link left alone has a not_equalized entry with its reason code, and the model is unchanged.

namespace {

nlohmann::json leftAlone(const std::string& text, const std::string& layer) {
  auto model = parseModel(text);
  const std::string before = opSequence(model->graph());
  const Report report = applyRules(*model, {"equalize"});
  CHECK(section(report, "equalized").empty());
  CHECK(report.rewriteCount() == 0);
  CHECK(opSequence(model->graph()) == before);
  for (const auto& entry : section(report, "not_equalized"))
    if (entry["node"] == layer) return entry;
  FAIL("no not_equalized entry for " << layer << ": " << section(report, "not_equalized").dump());
  return {};
}

std::string pairWith(const std::string& between, const std::string& extraInits = "", int opset = 13) {
  return header(opset) + R"(g (float[1,3,6,6] x) => (float[1,8,6,6] y)
<)" + rowSpread("w1", {8, 3, 3, 3}, 100.0) +
         ", " + floats("w2", {8, 8, 1, 1}, 101.0) + extraInits + R"(>
{
  c1 = Conv <pads = [1,1,1,1]> (x, w1)
)" + between +
         R"(
}
)";
}

}  // namespace

TEST_CASE("equalize blocker: a residual Add", "[equalize]") {
  const auto entry = leftAlone(pairWith("  r1 = Relu (c1)\n  c2 = Conv (r1, w2)\n  y = Add (c2, r1)"), "Conv_0");
  CHECK(entry["reason"] == "residual-add");
}

TEST_CASE("equalize blocker: activations that are not positively homogeneous", "[equalize]") {
  CHECK(leftAlone(pairWith("  r1 = Clip (c1, lo, hi)\n  y = Conv (r1, w2)", ", float lo = {0}, float hi = {6}"),
                  "Conv_0")["reason"] == "non-homogeneous-activation");
  CHECK(leftAlone(pairWith("  r1 = HardSwish (c1)\n  y = Conv (r1, w2)", "", 14), "Conv_0")["reason"] ==
        "non-homogeneous-activation");
  CHECK(leftAlone(pairWith("  s1 = Sigmoid (c1)\n  r1 = Mul (c1, s1)\n  y = Conv (r1, w2)"), "Conv_0")["reason"] ==
        "non-homogeneous-activation");
}

TEST_CASE("equalize blocker: a reader that is not a layer", "[equalize]") {
  CHECK(leftAlone(pairWith("  r1 = Relu (c1)\n  p1 = MaxPool <kernel_shape = [1,1]> (r1)\n  y = Conv (p1, w2)"),
                  "Conv_0")["reason"] == "reader-not-layer");
}

TEST_CASE("equalize blocker: shared weights", "[equalize]") {
  CHECK(leftAlone(pairWith("  r1 = Relu (c1)\n  c2 = Conv (r1, w2)\n  r2 = Relu (c2)\n  c3 = Conv (r2, w2)\n"
                           "  y = Relu (c3)"),
                  "Conv_0")["reason"] == "shared-weights");
}

TEST_CASE("equalize blocker: quantized weights", "[equalize]") {
  std::string quantized;
  for (int i = 0; i < 64; ++i) quantized += (i ? "," : "") + std::to_string(i - 32);
  CHECK(leftAlone(pairWith("  r1 = Relu (c1)\n  wq = DequantizeLinear (q2, qs, qz)\n  y = Conv (r1, wq)",
                           ", int8[8,8,1,1] q2 = {" + quantized + "}, float qs = {0.01}, int8 qz = {0}"),
                  "Conv_0")["reason"] == "quantized-weights");
}

TEST_CASE("equalize blocker: scales that would not lower the int8 error", "[equalize]") {
  // w1's two rows hold 1 and 1/127, both on the int8 grid of a step of 1/127: no error to lower. Equalizing
  // would move the second row off the grid.
  const std::string text = header() + R"(g (float[1,1,4,4] x) => (float[1,1,4,4] y)
<float[2,1,1,1] w1 = {1, 0.00787401574803149606}, float[1,2,1,1] w2 = {1, 1}>
{
  c1 = Conv (x, w1)
  r1 = Relu (c1)
  y = Conv (r1, w2)
}
)";
  const auto entry = leftAlone(text, "Conv_0");
  CHECK(entry["reason"] == "not-improving");
}
