// What folding costs int8 weights (bnfold/check/weight_quant.h): the figures of info --weights, checked against
// an independent computation from the stated weights, and the layers equalize leaves off, with their reasons.

#include <catch2/catch.hpp>

#include <cmath>
#include <sstream>
#include <vector>

#include "bnfold/api/api.h"
#include "bnfold/check/findings.h"
#include "bnfold/check/weight_quant.h"
#include "kernels/weight_quant_stats.h"
#include "test_support.h"

namespace {

using bnfold::LayerWeightQuant;

constexpr int kChannels = 16;

std::string listText(const std::vector<double>& values) {
  std::ostringstream text;
  text.precision(9);
  for (std::size_t i = 0; i < values.size(); ++i) text << (i ? ", " : "") << values[i];
  return text.str();
}

// Two weights per output channel, different in every channel, none on an int8 grid point by construction.
std::vector<double> plainWeights(int channels) {
  std::vector<double> weights;
  for (int c = 0; c < channels; ++c) {
    weights.push_back(0.61 + 0.023 * c);
    weights.push_back(-0.37 + 0.011 * c);
  }
  return weights;
}

// Symmetric int8 with one step for `weights[first, first + count)`, step = max|w| / 127: ||W - Q(W)||^2.
double int8Noise(const std::vector<double>& weights, std::size_t first, std::size_t count, double step) {
  double noise = 0;
  for (std::size_t i = first; i < first + count; ++i) {
    const double q = std::round(weights[i] / step) * step;
    noise += (weights[i] - q) * (weights[i] - q);
  }
  return noise;
}

// The two SQNRs of a [channels, 2, 1, 1] Conv weight, computed here apart from the library.
struct ExpectedSqnr {
  double perTensor, perChannel;
};
ExpectedSqnr expectedSqnr(const std::vector<double>& weights) {
  double largest = 0, energy = 0;
  for (double w : weights) {
    largest = std::max(largest, std::abs(w));
    energy += w * w;
  }
  double channelNoise = 0;
  for (std::size_t first = 0; first < weights.size(); first += 2) {
    const double range = std::max(std::abs(weights[first]), std::abs(weights[first + 1]));
    channelNoise += int8Noise(weights, first, 2, range / 127);
  }
  return {10 * std::log10(energy / int8Noise(weights, 0, weights.size(), largest / 127)),
          10 * std::log10(energy / channelNoise)};
}

// Conv (kChannels outputs) -> BN whose gamma is 100 on channel 0 and 1 elsewhere -> `activation` -> Conv with
// 4 outputs. `firstColumnScale` scales the second Conv's weights reading channel 0.
std::string twoLayerModel(const std::string& activation, double firstColumnScale) {
  std::vector<double> gamma(kChannels, 1.0), w2;
  gamma[0] = 100;
  for (int o = 0; o < 4; ++o)
    for (int i = 0; i < kChannels; ++i)
      w2.push_back((0.5 + 0.03 * ((o * 7 + i * 3) % 11)) * (i == 0 ? firstColumnScale : 1));
  const std::string c = std::to_string(kChannels);
  return "<ir_version: 8, opset_import: [\"\" : 14]>\n"
         "m (float[1,2,4,4] x) => (float[1,4,4,4] y)\n"
         "<float[" + c + ",2,1,1] w1 = {" + listText(plainWeights(kChannels)) + "}, float[" + c + "] s = {" +
         listText(gamma) + "}, float[" + c + "] b = {" + listText(std::vector<double>(kChannels, 0.1)) +
         "}, float[" + c + "] m = {" + listText(std::vector<double>(kChannels, 0.0)) + "}, float[" + c + "] v = {" +
         listText(std::vector<double>(kChannels, 1.0)) + "}, float[4," + c + ",1,1] w2 = {" + listText(w2) + "}>\n"
         "{\n"
         "  c1 = Conv <kernel_shape = [1, 1]> (x, w1)\n"
         "  n1 = BatchNormalization (c1, s, b, m, v)\n"
         "  a1 = " + activation + "(n1)\n"
         "  y = Conv <kernel_shape = [1, 1]> (a1, w2)\n"
         "}\n";
}

const bnfold::LayerWeightQuantStates& row(const bnfold::WeightQuantSummary& summary, const std::string& node) {
  for (const auto& layer : summary.layers)
    if (layer.node == node) return layer;
  FAIL("no row for " << node);
  throw;
}

bnfold::DriverOptions defaultOptions() { return bnfold::driverOptionsFrom(bnfold::RuleSettings{}); }

}  // namespace

