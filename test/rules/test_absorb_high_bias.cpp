// absorb-high-bias: c = max(0, beta - 3|gamma|) of a folded BN's channels (scaled as equalize scaled them) moves
// through a Relu into the next layer's bias. The models keep every pre-activation within one standard deviation
// of its mean on ONNX Runtime's inputs (|x| <= 1: the BN's variance is the square of the layer's largest possible
// output), so the assumption holds there and the rewritten model must equal the original. The expected c is
// computed here from the stated gamma and beta; every blocker has its reason code.

#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>

#include "bnfold/check/findings.h"
#include "bnfold/check/fold.h"
#include "bnfold/io/model_io.h"
#include "bnfold/rewrite/rewriter.h"
#include "check/fold_testing.h"
#include "test_bn_fold_support.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;
using json = nlohmann::json;

namespace {

constexpr double kTol = 1e-4;
const std::vector<std::string> kRules = {"bn-fold", "equalize", "absorb-high-bias"};

std::string header(int opset = 13) { return "<ir_version: 8, opset_import: [\"\" : " + std::to_string(opset) + "]>\n"; }

/// Weights with rows of magnitudes 10^-1 .. 10 (so equalize has scales to apply), float-representable.
std::vector<double> spreadRows(std::size_t rows, std::size_t rowLength, double seed) {
  std::vector<double> values = sampleValues(rows * rowLength, seed);
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] *= std::pow(10.0, static_cast<double>(i / rowLength % 3) - 1.0);
  return asFloats(values);
}

/// BN parameters for layer outputs bounded by `bound` per channel (|x| <= 1): mean 0, var = bound^2, so the
/// normalized value stays in [-1, 1] and the pre-activation in [beta - |gamma|, beta + |gamma|]. Channels in
/// `high` get beta = 3|gamma| + 0.5 + 0.25 c (some bias to absorb), the others beta = |gamma| (none).
struct HighBiasBn {
  std::vector<double> gamma, beta, mean, var;
};
HighBiasBn boundedBn(const std::vector<double>& bound, const std::vector<bool>& high, double seed) {
  HighBiasBn bn;
  const std::vector<double> gamma = sampleValues(bound.size(), seed, 0.3, 1.5);
  for (std::size_t c = 0; c < bound.size(); ++c) {
    const double g = (c % 2 ? -1.0 : 1.0) * gamma[c];  // a negative scale too: c uses |gamma|
    bn.gamma.push_back(static_cast<float>(g));
    bn.beta.push_back(static_cast<float>(high[c] ? 3.0 * std::abs(g) + 0.5 + 0.25 * static_cast<double>(c) : std::abs(g)));
    bn.mean.push_back(0.0);
    bn.var.push_back(static_cast<float>(bound[c] * bound[c]));
  }
  return bn;
}

std::string bnText(const HighBiasBn& bn) {
  const std::vector<int64_t> dims{static_cast<int64_t>(bn.gamma.size())};
  return tensorText("float", "s", dims, bn.gamma) + ", " + tensorText("float", "b", dims, bn.beta) + ", " +
         tensorText("float", "m", dims, bn.mean) + ", " + tensorText("float", "v", dims, bn.var);
}

/// Sum of |w| per row plus |bias|: the largest |output| of a row for inputs in [-1, 1].
std::vector<double> rowBounds(const std::vector<double>& w, std::size_t rows, const std::vector<double>& bias) {
  const std::size_t length = w.size() / rows;
  std::vector<double> bound(rows, 0.0);
  for (std::size_t i = 0; i < w.size(); ++i) bound[i / length] += std::abs(w[i]);
  for (std::size_t r = 0; r < rows; ++r) bound[r] = bound[r] * 1.01 + std::abs(bias[r]) + 1e-3;
  return bound;
}

struct PairModel {
  std::string text;
  HighBiasBn bn;
};

/// Conv(pads 0) -> BN -> Relu -> Conv(`secondAttributes`): channels 0 and 2 of four have a high bias.
PairModel convPair(const std::string& secondAttributes = "", const std::string& activation = "Relu") {
  const std::vector<double> w1 = spreadRows(4, 27, 1.0);
  const std::vector<double> b1 = asFloats(sampleValues(4, 2.0));
  PairModel model;
  model.bn = boundedBn(rowBounds(w1, 4, b1), {true, false, true, false}, 3.0);
  const std::string activationLine = activation.empty() ? "  a = Identity (n)\n" : "  a = " + activation + " (n)\n";
  model.text = header() + R"(g (float[1,3,6,6] x) => (float[1,5,2,2] y)
<)" + tensorText("float", "w1", {4, 3, 3, 3}, w1) +
               ", " + tensorText("float", "b1", {4}, b1) + ", " + bnText(model.bn) + ", " +
               tensorText("float", "w2", {5, 4, 3, 3}, asFloats(sampleValues(180, 4.0))) + R"(>
{
  c = Conv (x, w1, b1)
  n = BatchNormalization (c, s, b, m, v)
)" + activationLine + "  y = Conv " + secondAttributes + R"( (a, w2)
}
)";
  return model;
}