TEST_CASE("weight quant: one channel 100x larger puts per-tensor SQNR far below per channel", "[weight-quant]") {
  std::vector<double> weights = plainWeights(kChannels);
  weights[0] *= 100;
  weights[1] *= 100;
  const ExpectedSqnr expected = expectedSqnr(weights);
  REQUIRE(expected.perChannel - expected.perTensor > 10);

  const bnfold::kernels::WeightLayout conv;
  const auto stats = bnfold::kernels::weightQuantStats(conv, weights, {kChannels, 2, 1, 1});
  CHECK(stats.channels == kChannels);
  CHECK(stats.deadChannels == 0);
  CHECK(stats.perTensorSqnrDb == Approx(expected.perTensor).epsilon(1e-9));
  CHECK(stats.perChannelSqnrDb == Approx(expected.perChannel).epsilon(1e-9));
  CHECK(stats.gapDb() == Approx(expected.perChannel - expected.perTensor).epsilon(1e-9));
  const double smallest = std::max(std::abs(weights[2]), std::abs(weights[3]));
  CHECK(stats.rangeSpread == Approx(weights[0] / smallest));

  // The same weights stated in ONNX text, measured on the loaded model.
  const std::string c = std::to_string(kChannels);
  auto model = bnfold::test::parseModel("<ir_version: 8, opset_import: [\"\" : 13]>\n"
                                        "m (float[1,2,4,4] x) => (float[1," + c + ",4,4] y)\n"
                                        "<float[" + c + ",2,1,1] w = {" + listText(weights) + "}>\n"
                                        "{\n  y = Conv <kernel_shape = [1, 1]> (x, w)\n}\n");
  const auto layers = bnfold::layerWeightQuant(*model, {});
  REQUIRE(layers.size() == 1);
  CHECK(layers[0].node == "Conv_0");
  CHECK(layers[0].op == "Conv");
  CHECK(layers[0].channels == kChannels);
  // The stated weights are floats: compare with a tolerance that rounding to float leaves room for.
  CHECK(layers[0].perTensorSqnrDb == Approx(expected.perTensor).epsilon(1e-3));
  CHECK(layers[0].perChannelSqnrDb == Approx(expected.perChannel).epsilon(1e-3));
}

TEST_CASE("weight quant: dead channels are counted apart from the spread, exact weights have infinite SQNR",
          "[weight-quant]") {
  const bnfold::kernels::WeightLayout conv;
  // Channel 1 is all zeros; each live channel's largest weight is on its own grid, the others are not.
  const std::vector<double> weights = {2.0, 0.5, 0.0, 0.0, 8.0, -3.0};
  const auto stats = bnfold::kernels::weightQuantStats(conv, weights, {3, 2, 1, 1});
  CHECK(stats.deadChannels == 1);
  CHECK(stats.rangeSpread == Approx(4.0));
  CHECK(std::isfinite(stats.perTensorSqnrDb));

  // One weight per channel: per channel, every weight is its channel's largest, and quantizes exactly.
  const auto exact = bnfold::kernels::weightQuantStats(conv, {2.0, -0.3}, {2, 1, 1, 1});
  CHECK(std::isinf(exact.perChannelSqnrDb));
  CHECK(std::isfinite(exact.perTensorSqnrDb));
  CHECK(std::isinf(exact.gapDb()));
  const auto zeros = bnfold::kernels::weightQuantStats(conv, {0.0, 0.0}, {2, 1, 1, 1});
  CHECK(zeros.deadChannels == 2);
  CHECK(zeros.rangeSpread == 0);
  CHECK(zeros.gapDb() == 0);
  CHECK(bnfold::formatDecibels(exact.perChannelSqnrDb) == "inf");
  CHECK(bnfold::formatDecibels(12.345) == "12.3");
}

TEST_CASE("weight quant: a layer behind a HardSwish is left off with reason non-homogeneous-activation",
          "[weight-quant]") {
  auto model = bnfold::test::parseModel((twoLayerModel("HardSwish", 1.0)));
  const auto summary = bnfold::summarizeWeightQuant(*model, defaultOptions());
  const auto& conv1 = row(summary, "Conv_0");
  REQUIRE(conv1.loaded);
  REQUIRE(conv1.folded);
  REQUIRE(conv1.equalized);
  CHECK(conv1.loaded->gapDb < bnfold::kWeightQuantGapLimitDb);
  // Folding moved gamma's 100x into channel 0 of the weight.
  CHECK(conv1.folded->gapDb > bnfold::kWeightQuantGapLimitDb);
  CHECK(conv1.folded->rangeSpread > 50);
  CHECK(conv1.equalized->gapDb == Approx(conv1.folded->gapDb));
  REQUIRE(summary.leftOff.size() == 1);
  CHECK(summary.leftOff[0].node == "Conv_0");
  CHECK(summary.leftOff[0].reason == "non-homogeneous-activation");
  CHECK_THAT(summary.leftOff[0].message, Catch::Contains("HardSwish"));
  CHECK(summary.leftOff[0].gapDb == Approx(conv1.equalized->gapDb));
  // The model ends equalized in memory: the BN is gone.
  CHECK(bnfold::test::countOps(*model, "BatchNormalization") == 0);
}

TEST_CASE("weight quant: a layer that equalization repairs is not left off", "[weight-quant]") {
  // The layers are Conv_0 and Conv_1 (unnamed nodes are named on load). The second Conv reads channel 0 with
  // weights 100x smaller, so the equalizing scale evens the ranges out.
  auto model = bnfold::test::parseModel((twoLayerModel("Relu", 0.01)));
  const auto summary = bnfold::summarizeWeightQuant(*model, defaultOptions());
  const auto& conv1 = row(summary, "Conv_0");
  REQUIRE(conv1.folded);
  REQUIRE(conv1.equalized);
  CHECK(conv1.folded->gapDb > bnfold::kWeightQuantGapLimitDb);
  CHECK(conv1.equalized->gapDb < bnfold::kWeightQuantGapLimitDb);
  CHECK(conv1.folded->gapDb - conv1.equalized->gapDb > 5);
  CHECK(conv1.equalized->rangeSpread < conv1.folded->rangeSpread / 10);
  CHECK(summary.leftOff.empty());
  const auto json = bnfold::weightQuantJson(summary);
  CHECK(json["gap_limit_db"] == bnfold::kWeightQuantGapLimitDb);
  CHECK(json["left_off"].empty());
  REQUIRE(json["layers"].size() == 2);
  CHECK(json["layers"][0]["node"] == "Conv_0");
  CHECK(json["layers"][0]["folded"]["gap_db"].get<double>() == Approx(conv1.folded->gapDb));
}

TEST_CASE("weight quant: a MatMul that folding turns into a Gemm keeps one row", "[weight-quant]") {
  // MatMul -> BN on a 2-D input: bn-fold writes a Gemm with a new name (mm_gemm) in place of the MatMul.
  const std::string c = std::to_string(kChannels);
  std::vector<double> gamma(kChannels, 1.0), weight;
  gamma[0] = 100;
  for (int i = 0; i < 2; ++i)
    for (int o = 0; o < kChannels; ++o) weight.push_back(0.3 + 0.01 * ((o * 5 + i * 3) % 13));
  auto model = bnfold::test::parseModel(
      "<ir_version: 8, opset_import: [\"\" : 14]>\n"
      "m (float[3,2] x) => (float[3," + c + "] y)\n"
      "<float[2," + c + "] w = {" + listText(weight) + "}, float[" + c + "] s = {" + listText(gamma) + "}, float[" + c +
      "] b = {" + listText(std::vector<double>(kChannels, 0.1)) + "}, float[" + c + "] m = {" +
      listText(std::vector<double>(kChannels, 0.0)) + "}, float[" + c + "] v = {" +
      listText(std::vector<double>(kChannels, 1.0)) + "}>\n"
      "{\n"
      "  h = MatMul (x, w)\n"
      "  y = BatchNormalization (h, s, b, m, v)\n"
      "}\n");
  const std::string matMul = model->graph().nodes().front()->name();
  const auto summary = bnfold::summarizeWeightQuant(*model, defaultOptions());
  REQUIRE(summary.layers.size() == 1);
  const auto& layer = summary.layers.front();
  CHECK(layer.node == matMul);
  CHECK(layer.op == "Gemm");
  REQUIRE(layer.loaded);
  REQUIRE(layer.folded);
  CHECK(layer.loaded->op == "MatMul");
  CHECK(layer.folded->op == "Gemm");
  CHECK(layer.folded->node != matMul);
  // gamma 100 on channel 0 is folded into the weight: the per-tensor step now starves the other channels.
  CHECK(layer.folded->gapDb > layer.loaded->gapDb + 10);
}