/// Gemm -> BN -> Relu -> Gemm (transB = 1, alpha 0.5): channels 1 and 4 of six have a high bias.
PairModel gemmPair() {
  const std::vector<double> w1 = spreadRows(6, 5, 5.0);  // [6, 5] with transB = 1: rows are output channels
  const std::vector<double> b1 = asFloats(sampleValues(6, 6.0));
  PairModel model;
  model.bn = boundedBn(rowBounds(w1, 6, b1), {false, true, false, false, true, false}, 7.0);
  model.text = header() + R"(g (float[2,5] x) => (float[2,3] y)
<)" + tensorText("float", "w1", {6, 5}, w1) +
               ", " + tensorText("float", "b1", {6}, b1) + ", " + bnText(model.bn) + ", " +
               tensorText("float", "w2", {6, 3}, asFloats(sampleValues(18, 8.0))) + ", " +
               tensorText("float", "b2", {3}, asFloats(sampleValues(3, 9.0))) + R"(>
{
  c = Gemm <transB = 1> (x, w1, b1)
  n = BatchNormalization (c, s, b, m, v)
  a = Relu (n)
  y = Gemm <alpha = 0.5> (a, w2, b2)
}
)";
  return model;
}

/// The layers (Conv, Gemm, MatMul) of the main graph in order.
std::vector<const Node*> layers(Model& model) {
  std::vector<const Node*> found;
  for (const auto& node : model.graph().nodes())
    if (node->opType() == "Conv" || node->opType() == "Gemm" || node->opType() == "MatMul") found.push_back(node.get());
  return found;
}

std::vector<double> biasOf(const Node& layer, std::size_t channels) {
  const Value* bias = layer.input(2);
  if (!bias) return std::vector<double>(channels, 0.0);
  return bias->constantTensor()->toDoubles();
}

/// The equalize scales of the link after the first layer (all 1 when equalize left it alone).
std::vector<double> equalizeScales(const Report& report, std::size_t channels) {
  for (const auto& entry : report.section("equalized")) return entry["scales"].get<std::vector<double>>();
  return std::vector<double>(channels, 1.0);
}

/// c from the stated BN and the equalize scales: max(0, (beta - 3|gamma|) / s).
std::vector<double> expectedAbsorbed(const HighBiasBn& bn, const std::vector<double>& scales) {
  std::vector<double> c;
  for (std::size_t i = 0; i < bn.gamma.size(); ++i)
    c.push_back(std::max(0.0, (bn.beta[i] - 3.0 * std::abs(bn.gamma[i])) / scales[i]));
  return c;
}

/// Runs the pair once without and once with absorb-high-bias, checks the rewritten model in ONNX Runtime, and
/// checks that the first bias went down by c and the second up by W2 c (times alpha) against the run without.
void checkAbsorbed(const PairModel& pair, std::size_t channels, std::size_t outputs,
                   const std::function<double(const std::vector<double>&, std::size_t, std::size_t)>& weightAt,
                   double alpha) {
  auto withoutModel = parseModel(pair.text);
  const Report without = applyRules(*withoutModel, {"bn-fold", "equalize"});
  auto model = parseModel(pair.text);
  const FoldOutcome outcome = applyRulesAndCompare(*model, kRules, kTol, kTol);
  INFO(outcome.report.dump());
  INFO(outcome.comparison.error << " " << outcome.comparison.details.dump());
  CHECK(outcome.comparison.ok);

  const std::vector<double> c = expectedAbsorbed(pair.bn, equalizeScales(without, channels));
  REQUIRE(std::any_of(c.begin(), c.end(), [](double v) { return v > 0.1; }));
  const auto& entries = outcome.report.section("high_bias_absorbed");
  REQUIRE(entries.size() == 1);
  const json& entry = entries[0];
  CHECK(entry["rule"] == "absorb-high-bias");
  CHECK(entry["activation"] == "Relu");
  checkClose(entry["absorbed"].get<std::vector<double>>(), c, 1e-5);
  CHECK(entry["assumption"].get<std::string>().find("at least") != std::string::npos);
  REQUIRE(entry.contains("verify"));
  CHECK(entry["verify"]["passed"] == true);
  CHECK(entry["verify"]["assumptions"].size() == 1);

  const auto before = layers(*withoutModel), after = layers(*model);
  REQUIRE(before.size() == 2);
  REQUIRE(after.size() == 2);
  CHECK(entry["layer1"] == after[0]->name());
  CHECK(entry["layer2"] == after[1]->name());
  // The weights are those equalize left; only the biases moved.
  const std::vector<double> w2 = before[1]->input(1)->constantTensor()->toDoubles();
  CHECK(after[1]->input(1)->constantTensor()->toDoubles() == w2);
  std::vector<double> firstExpected = biasOf(*before[0], channels);
  for (std::size_t i = 0; i < channels; ++i) firstExpected[i] -= c[i];
  checkClose(biasOf(*after[0], channels), firstExpected, 1e-5);
  std::vector<double> secondExpected = biasOf(*before[1], outputs);
  for (std::size_t o = 0; o < outputs; ++o)
    for (std::size_t i = 0; i < channels; ++i) secondExpected[o] += alpha * weightAt(w2, o, i) * c[i];
  checkClose(biasOf(*after[1], outputs), secondExpected, 1e-5);
}