TEST_CASE("weight quant: a layer read by a pool is left off with equalize's reason for it", "[weight-quant]") {
  std::string text = twoLayerModel("Relu", 1.0);
  // The first Conv's BN output goes to a pool equalize does not look through (GlobalLpPool): there is no second layer to equalize with, and equalize says so
  // quietly (no not_equalized entry); its match gives the reason.
  text.replace(text.find("a1 = Relu(n1)"), 13, "a1 = GlobalLpPool(n1)");
  text.replace(text.find("float[1,4,4,4] y"), 16, "float[1,4,1,1] y");
  auto model = bnfold::test::parseModel(text);
  const auto summary = bnfold::summarizeWeightQuant(*model, defaultOptions());
  REQUIRE(summary.leftOff.size() == 1);
  CHECK(summary.leftOff[0].node == "Conv_0");
  CHECK(summary.leftOff[0].reason == "reader-not-layer");
  CHECK_THAT(summary.leftOff[0].message, Catch::Contains("GlobalLpPool"));
}

TEST_CASE("weight quant: the last layer of a chain with nothing after it is left off with no-link",
          "[weight-quant]") {
  // Conv_0 -> Relu -> Conv_1 -> BN (gamma 100 on channel 0) -> GlobalAveragePool: Conv_1 is equalized with
  // Conv_0 on its input channels, and nothing after it can take its output channels' scales.
  // Each output channel of Conv_1 reads two input channels, with plainWeights' two values.
  std::vector<double> gamma(kChannels, 1.0), w1(kChannels * kChannels, 0.0);
  gamma[0] = 100;
  const std::vector<double> pairs = plainWeights(kChannels);
  for (int o = 0; o < kChannels; ++o) {
    w1[o * kChannels + o] = pairs[2 * o];
    w1[o * kChannels + (o + 1) % kChannels] = pairs[2 * o + 1];
  }
  const std::string c = std::to_string(kChannels);
  auto model = bnfold::test::parseModel(
      "<ir_version: 8, opset_import: [\"\" : 14]>\n"
      "m (float[1,2,4,4] x) => (float[1," + c + ",1,1] y)\n"
      "<float[" + c + ",2,1,1] w0 = {" + listText(plainWeights(kChannels)) + "}, float[" + c + "," + c +
      ",1,1] w1 = {" + listText(w1) + "}, float[" + c + "] s = {" + listText(gamma) + "}, float[" + c + "] b = {" +
      listText(std::vector<double>(kChannels, 0.1)) + "}, float[" + c + "] m = {" +
      listText(std::vector<double>(kChannels, 0.0)) + "}, float[" + c + "] v = {" +
      listText(std::vector<double>(kChannels, 1.0)) + "}>\n"
      "{\n"
      "  c0 = Conv <kernel_shape = [1, 1]> (x, w0)\n"
      "  a0 = Relu(c0)\n"
      "  c1 = Conv <kernel_shape = [1, 1]> (a0, w1)\n"
      "  n1 = BatchNormalization (c1, s, b, m, v)\n"
      "  y = GlobalAveragePool(n1)\n"
      "}\n");
  const auto summary = bnfold::summarizeWeightQuant(*model, defaultOptions());
  REQUIRE(row(summary, "Conv_1").folded);
  CHECK(row(summary, "Conv_1").folded->gapDb > bnfold::kWeightQuantGapLimitDb);
  bool conv1Listed = false;
  for (const auto& layer : summary.leftOff) {
    INFO(layer.node << ": " << layer.reason << ": " << layer.message);
    if (layer.node == "Conv_1") {
      conv1Listed = true;
      CHECK(layer.reason == bnfold::kLeftOffNoLink);
      CHECK_THAT(layer.message, Catch::Contains("'GlobalAveragePool_0' (GlobalAveragePool)"));
    } else {
      // Equalizing the link moves range into Conv_0's output channels; if that leaves it off, it says so.
      CHECK(layer.node == "Conv_0");
      CHECK(layer.reason == bnfold::kLeftOffEqualizedStillOff);
      CHECK_THAT(layer.message, Catch::Contains("equalized with 'Conv_1'"));
    }
  }
  CHECK(conv1Listed);
}

TEST_CASE("weight quant: --rules and --keep steer the in-memory fold", "[weight-quant]") {
  bnfold::RuleSettings keep;
  keep.keepNodes = {"Conv_0"};
  auto kept = bnfold::test::parseModel((twoLayerModel("HardSwish", 1.0)));
  const auto keptSummary = bnfold::summarizeWeightQuant(*kept, bnfold::driverOptionsFrom(keep));
  // The BN is not folded into a kept layer, so its weight keeps its spread.
  CHECK(row(keptSummary, "Conv_0").folded->gapDb < bnfold::kWeightQuantGapLimitDb);
  CHECK(keptSummary.leftOff.empty());

  bnfold::RuleSettings none;
  none.rules = "none";
  auto unfolded = bnfold::test::parseModel((twoLayerModel("HardSwish", 1.0)));
  const auto noneSummary = bnfold::summarizeWeightQuant(*unfolded, bnfold::driverOptionsFrom(none));
  CHECK(row(noneSummary, "Conv_0").folded->gapDb == Approx(row(noneSummary, "Conv_0").loaded->gapDb));
  CHECK(bnfold::test::countOps(*unfolded, "BatchNormalization") == 1);
}

TEST_CASE("weight quant: check's weight-quant-gap finding comes with equalize and fails only when asked",
          "[weight-quant][findings]") {
  auto findingsFor = [](const std::string& text, bool equalize, const std::string& failOn) {
    auto model = bnfold::test::parseModel(text);
    bnfold::RuleSettings settings;
    settings.equalize = equalize;
    const bnfold::DriverOptions options = bnfold::driverOptionsFrom(settings);
    bnfold::Report report;
    bnfold::foldModel(*model, options, report);
    std::vector<bnfold::Finding> gaps;
    for (auto& finding : bnfold::findingsOf(*model, report, bnfold::parseFailOn(failOn), options.ruleOptions))
      if (finding.category == "weight-quant-gap") gaps.push_back(finding);
    return gaps;
  };
  const std::string hardSwish = (twoLayerModel("HardSwish", 1.0));
  CHECK(findingsFor(hardSwish, false, "all").empty());
  const auto warned = findingsFor(hardSwish, true, bnfold::kDefaultFailOn);
  REQUIRE(warned.size() == 1);
  CHECK(warned[0].node == "Conv_0");
  CHECK(warned[0].reason == "non-homogeneous-activation");
  CHECK(warned[0].severity == bnfold::Severity::Warning);
  CHECK(warned[0].entry["gap_db"].get<double>() > bnfold::kWeightQuantGapLimitDb);
  const auto failing = findingsFor(hardSwish, true, "weight-quant-gap");
  REQUIRE(failing.size() == 1);
  CHECK(failing[0].severity == bnfold::Severity::Error);
  CHECK(findingsFor((twoLayerModel("Relu", 0.01)), true, "all").empty());
}

namespace {

std::string writeModel(const bnfold::test::TempDir& dir, const std::string& name, const std::string& text) {
  std::string bytes;
  REQUIRE(bnfold::test::parseModelProto(text).SerializeToString(&bytes));
  bnfold::test::writeFile(dir.file(name), bytes);
  return dir.file(name);
}

}  // namespace

TEST_CASE("info --weights prints the three states, the layers left off and the hint", "[weight-quant][cli]") {
  using bnfold::test::cli;
  using bnfold::test::runCommand;
  const bnfold::test::TempDir dir;
  const std::string hardSwish = writeModel(dir, "hs.onnx", (twoLayerModel("HardSwish", 1.0)));
  const std::string before = bnfold::test::readFile(hardSwish);
  std::string out, err;
  REQUIRE(runCommand(cli("info --weights " + hardSwish), &out, &err) == 0);
  CHECK(err.empty());
  CHECK_THAT(out, Catch::Contains("as loaded") && Catch::Contains("after fold") &&
                      Catch::Contains("after fold --equalize"));
  const auto outLines = bnfold::test::lines(out);
  auto lineStarting = [&](const std::string& start) {
    for (const auto& line : outLines)
      if (line.rfind(start, 0) == 0) return line;
    return std::string();
  };
  // The row: name, op, channels, then per state the spread and the SQNRs, as the library measured them.
  auto model = bnfold::test::parseModel((twoLayerModel("HardSwish", 1.0)));
  const auto summary = bnfold::summarizeWeightQuant(*model, defaultOptions());
  const auto& conv1 = row(summary, "Conv_0");
  const std::string conv1Line = lineStarting("    Conv_0 ");
  CHECK_THAT(conv1Line, Catch::Contains(" Conv ") && Catch::Contains(" 16 ") &&
                            Catch::Contains(bnfold::formatDecibels(conv1.loaded->perTensorSqnrDb) + "/" +
                                            bnfold::formatDecibels(conv1.loaded->perChannelSqnrDb)) &&
                            Catch::Contains(bnfold::formatDecibels(conv1.folded->gapDb)));
  CHECK_THAT(out, Catch::Contains("1 layer stays more than 10.0 dB below per channel after fold --equalize"));
  CHECK_THAT(lineStarting("    Conv_0 (Conv)"), Catch::Contains("non-homogeneous-activation: "));
  CHECK_THAT(out, Catch::Contains("hint: quantize these layers' weights per channel") && Catch::Contains("--keep"));
  CHECK(bnfold::test::readFile(hardSwish) == before);  // the fold happens in memory only

  REQUIRE(runCommand(cli("info --weights --json " + hardSwish), &out, &err) == 0);
  const auto json = nlohmann::json::parse(out);
  CHECK(json["nodes"] == 4);  // the model as loaded, described before the in-memory fold
  REQUIRE(json["weights"]["left_off"].size() == 1);
  CHECK(json["weights"]["left_off"][0]["reason"] == "non-homogeneous-activation");

  const std::string relu = writeModel(dir, "relu.onnx", (twoLayerModel("Relu", 0.01)));
  REQUIRE(runCommand(cli("info --weights " + relu), &out, &err) == 0);
  CHECK_THAT(out, Catch::Contains("no layer stays more than 10.0 dB below per channel after fold --equalize"));
  REQUIRE(runCommand(cli("info " + relu), &out, &err) == 0);
  CHECK_THAT(out, !Catch::Contains("as loaded"));
}