const json* failureFor(const Report& report, const std::string& node) {
  for (const auto& entry : report.section("high_bias_not_absorbed"))
    if (entry["node"] == node) return &entry;
  return nullptr;
}

std::string reasonLeft(const std::string& text, const std::vector<std::string>& rules = kRules) {
  auto model = parseModel(text);
  const Report report = applyRules(*model, rules);
  INFO(report.dump());
  CHECK(report.section("high_bias_absorbed").empty());
  const auto found = layers(*model);
  REQUIRE_FALSE(found.empty());
  const json* entry = failureFor(report, found[0]->name());
  REQUIRE(entry);
  CHECK(entry->at("rule") == "absorb-high-bias");
  return entry->at("reason").get<std::string>();
}

}  // namespace

TEST_CASE("absorb-high-bias: Conv -> BN -> Relu -> Conv moves c out of the first bias into the second", "[hba]") {
  // w2 [5, 4, 3, 3]: the shift of output o sums input channel i's 3x3 kernel.
  checkAbsorbed(convPair(), 4, 5,
                [](const std::vector<double>& w2, std::size_t o, std::size_t i) {
                  double sum = 0;
                  for (std::size_t k = 0; k < 9; ++k) sum += w2[(o * 4 + i) * 9 + k];
                  return sum;
                },
                1.0);
}

TEST_CASE("absorb-high-bias: Gemm -> BN -> Relu -> Gemm (alpha 0.5) shifts the second Gemm's C", "[hba]") {
  checkAbsorbed(gemmPair(), 6, 3,
                [](const std::vector<double>& w2, std::size_t o, std::size_t i) { return w2[i * 3 + o]; }, 0.5);
}

TEST_CASE("absorb-high-bias: the statistics used are the BN's gamma and beta divided by the equalize scales",
          "[hba]") {
  bool equalizedOne = false;  // where equalize left a link alone the scales are 1: one pair must really be scaled
  for (const PairModel& pair : {convPair(), gemmPair()}) {
    auto model = parseModel(pair.text);
    const Report report = applyRules(*model, kRules);
    INFO(report.dump());
    equalizedOne = equalizedOne || !report.section("equalized").empty();
    const std::vector<double> s = equalizeScales(report, pair.bn.gamma.size());
    const json& entry = report.section("high_bias_absorbed").at(0);
    std::vector<double> gamma, beta;
    for (std::size_t i = 0; i < s.size(); ++i) {
      gamma.push_back(pair.bn.gamma[i] / s[i]);
      beta.push_back(pair.bn.beta[i] / s[i]);
    }
    checkClose(entry["gamma"].get<std::vector<double>>(), gamma, 1e-6);
    checkClose(entry["beta"].get<std::vector<double>>(), beta, 1e-6);
    auto original = parseModel(pair.text);
    CHECK(entry["bn"] == findNode(original->graph(), "BatchNormalization")->name());
  }
  CHECK(equalizedOne);
}

TEST_CASE("absorb-high-bias: a second run finds no BN statistics and changes nothing", "[hba]") {
  auto model = parseModel(convPair().text);
  applyRules(*model, kRules);
  const std::vector<double> firstBias = biasOf(*layers(*model)[0], 4);
  const Report again = applyRules(*model, kRules);
  INFO(again.dump());
  CHECK(again.section("high_bias_absorbed").empty());
  CHECK(biasOf(*layers(*model)[0], 4) == firstBias);
  const json* entry = failureFor(again, layers(*model)[0]->name());
  REQUIRE(entry);
  CHECK(entry->at("reason") == "no-bn-statistics");
}