TEST_CASE("info: rule options need --weights, --verify is refused, a bad model exits 2", "[weight-quant][cli]") {
  using bnfold::test::cli;
  using bnfold::test::runCommand;
  const bnfold::test::TempDir dir;
  const std::string model = writeModel(dir, "hs.onnx", (twoLayerModel("HardSwish", 1.0)));
  std::string out, err;
  CHECK(runCommand(cli("info --keep Conv_0 " + model), &out, &err) == 2);
  CHECK_THAT(err, Catch::Contains("only with --weights"));
  CHECK(runCommand(cli("info --weights --verify " + model), &out, &err) == 2);
  CHECK_THAT(err, Catch::Contains("does not verify"));
  CHECK(runCommand(cli("info --weights --rules nosuchrule " + model), &out, &err) == 2);
  bnfold::test::writeFile(dir.file("broken.onnx"), "not a model");
  CHECK(runCommand(cli("info --weights " + dir.file("broken.onnx")), &out, &err) == 2);
  CHECK(bnfold::test::lines(err).size() == 1);
  // --keep reaches the fold: the kept layer is not folded into, so nothing is left off.
  REQUIRE(runCommand(cli("info --weights --keep Conv_0 " + model), &out, &err) == 0);
  CHECK_THAT(out, Catch::Contains("no layer stays more than"));
}

TEST_CASE("check --equalize: weight-quant-gap findings and their exit codes", "[weight-quant][cli]") {
  using bnfold::test::cli;
  using bnfold::test::runCommand;
  const bnfold::test::TempDir dir;
  const std::string model = writeModel(dir, "hs.onnx", (twoLayerModel("HardSwish", 1.0)));
  std::string out, err;
  // Off without equalize.
  CHECK(runCommand(cli("check --fail-on weight-quant-gap " + model), &out, &err) == 0);
  CHECK_THAT(out, !Catch::Contains("weight-quant-gap "));
  // A warning unless asked to fail.
  CHECK(runCommand(cli("check --equalize --fail-on none " + model), &out, &err) == 0);
  CHECK_THAT(out, Catch::Contains("warning  weight-quant-gap") && Catch::Contains("'Conv_0'") &&
                      Catch::Contains("non-homogeneous-activation"));
  CHECK(runCommand(cli("check --equalize --fail-on weight-quant-gap --format ndjson " + model), &out, &err) == 1);
  bool found = false;
  for (const auto& line : bnfold::test::lines(out)) {
    const auto finding = nlohmann::json::parse(line);
    if (finding["category"] != "weight-quant-gap") continue;
    found = true;
    CHECK(finding["severity"] == "error");
    CHECK(finding["node"] == "Conv_0");
    CHECK(finding["reason"] == "non-homogeneous-activation");
  }
  CHECK(found);
  const std::string repaired = writeModel(dir, "relu.onnx", (twoLayerModel("Relu", 0.01)));
  CHECK(runCommand(cli("check --equalize --fail-on weight-quant-gap " + repaired), &out, &err) == 0);
}