TEST_CASE("absorb-high-bias: a zero-padding second layer is left alone", "[hba]") {
  CHECK(reasonLeft(convPair("<pads = [1,1,1,1]>").text) == "layer-pads-input");
  CHECK(reasonLeft(convPair("<auto_pad = \"SAME_UPPER\">").text) == "layer-pads-input");
}

TEST_CASE("absorb-high-bias: no Relu between the layers (none, or LeakyRelu) is left alone", "[hba]") {
  CHECK(reasonLeft(convPair("", "LeakyRelu").text) == "activation-not-relu");
  std::string direct = convPair().text;
  direct.replace(direct.find("  a = Relu (n)\n"), std::string("  a = Relu (n)\n").size(), "");
  direct.replace(direct.find("(a, w2)"), 7, "(n, w2)");
  CHECK(reasonLeft(direct) == "activation-not-relu");
}

TEST_CASE("absorb-high-bias: a layer without folded BN statistics is left alone", "[hba]") {
  SECTION("no BatchNormalization at all") {
    std::string text = convPair().text;
    text.replace(text.find("  n = BatchNormalization (c, s, b, m, v)\n"),
                 std::string("  n = BatchNormalization (c, s, b, m, v)\n").size(), "");
    text.replace(text.find("Relu (n)"), 8, "Relu (c)");
    CHECK(reasonLeft(text) == "no-bn-statistics");
  }
  SECTION("a later rewrite changed the layer's output (a Mul folded after the BN): the statistics are stale") {
    std::string text = convPair().text;
    text.replace(text.find("  a = Relu (n)\n"), std::string("  a = Relu (n)\n").size(),
                 "  h = Mul (n, half)\n  a = Relu (h)\n");
    text.replace(text.find("<float[4,3,3,3]"), 1, "<float[4,1,1] half = {0.5, 0.5, 0.5, 0.5}, ");
    CHECK(reasonLeft(text, {"bn-fold", "scale-fold", "equalize", "absorb-high-bias"}) == "no-bn-statistics");
  }
}

TEST_CASE("absorb-high-bias: --verify compares above the assumed bound and catches a wrong bias", "[hba][verify]") {
  auto model = parseModel(convPair().text);
  DriverOptions options;
  options.rules = kRules;
  options.verify = true;
  Report report;
  bool broken = false;
  // Breaks the absorb-high-bias rewrite only: the second layer's new bias off by 1 in one channel.
  auto hook = [&](Rewriter& rewriter, const std::vector<Node*>& nodes) {
    if (broken || nodes.size() != 3 || nodes[1]->opType() != "Relu") return;
    const Node* second = nodes[2];
    const Tensor* bias = second->input(2)->constantTensor();
    std::vector<double> values = bias->toDoubles();
    values[1] += 1.0;
    const Value* wrong = rewriter.addInitializer(
        *second->graph(), Tensor::fromDoubles("", bias->dataType(), bias->dims(), values), "broken_bias");
    rewriter.setInput(second, 2, wrong);
    broken = true;
  };
  runRulesInjectingFaults(*model, options, hook, report);
  INFO(report.dump());
  REQUIRE(broken);
  const json& entry = report.section("high_bias_absorbed").at(0);
  CHECK(entry["verify"]["passed"] == false);
  CHECK(entry["verify"]["assumptions"].at(0)["statement"] == entry["assumption"]);
  CHECK(failedVerifications(report).size() == 1);
}

TEST_CASE("absorb-high-bias: --absorb-high-bias without --equalize is a usage error", "[hba][cli]") {
  TempDir dir;
  auto model = parseModel(convPair().text);
  saveModel(*model, dir.file("m.onnx"));
  const std::string before = readFile(dir.file("m.onnx"));
  std::string out, err;
  CHECK(runCommand(cli("fold " + dir.file("m.onnx") + " -o " + dir.file("o.onnx") + " --absorb-high-bias"), &out,
                   &err) == 2);
  CHECK(err.find("--absorb-high-bias needs --equalize") != std::string::npos);
  CHECK(runCommand(cli("fold " + dir.file("m.onnx") + " -o " + dir.file("o.onnx") + " --rules +absorb-high-bias"),
                   &out, &err) == 2);
  CHECK(err.find("absorb-high-bias needs equalize") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dir.file("o.onnx")));
  CHECK(readFile(dir.file("m.onnx")) == before);
  // With --equalize it runs and writes the model.
  CHECK(runCommand(cli("fold " + dir.file("m.onnx") + " -o " + dir.file("o.onnx") +
                       " --equalize --absorb-high-bias --verify --report " + dir.file("r.json")),
                   &out, &err) == 0);
  const json report = json::parse(readFile(dir.file("r.json")));
  CHECK(report.at("high_bias_absorbed").size() == 1);
}
