// --verify (issue 15): every rewrite's original and rewritten nodes evaluated on seeded random inputs and compared.
// A verifier that passes everything is worthless, so each rule is run twice on the same model: as it is (the
// rewrite must pass) and with a fault injected right after the rewrite (check/fold_testing.h): the rewrite must
// fail, with an error above the tolerance, a verify-failed finding naming it, and 1 failure in the summary. Then the report's "verify" object field by field, the shapes it picks, the data types and their
// tolerances, and the CLI.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../rules/test_bn_fold_support.h"
#include "bnfold/io/model_io.h"
#include "bnfold/check/findings.h"
#include "bnfold/check/fold.h"
#include "bnfold/rewrite/rewriter.h"
#include "check/fold_testing.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;
using nlohmann::json;

namespace {

// ---- models ----

std::string floats(const std::string& name, const std::vector<int64_t>& dims, double seed) {
  return tensorText("float", name, dims, asFloats(sampleValues(product(dims, 0), seed)));
}

std::string bnNode(const BnParams& p, const std::string& input, const std::string& output) {
  char epsilon[40];
  std::snprintf(epsilon, sizeof epsilon, "%.9g", p.epsilon);
  return "  " + output + " = BatchNormalization <epsilon = " + epsilon + "> (" + input + ", s, b, m, v)\n";
}

// Conv (3x3, pads 1, no bias) + BN on `xType` x: what bn-fold rewrites.
std::string convBnText(const std::string& xType, const std::string& yType, const std::string& convAttributes =
                                                                                "pads = [1,1,1,1]") {
  const BnParams p = makeBnParams(4, 1.0);
  return R"(<ir_version: 8, opset_import: ["" : 13]>
g ()" + xType + " x) => (" + yType + R"( y)
<)" + floats("w", {4, 3, 3, 3}, 2.0) + ", " + bnInitializers(p) + R"(>
{
  c = Conv <)" + convAttributes + R"(> (x, w)
)" + bnNode(p, "c", "y") + "}\n";
}

const std::string kConvBn = convBnText("float[1,3,4,4]", "float[1,4,4,4]");

// BN before an unpadded Conv: bn-forward.
std::string bnConvText() {
  const BnParams p = makeBnParams(3, 3.0);
  return R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,3,6,6] x) => (float[1,4,4,4] y)
<)" + bnInitializers(p) + ", " + floats("w", {4, 3, 3, 3}, 4.0) + R"(>
{
)" + bnNode(p, "x", "n") + R"(  y = Conv (n, w)
}
)";
}

// LayerNorm before the Q and K projections of a [B, T, D] input: norm-affine-forward.
std::string layerNormMatMulsText() {
  return R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,4] x) => (float[2,3,5] q, float[2,3,5] k)
<)" + floats("wq", {4, 5}, 6.0) + ", " + floats("wk", {4, 5}, 7.0) +
         R"(, float[4] gamma = {1.5, -0.5, 0.75, 2}, float[4] beta = {0.25, -1, 0.5, 0.125}>
{
  n = LayerNormalization (x, gamma, beta)
  q = MatMul (n, wq)
  k = MatMul (n, wk)
}
)";
}

// Conv then a per-channel constant Add: bias-add.
std::string convAddText() {
  return R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,4,4,4] y)
<)" + floats("w", {4, 3, 3, 3}, 5.0) + R"(, float[4] cb = {0.25, -0.5, 0.75, -1}, float[4,1,1] k = {1.5, -0.25, 0.5, 2}>
{
  c = Conv <pads = [1,1,1,1]> (x, w, cb)
  y = Add (c, k)
}
)";
}

// Conv then a per-channel constant Mul: scale-fold.
std::string convMulText() {
  return R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,4,4,4] y)
<)" + floats("w", {4, 3, 3, 3}, 6.0) + R"(, float[4] cb = {0.25, -0.5, 0.75, -1}, float[1,4,1,1] k = {1.5, -0.75, 0.5, 2}>
{
  c = Conv <pads = [1,1,1,1]> (x, w, cb)
  y = Mul (c, k)
}
)";
}

// BN on a graph input (no layer to fold into): bn-decompose.
std::string bnOnInputText() {
  const BnParams p = makeBnParams(3, 7.0);
  return R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,3,4,4] y)
<)" + bnInitializers(p) + R"(>
{
)" + bnNode(p, "x", "y") + "}\n";
}

// Training-mode BN after a Conv, Y and the running statistics read: train-bn-expand and train-bn-freeze.
std::string trainingBnText() {
  const BnParams p = makeBnParams(3, 8.0);
  return R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[2,3,4,5] x) => (float[2,3,4,5] y, float[3] running_mean, float[3] running_var)
<)" + floats("w", {3, 3, 1, 1}, 9.0) + ", " + bnInitializers(p) + R"(>
{
  c = Conv (x, w)
  y, running_mean, running_var = BatchNormalization <epsilon = 0.001, momentum = 0.875, training_mode = 1> (c, s, b, m, v)
}
)";
}

// ---- faults ----

// Which constant input of the rewritten nodes to break: the first (node, slot) in the hook's node order for
// which `pick` holds.
using Pick = std::function<bool(const Node& node, int slot, const Tensor& tensor)>;
// Changes the values of a copy of that constant (dims given for channel-wise edits).
using Edit = std::function<void(std::vector<double>& values, const std::vector<int64_t>& dims)>;

Pick inputOf(const std::string& opType, int slot) {
  return [=](const Node& node, int s, const Tensor&) { return node.opType() == opType && s == slot; };
}
Pick constantNamed(const std::string& name) {
  return [=](const Node& node, int s, const Tensor&) { return node.input(static_cast<std::size_t>(s))->name() == name; };
}
// The constant of a node of that type with the most elements (a weight rather than an epsilon).
Pick largestConstantOf(const std::string& opType, int64_t atLeast) {
  return [=](const Node& node, int, const Tensor& tensor) {
    return node.opType() == opType && tensor.elementCount() >= atLeast;
  };
}

std::size_t largestElement(const std::vector<double>& values) {
  std::size_t best = 0;
  for (std::size_t i = 1; i < values.size(); ++i)
    if (std::abs(values[i]) > std::abs(values[best])) best = i;
  return best;
}

// The largest-magnitude element changed by `fraction` of its magnitude.
Edit nudgeLargest(double fraction) {
  return [fraction](std::vector<double>& values, const std::vector<int64_t>&) {
    const std::size_t i = largestElement(values);
    values[i] += fraction * std::abs(values[i]);
  };
}
// One element plus a constant.
Edit addTo(std::size_t index, double delta) {
  return [=](std::vector<double>& values, const std::vector<int64_t>&) { values.at(index) += delta; };
}
// Output channels (axis 0) a and b exchanged.
Edit swapChannels(std::size_t a, std::size_t b) {
  return [=](std::vector<double>& values, const std::vector<int64_t>& dims) {
    const std::size_t block = product(dims, 1);
    std::swap_ranges(values.begin() + static_cast<std::ptrdiff_t>(a * block),
                     values.begin() + static_cast<std::ptrdiff_t>((a + 1) * block),
                     values.begin() + static_cast<std::ptrdiff_t>(b * block));
  };
}

struct Fault {
  Pick pick;
  Edit edit;
};

// What the hook did, so a test can require that the fault really went in.
struct FaultLog {
  int calls = 0;
  bool applied = false;
  std::string node;       // the node whose input was replaced
  std::string original;   // the constant it read
  double maxChange = 0;   // largest |new - old| over the elements
};

// Breaks the first rewrite only: the hook is called after every one.
std::function<void(Rewriter&, const std::vector<Node*>&)> injector(const Fault& fault, FaultLog& log) {
  return [fault, &log](Rewriter& rewriter, const std::vector<Node*>& nodes) {
    if (log.calls++ != 0) return;
    for (const Node* node : nodes) {
      for (std::size_t slot = 0; slot < node->inputs().size(); ++slot) {
        const Value* input = node->input(slot);
        const Tensor* tensor = input ? input->constantTensor() : nullptr;
        if (!tensor || !isFloatingPoint(tensor->dataType())) continue;
        if (!fault.pick(*node, static_cast<int>(slot), *tensor)) continue;
        const std::vector<double> before = tensor->toDoubles();
        std::vector<double> values = before;
        fault.edit(values, tensor->dims());
        for (std::size_t i = 0; i < values.size(); ++i) log.maxChange = std::max(log.maxChange, std::abs(values[i] - before[i]));
        Tensor broken = Tensor::fromDoubles(input->name() + "_broken", tensor->dataType(), tensor->dims(), values);
        log.node = node->name();
        log.original = input->name();
        const Value* replacement = rewriter.addInitializer(*node->graph(), std::move(broken), input->name() + "_broken");
        rewriter.setInput(node, static_cast<int>(slot), replacement);
        log.applied = true;
        return;
      }
    }
  };
}

Report run(Model& model, const std::vector<std::string>& rules, const RuleOptions& options = {},
           std::function<void(Rewriter&, const std::vector<Node*>&)> hook = {}, uint64_t seed = 0) {
  DriverOptions driver;
  driver.rules = rules;
  driver.ruleOptions = options;
  driver.verify = true;
  if (seed) driver.verifySeed = seed;
  Report report;
  runRulesInjectingFaults(model, driver, hook, report);
  model.graph().verify();
  return report;
}

// A rule, a model it rewrites once, and where that rewrite is reported.
struct RuleCase {
  std::string rule;
  std::string text;
  std::string section;      // report section of the rewrite
  std::string removedNode;  // the node the finding names
  RuleOptions options;
};

const json& onlyEntry(const Report& report, const std::string& section) {
  const json& entries = report.section(section);
  REQUIRE(entries.size() == 1);
  REQUIRE(entries[0].contains("verify"));
  return entries[0];
}

// The rule's rewrite as it is passes --verify.
void expectPasses(const RuleCase& c) {
  auto model = parseModel(c.text);
  const Report report = run(*model, {c.rule}, c.options);
  INFO(report.dump());
  const json& verify = onlyEntry(report, c.section)["verify"];
  CHECK(verify["passed"] == true);
  CHECK_FALSE(verify.contains("error"));
  CHECK(verify["max_rel_error"].get<double>() <= verify["tolerance"].get<double>());
  CHECK(failedVerifications(report).empty());
  const json& summary = report.json().at("verification");
  CHECK(summary["rewrites"] == 1);
  CHECK(summary["passed"] == 1);
  CHECK(summary["failed"] == 0);
}

// The same rewrite broken by `fault` fails --verify, and says so everywhere it should. Returns the verify object.
json expectCaught(const RuleCase& c, const Fault& fault) {
  auto model = parseModel(c.text);
  FaultLog log;
  const Report report = run(*model, {c.rule}, c.options, injector(fault, log));
  INFO(report.dump());
  REQUIRE(log.applied);  // otherwise this test would prove nothing
  CHECK(log.calls == 1);
  CHECK(log.maxChange > 0);
  const json& entry = onlyEntry(report, c.section);
  const json& verify = entry["verify"];
  CHECK(entry["rule"] == c.rule);
  CHECK(verify["passed"] == false);
  CHECK_FALSE(verify.contains("error"));  // evaluated and found wrong, not "could not evaluate"
  CHECK(verify["data_type"] == "float");
  CHECK(verify["tolerance"].get<double>() == 1e-4);
  CHECK(verify["max_rel_error"].get<double>() > verify["tolerance"].get<double>());
  CHECK(verify["max_abs_error"].get<double>() > 0);
  const std::vector<Finding> failures = failedVerifications(report);
  REQUIRE(failures.size() == 1);
  CHECK(failures[0].category == "verify-failed");
  CHECK(failures[0].severity == Severity::Error);
  CHECK(failures[0].rule == c.rule);
  CHECK(failures[0].node == c.removedNode);
  CHECK_THAT(failures[0].message, Catch::Contains(c.rule) && Catch::Contains("'" + c.removedNode + "'") &&
                                      Catch::Contains("failed verification"));
  const json& summary = report.json().at("verification");
  CHECK(summary["rewrites"] == 1);
  CHECK(summary["passed"] == 0);
  CHECK(summary["failed"] == 1);
  return verify;
}

const RuleCase kBnFold{"bn-fold", kConvBn, "folds", "BatchNormalization_0", {}};

}  // namespace

// ---- 1. injected faults, one rule at a time ----

TEST_CASE("verify: bn-fold with a folded weight or bias made wrong fails", "[verify]") {
  expectPasses(kBnFold);
  SECTION("largest weight element off by 10%") { expectCaught(kBnFold, {inputOf("Conv", 1), nudgeLargest(0.1)}); }
  SECTION("two output channels of the weight swapped") {
    expectCaught(kBnFold, {inputOf("Conv", 1), swapChannels(0, 1)});
  }
  SECTION("one bias element off by 1") { expectCaught(kBnFold, {inputOf("Conv", 2), addTo(2, 1.0)}); }
}

TEST_CASE("verify: a 1% error in one float weight element is caught", "[verify]") {
  // About 1e-2 * |w| on one term of a 27-term dot product: still some 30x the float tolerance of 1e-4.
  const json verify = expectCaught(kBnFold, {inputOf("Conv", 1), nudgeLargest(0.01)});
  CHECK(verify["max_rel_error"].get<double>() > 10 * verify["tolerance"].get<double>());
}

TEST_CASE("verify: bn-forward with a wrong folded weight fails", "[verify]") {
  const RuleCase c{"bn-forward", bnConvText(), "folds", "BatchNormalization_0", {}};
  expectPasses(c);
  expectCaught(c, {inputOf("Conv", 1), nudgeLargest(0.1)});
}

TEST_CASE("verify: norm-affine-forward with a wrong scaled weight or bias fails", "[verify]") {
  const RuleCase c{"norm-affine-forward", layerNormMatMulsText(), "norm_affine_forwarded", "LayerNormalization_0", {}};
  expectPasses(c);
  SECTION("largest element of a scaled weight off by 10%") { expectCaught(c, {inputOf("MatMul", 1), nudgeLargest(0.1)}); }
  SECTION("one element of an added bias off by 1") { expectCaught(c, {inputOf("Add", 1), addTo(1, 1.0)}); }
}

TEST_CASE("verify: bias-add with a wrong new bias fails", "[verify]") {
  const RuleCase c{"bias-add", convAddText(), "bias_absorbed", "Add_0", {}};
  expectPasses(c);
  expectCaught(c, {inputOf("Conv", 2), nudgeLargest(0.1)});
}

TEST_CASE("verify: scale-fold with two output channels of the scaled weight swapped fails", "[verify]") {
  const RuleCase c{"scale-fold", convMulText(), "scale_folded", "Mul_0", {}};
  expectPasses(c);
  expectCaught(c, {inputOf("Conv", 1), swapChannels(1, 3)});
}

TEST_CASE("verify: bn-decompose with a wrong multiplier fails", "[verify]") {
  const RuleCase c{"bn-decompose", bnOnInputText(), "decomposed", "BatchNormalization_0", {}};
  expectPasses(c);
  expectCaught(c, {largestConstantOf("Mul", 3), nudgeLargest(0.1)});
}

TEST_CASE("verify: norm-fuse with a wrong gamma or beta on the LayerNormalization fails", "[verify]") {
  const std::string text = R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,8] x) => (float[2,3,8] y)
<)" + floats("gamma", {8}, 31.0) + ", " + floats("beta", {8}, 32.0) + R"(, float eps = {1e-5}, float two = {2}>
{
  mean = ReduceMean <axes = [-1]> (x)
  d = Sub (x, mean)
  sq = Pow (d, two)
  var = ReduceMean <axes = [-1]> (sq)
  ve = Add (var, eps)
  s = Sqrt (ve)
  n = Div (d, s)
  g = Mul (n, gamma)
  y = Add (g, beta)
}
)";
  const RuleCase c{"norm-fuse", text, "norms_fused", "Div_0", {}};
  expectPasses(c);
  SECTION("gamma") { expectCaught(c, {inputOf("LayerNormalization", 1), nudgeLargest(0.1)}); }
  SECTION("beta") { expectCaught(c, {inputOf("LayerNormalization", 2), addTo(3, 1.0)}); }
}

TEST_CASE("verify: norm-decompose of a LayerNormalization with a wrong scale, bias or epsilon fails", "[verify]") {
  const std::string text = R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,8] x) => (float[2,3,8] y)
<)" + floats("scale", {8}, 33.0) + ", " + floats("bias", {8}, 34.0) + R"(>
{
  y = LayerNormalization <epsilon = 0.001> (x, scale, bias)
}
)";
  const RuleCase c{"norm-decompose", text, "norms_decomposed", "LayerNormalization_0", {}};
  expectPasses(c);
  SECTION("scale") { expectCaught(c, {largestConstantOf("Mul", 8), nudgeLargest(0.1)}); }
  SECTION("bias") { expectCaught(c, {largestConstantOf("Add", 8), addTo(5, 1.0)}); }
  // The emitted epsilon constant: 1 instead of 1e-3 shrinks every output by about sqrt(2).
  SECTION("epsilon") {
    const Pick epsilonOfAdd = [](const Node& node, int, const Tensor& tensor) {
      return node.opType() == "Add" && tensor.elementCount() == 1;
    };
    expectCaught(c, {epsilonOfAdd, addTo(0, 1.0)});
  }
}

TEST_CASE("verify: norm-decompose of a GroupNormalization-18 with a wrong per-group scale fails", "[verify]") {
  const std::string text = R"(<ir_version: 8, opset_import: ["" : 18]>
g (float[2,4,3,3] x) => (float[2,4,3,3] y)
<)" + floats("scale", {2}, 35.0) + ", " + floats("bias", {2}, 36.0) + R"(>
{
  y = GroupNormalization <num_groups = 2> (x, scale, bias)
}
)";
  const RuleCase c{"norm-decompose", text, "norms_decomposed", "GroupNormalization_0", {}};
  expectPasses(c);
  // The per-group scale reaches the grouped view through an Unsqueeze to [G, 1].
  expectCaught(c, {inputOf("Unsqueeze", 0), nudgeLargest(0.1)});
}

TEST_CASE("verify: train-bn-expand with a wrong emitted constant fails", "[verify]") {
  const RuleCase c{"train-bn-expand", trainingBnText(), "expanded", "BatchNormalization_0", {}};
  expectPasses(c);
  SECTION("the per-channel shift added to Y") { expectCaught(c, {largestConstantOf("Add", 3), nudgeLargest(0.1)}); }
  SECTION("the running mean (only the running_mean output reads it)") {
    expectCaught(c, {constantNamed("m"), addTo(0, 1.0)});
  }
}

TEST_CASE("verify: train-bn-freeze with a wrong scale fails", "[verify]") {
  RuleOptions options;
  options.freezeTrainingBatchNorm = true;
  const RuleCase c{"train-bn-freeze", trainingBnText(), "frozen", "BatchNormalization_0", options};
  expectPasses(c);
  expectCaught(c, {inputOf("BatchNormalization", 1), nudgeLargest(0.1)});
}

// Conv -> PRelu (per-channel slope) -> Conv with output channels of the first weight 10^-1 .. 10 apart: equalize.
std::string convPReluConvText() {
  std::vector<double> w1 = sampleValues(4 * 3 * 3 * 3, 30.0);
  for (std::size_t i = 0; i < w1.size(); ++i) w1[i] *= std::pow(10.0, static_cast<double>(i / 27) * 2.0 / 3.0 - 1.0);
  return R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,5,4,4] y)
<)" + tensorText("float", "w1", {4, 3, 3, 3}, asFloats(w1)) + ", " + floats("b1", {4}, 31.0) + ", " +
         floats("slope", {4, 1, 1}, 32.0) + ", " + floats("w2", {5, 4, 3, 3}, 33.0) + R"(>
{
  c1 = Conv <pads = [1,1,1,1]> (x, w1, b1)
  p1 = PRelu (c1, slope)
  y = Conv <pads = [1,1,1,1]> (p1, w2)
}
)";
}

TEST_CASE("verify: equalize with a wrong rescaled weight or bias fails", "[verify]") {
  const RuleCase c{"equalize", convPReluConvText(), "equalized", "Conv_0", {}};
  expectPasses(c);
  SECTION("the first layer's largest weight off by 10%") { expectCaught(c, {inputOf("Conv", 1), nudgeLargest(0.1)}); }
  SECTION("two input channels of the second layer swapped") {
    expectCaught(c, {constantNamed("w2_equalized"), [](std::vector<double>& values, const std::vector<int64_t>&) {
                       // w2 [5, 4, 3, 3]: input channels 0 and 1 of every output row.
                       for (std::size_t row = 0; row < 5; ++row)
                         for (std::size_t k = 0; k < 9; ++k) std::swap(values[row * 36 + k], values[row * 36 + 9 + k]);
                     }});
  }
  SECTION("the first layer's bias off by 1") { expectCaught(c, {inputOf("Conv", 2), addTo(1, 1.0)}); }
}

// ---- 2. what the report says ----

TEST_CASE("verify: a Conv+BN fold's verify object has every documented field", "[verify]") {
  auto model = parseModel(kConvBn);
  const Report report = run(*model, {"bn-fold"});
  INFO(report.dump());
  const json& verify = onlyEntry(report, "folds")["verify"];
  REQUIRE(verify.is_object());
  std::vector<std::string> keys;
  for (const auto& item : verify.items()) keys.push_back(item.key());
  std::sort(keys.begin(), keys.end());
  CHECK(keys == std::vector<std::string>{"data_type", "input_shapes", "max_abs_error", "max_rel_error", "outputs",
                                         "passed", "seed", "tolerance"});
  CHECK(verify["passed"].is_boolean());
  CHECK(verify["passed"] == true);
  REQUIRE(verify["max_abs_error"].is_number());
  REQUIRE(verify["max_rel_error"].is_number());
  // The folded weights are rounded to float, so the two sides differ a little: both were really computed.
  CHECK(verify["max_abs_error"].get<double>() > 0);
  CHECK(verify["max_rel_error"].get<double>() > 0);
  CHECK(verify["max_rel_error"].get<double>() <= 1e-5);
  CHECK(verify["tolerance"].is_number_float());
  CHECK(verify["tolerance"].get<double>() == 1e-4);
  CHECK(verify["data_type"] == "float");
  CHECK(verify["input_shapes"] == json{{"x", {1, 3, 4, 4}}});  // the real shape: it is small
  CHECK(verify["outputs"] == json::array({"y"}));
  CHECK(verify["seed"].is_number_unsigned());

  const json& summary = report.json().at("verification");
  CHECK(summary == json{{"rewrites", 1}, {"passed", 1}, {"failed", 0}, {"seed", DriverOptions{}.verifySeed}});
  // driver.h: "each rewrite adds its number to it"; this is rewrite 1.
  CHECK(verify["seed"].get<uint64_t>() == DriverOptions{}.verifySeed + 1);
}

TEST_CASE("verify: no verify objects or summary without --verify", "[verify]") {
  auto model = parseModel(kConvBn);
  DriverOptions driver;
  driver.rules = {"bn-fold"};
  Report report;
  runRules(*model, driver, report);
  REQUIRE(report.section("folds").size() == 1);
  CHECK_FALSE(report.section("folds")[0].contains("verify"));
  CHECK_FALSE(report.json().contains("verification"));
}

TEST_CASE("verify: large or symbolic inputs get a small stand-in shape", "[verify]") {
  struct Case {
    std::string name, xType, yType, convAttributes;
    std::vector<int64_t> expected;
  };
  // One sample (a layer's samples are independent); each spatial dim is the dilated kernel extent plus one stride.
  const std::vector<Case> cases = {
      {"under the size limit: real shape", "float[1,3,64,64]", "float[1,4,64,64]", "pads = [1,1,1,1]", {1, 3, 64, 64}},
      {"large", "float[1,3,224,224]", "float[1,4,224,224]", "pads = [1,1,1,1]", {1, 3, 4, 4}},
      {"symbolic", "float[N,3,H,W]", "float[N,4,H,W]", "pads = [1,1,1,1]", {1, 3, 4, 4}},
      {"stride 2", "float[N,3,H,W]", "float[N,4,H2,W2]", "strides = [2,2]", {1, 3, 5, 5}},
      {"dilation 2", "float[N,3,H,W]", "float[N,4,H2,W2]", "dilations = [2,2]", {1, 3, 6, 6}},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      auto model = parseModel(convBnText(c.xType, c.yType, c.convAttributes));
      const Report report = run(*model, {"bn-fold"});
      INFO(report.dump());
      const json& verify = onlyEntry(report, "folds")["verify"];
      CHECK(verify["passed"] == true);
      CHECK(verify["input_shapes"] == json{{"x", c.expected}});
    }
  }
}

// Found by the graph fuzzer: attributes that make the stand-in or the real input enormous must fail the rewrite's
// verification with a reason, not allocate (or overflow computing) the size.
TEST_CASE("verify: an input too large to make up fails verification instead of being allocated", "[verify]") {
  auto model = parseModel(
      convBnText("float[1,3,100000,100000]", "float[1,4,100000,100000]", "dilations = [1099511627776, 1099511627776]"));
  const Report report = run(*model, {"bn-fold"});
  const json& verify = onlyEntry(report, "folds")["verify"];
  CHECK(verify["passed"] == false);
  CHECK_THAT(verify.dump(), Catch::Contains("more than the verifier makes up"));
}

TEST_CASE("verify: a ConvTranspose whose pads crop more than its kernel adds gets a stand-in with output left",
          "[verify]") {
  // Kernel 1, stride 1, pads 2 on each side: three input positions would give a negative output size.
  const BnParams p = makeBnParams(4, 1.0);
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[N,3,H,W] x) => (float[N,4,H2,W2] y)
<)" + floats("w", {3, 4, 1, 1}, 2.0) + ", " + bnInitializers(p) + R"(>
{
  c = ConvTranspose <pads = [2,2,2,2]> (x, w)
)" + bnNode(p, "c", "y") + "}\n");
  const Report report = run(*model, {"bn-fold"});
  INFO(report.dump());
  const json& verify = onlyEntry(report, "folds")["verify"];
  CHECK(verify["passed"] == true);
  CHECK(verify["input_shapes"] == json{{"x", {1, 3, 6, 6}}});
}

TEST_CASE("verify: a fault at a kernel corner is caught on the stand-in shape too", "[verify]") {
  // With x [N,3,H,W] the inputs are a made-up [1,3,4,4]: the last weight element (last output channel, last input
  // channel, kernel position (2,2)) must still be read by some output position.
  const RuleCase c{"bn-fold", convBnText("float[N,3,H,W]", "float[N,4,H,W]"), "folds", "BatchNormalization_0", {}};
  expectPasses(c);
  const std::size_t last = 4 * 3 * 3 * 3 - 1;
  const json verify = expectCaught(c, {inputOf("Conv", 1), addTo(last, 0.1)});
  CHECK(verify["input_shapes"] == json{{"x", {1, 3, 4, 4}}});
}

TEST_CASE("verify: the same seed gives the same verdict, and each rewrite records its seed", "[verify]") {
  auto verifyWithSeed = [](uint64_t seed) {
    auto model = parseModel(convBnText("float[N,3,H,W]", "float[N,4,H,W]"));
    const Report report = run(*model, {"bn-fold"}, {}, {}, seed);
    return std::make_pair(onlyEntry(report, "folds")["verify"], report.json().at("verification"));
  };
  const auto first = verifyWithSeed(1234);
  const auto again = verifyWithSeed(1234);
  CHECK(first.first == again.first);
  CHECK(first.second == again.second);
  CHECK(first.second["seed"] == 1234);
  CHECK(first.first["seed"] == 1235);
  const auto other = verifyWithSeed(98765);
  CHECK(other.first["seed"] == 98766);
  CHECK(other.first["passed"] == true);
  CHECK(other.first["input_shapes"] == first.first["input_shapes"]);
}

TEST_CASE("verify: on stand-in shapes every single folded weight element is observed", "[verify]") {
  // The stand-in claims to reach every kernel position: check it element by element. Each weight element in turn
  // is moved by 10% of the weight's largest magnitude; every one of those rewrites must fail.
  struct Case {
    std::string name, text, layer;
  };
  auto layerBn = [](const std::string& inputs, const std::string& outputs, const std::string& weight,
                    const std::string& layer, std::size_t channels) {
    const BnParams p = makeBnParams(channels, 11.0);
    return R"(<ir_version: 8, opset_import: ["" : 13]>
g ()" + inputs + ") => (" + outputs + R"()
<)" + weight + ", " + bnInitializers(p) + R"(>
{
  c = )" + layer + R"(
)" + bnNode(p, "c", "y") + "}\n";
  };
  const std::vector<Case> cases = {
      {"Conv 3x3 pads 1", layerBn("float[N,3,H,W] x", "float[N,4,H,W] y", floats("w", {4, 3, 3, 3}, 12.0),
                                  "Conv <pads = [1,1,1,1]> (x, w)", 4), "Conv"},
      {"Conv stride 2 dilation 2 grouped",
       layerBn("float[N,4,H,W] x", "float[N,4,H2,W2] y", floats("w", {4, 2, 3, 3}, 13.0),
               "Conv <strides = [2,2], dilations = [2,2], group = 2> (x, w)", 4), "Conv"},
      {"ConvTranspose k4 s2 p1", layerBn("float[N,3,H,W] x", "float[N,2,H2,W2] y", floats("w", {3, 2, 4, 4}, 14.0),
                                         "ConvTranspose <strides = [2,2], pads = [1,1,1,1]> (x, w)", 2),
       "ConvTranspose"},
      {"Gemm transB", layerBn("float[N,5] x", "float[N,3] y", floats("w", {3, 5}, 15.0), "Gemm <transB = 1> (x, w)", 3),
       "Gemm"},
      // The fold gives the MatMul a bias, which makes it a Gemm.
      {"MatMul", layerBn("float[N,5] x", "float[N,3] y", floats("w", {5, 3}, 16.0), "MatMul (x, w)", 3), "Gemm"},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      {
        auto model = parseModel(c.text);
        const Report report = run(*model, {"bn-fold"});
        INFO(report.dump());
        REQUIRE(onlyEntry(report, "folds")["verify"]["passed"] == true);
      }
      std::size_t elements = 0, missed = 0;
      for (std::size_t i = 0;; ++i) {
        auto model = parseModel(c.text);
        FaultLog log;
        bool inRange = true;
        const Edit nudge = [&](std::vector<double>& values, const std::vector<int64_t>&) {
          if (i >= values.size()) {
            inRange = false;
            return;
          }
          values[i] += 0.1 * std::abs(values[largestElement(values)]);
        };
        const Report report = run(*model, {"bn-fold"}, {}, injector({inputOf(c.layer, 1), nudge}, log));
        REQUIRE(log.applied);
        if (!inRange) break;
        ++elements;
        if (onlyEntry(report, "folds")["verify"]["passed"] != false) {
          ++missed;
          UNSCOPED_INFO("weight element " << i << " changed, still passed: "
                                          << onlyEntry(report, "folds")["verify"].dump());
        }
      }
      CHECK(elements > 10);
      CHECK(missed == 0);
    }
  }
}

TEST_CASE("verify: a wrong attribute on the rewritten node fails", "[verify]") {
  // The frozen BatchNormalization given another epsilon: the rewrite now computes something else.
  RuleOptions options;
  options.freezeTrainingBatchNorm = true;
  auto model = parseModel(trainingBnText());
  bool applied = false;
  auto hook = [&](Rewriter& rewriter, const std::vector<Node*>& nodes) {
    for (const Node* node : nodes)
      if (node->opType() == "BatchNormalization" && !applied) {
        onnx::AttributeProto epsilon;
        epsilon.set_name("epsilon");
        epsilon.set_type(onnx::AttributeProto::FLOAT);
        epsilon.set_f(0.1f);
        rewriter.setAttribute(node, epsilon);
        applied = true;
      }
  };
  const Report report = run(*model, {"train-bn-freeze"}, options, hook);
  INFO(report.dump());
  REQUIRE(applied);
  const json& verify = onlyEntry(report, "frozen")["verify"];
  CHECK(verify["passed"] == false);
  CHECK(verify["max_rel_error"].get<double>() > verify["tolerance"].get<double>());
  CHECK(failedVerifications(report).size() == 1);
}

// ---- 3. data types ----

TEST_CASE("verify: Conv+BN folds in double, float16 and bfloat16 pass with their own tolerance", "[verify]") {
  // libonnx 1.12's text parser cannot write float16/bfloat16 literals: the model is stated in float and its tensors
  // converted (convertFloatTensors, as the bn-fold data type tests do).
  struct Case {
    int32_t type;
    std::string name;
    double tolerance;
  };
  const std::vector<Case> cases = {{onnx::TensorProto::DOUBLE, "double", 1e-9},
                                   {onnx::TensorProto::FLOAT16, "float16", 1e-2},
                                   {onnx::TensorProto::BFLOAT16, "bfloat16", 5e-2}};
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      auto model = parseModelAs(kConvBn, c.type);
      const Report report = run(*model, {"bn-fold"});
      INFO(report.dump());
      const json& verify = onlyEntry(report, "folds")["verify"];
      CHECK(verify["passed"] == true);
      CHECK(verify["data_type"] == c.name);
      CHECK(verify["tolerance"].get<double>() == c.tolerance);
      CHECK(verify["max_rel_error"].get<double>() <= c.tolerance);
      CHECK(failedVerifications(report).empty());
      CHECK(report.json().at("verification")["failed"] == 0);
    }
  }
}

TEST_CASE("verify: a 1e-5 error in one weight passes in float and fails in double", "[verify]") {
  // The tolerance follows the data type: an error far below float's 1e-4 is far above double's 1e-9.
  const Fault tiny{inputOf("Conv", 1), nudgeLargest(1e-5)};
  SECTION("float") {
    auto model = parseModel(kConvBn);
    FaultLog log;
    const Report report = run(*model, {"bn-fold"}, {}, injector(tiny, log));
    REQUIRE(log.applied);
    const json& verify = onlyEntry(report, "folds")["verify"];
    CHECK(verify["passed"] == true);
    CHECK(verify["max_rel_error"].get<double>() > 1e-9);
  }
  SECTION("double") {
    auto model = parseModelAs(kConvBn, onnx::TensorProto::DOUBLE);
    FaultLog log;
    const Report report = run(*model, {"bn-fold"}, {}, injector(tiny, log));
    REQUIRE(log.applied);
    const json& verify = onlyEntry(report, "folds")["verify"];
    CHECK(verify["passed"] == false);
    CHECK(verify["data_type"] == "double");
    CHECK(verify["max_rel_error"].get<double>() > 1e-9);
    CHECK(failedVerifications(report).size() == 1);
  }
}

TEST_CASE("verify: swapped output channels are caught in float16", "[verify]") {
  auto clean = parseModelAs(kConvBn, onnx::TensorProto::FLOAT16);
  CHECK(onlyEntry(run(*clean, {"bn-fold"}), "folds")["verify"]["passed"] == true);
  auto model = parseModelAs(kConvBn, onnx::TensorProto::FLOAT16);
  FaultLog log;
  const Report report = run(*model, {"bn-fold"}, {}, injector({inputOf("Conv", 1), swapChannels(0, 1)}, log));
  REQUIRE(log.applied);
  const json& verify = onlyEntry(report, "folds")["verify"];
  CHECK(verify["passed"] == false);
  CHECK(verify["data_type"] == "float16");
  CHECK(verify["max_rel_error"].get<double>() > 1e-2);
}

// ---- 4. the CLI ----

TEST_CASE("verify: fold --verify on the ResNet block sample passes every fold and writes the model", "[verify]") {
  TempDir dir;
  std::string out, err;
  const int code = runCommand(cli("fold " + sample("resnet_block.onnx") + " -o " + dir.file("out.onnx") +
                                  " --verify --report " + dir.file("report.json")),
                              &out, &err);
  INFO(out << err);
  CHECK(code == 0);
  CHECK_FALSE(readFile(dir.file("out.onnx")).empty());
  const json report = json::parse(readFile(dir.file("report.json")));
  REQUIRE(report.contains("verification"));
  CHECK(report["verification"]["failed"] == 0);
  CHECK(report["verification"]["rewrites"] == report["verification"]["passed"]);
  REQUIRE(report["folds"].size() == 3);  // models/README.md: 3 folds
  CHECK(report["verification"]["rewrites"].get<int>() >= 3);
  for (const json& entry : report["folds"]) {
    INFO(entry.dump());
    REQUIRE(entry.contains("verify"));
    CHECK(entry["verify"]["passed"] == true);
    CHECK(entry["verify"]["data_type"] == "float");
    // Batch is the symbolic N in the samples: every input, read by a Conv, got a stand-in of one sample.
    for (const auto& shape : entry["verify"]["input_shapes"]) CHECK(shape.at(0) == 1);
  }
}

TEST_CASE("verify: fold without --verify adds no verification to the report", "[verify]") {
  TempDir dir;
  REQUIRE(runCommand(cli("fold " + sample("resnet_block.onnx") + " -o " + dir.file("out.onnx") + " --report " +
                         dir.file("report.json"))) == 0);
  const json report = json::parse(readFile(dir.file("report.json")));
  CHECK_FALSE(report.contains("verification"));
  for (const json& entry : report["folds"]) CHECK_FALSE(entry.contains("verify"));
}

TEST_CASE("verify: check --verify on good models lists no verify-failed finding", "[verify]") {
  for (const std::string name : {"resnet_block.onnx", "bias_add.onnx", "mlp_bn1d.onnx", "decoder_convtranspose.onnx"}) {
    DYNAMIC_SECTION(name) {
      std::string out, err;
      const int code = runCommand(cli("check --verify --fail-on none --format json " + sample(name)), &out, &err);
      INFO(out << err);
      CHECK(code == 0);
      const json document = json::parse(out);
      REQUIRE(document["models"].size() == 1);
      const json& findings = document["models"][0]["findings"];
      CHECK_FALSE(findings.empty());
      std::size_t verified = 0;
      for (const json& finding : findings) {
        CHECK(finding["category"] != "verify-failed");
        if (finding.contains("entry") && finding["entry"].contains("verify")) {
          CHECK(finding["entry"]["verify"]["passed"] == true);
          ++verified;
        }
      }
      CHECK(verified > 0);  // the rewrites were verified, not just left unchecked
    }
  }
  SECTION("default --fail-on on a model with nothing to fold: exit 0") {
    TempDir dir;
    const std::string path = dir.file("clean.onnx");
    writeFile(path, [] {
      std::string bytes;
      REQUIRE(parseModelProto(R"(<ir_version: 8, opset_import: ["" : 13]>
clean (float[1,2,4,4] x) => (float[1,2,4,4] y)
<float[2,2,1,1] w = {1, 2, 3, 4}>
{
  c = Conv (x, w)
  y = Relu (c)
}
)").SerializeToString(&bytes));
      return bytes;
    }());
    std::string out, err;
    CHECK(runCommand(cli("check --verify " + path), &out, &err) == 0);
    CHECK(out.find("verify-failed") == std::string::npos);
  }
}

TEST_CASE("verify: --verify is documented in fold --help and check --help", "[verify]") {
  for (const std::string command : {"fold", "check"}) {
    DYNAMIC_SECTION(command) {
      std::string out, err;
      CHECK(runCommand(cli(command + " --help"), &out, &err) == 0);
      CHECK(out.find("--verify") != std::string::npos);
    }
  }
}

// A real verification failure without any test hook: the original loses precision that the fold does not. The
// Conv's bias (1e8) is cancelled by the BN's mean (1e8); in float, c + 1e8 keeps only multiples of 8, so the
// original's output is off by up to 4, while the folded bias (B - mean) * k + beta is exactly 0. The rewrite
// changes the model's numbers far beyond float's tolerance, and --verify says so.
TEST_CASE("verify: the CLI refuses to write a model whose rewrite changes its numbers", "[verify][cli]") {
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,2,4,4] x) => (float[1,2,4,4] y)
<float[2,2,1,1] w = {1, 0.5, -0.25, 2}, float[2] bias = {100000000, 100000000}, float[2] s = {1, 1},
 float[2] b = {0, 0}, float[2] m = {100000000, 100000000}, float[2] v = {1, 1}>
{
  c = Conv (x, w, bias)
  y = BatchNormalization (c, s, b, m, v)
}
)");
  TempDir dir;
  saveModel(*model, dir.file("in.onnx"));
  std::string out, err;

  SECTION("fold: exit 1, one line naming the rewrite, the report but no model") {
    const int code = runCommand(cli("fold " + dir.file("in.onnx") + " -o " + dir.file("out.onnx") + " --report " +
                                    dir.file("report.json") + " --verify"),
                                &out, &err);
    INFO(out << err);
    CHECK(code == 1);
    CHECK_FALSE(std::filesystem::exists(dir.file("out.onnx")));
    CHECK(err.find("bn-fold of BatchNormalization 'BatchNormalization_0' into 'Conv_0' failed verification: max "
                   "relative error") != std::string::npos);
    CHECK(err.find("1 of 1 rewrites failed verification; no model written") != std::string::npos);
    const json report = json::parse(readFile(dir.file("report.json")));
    CHECK(report["verification"]["failed"] == 1);
    CHECK(report["folds"][0]["verify"]["passed"] == false);
    CHECK(report["folds"][0]["verify"]["max_rel_error"].get<double>() > 1e-4);
    // Without --verify the same fold is written: the check is what refuses it.
    CHECK(runCommand(cli("fold " + dir.file("in.onnx") + " -o " + dir.file("out.onnx"))) == 0);
  }
  SECTION("batch: the model is listed as failed, exit 1") {
    const int code = runCommand(cli("fold " + dir.file("in.onnx") + " --out-dir " + dir.file("out") + " --verify"),
                                &out, &err);
    INFO(out << err);
    CHECK(code == 1);
    CHECK_FALSE(std::filesystem::exists(dir.file("out/in.onnx")));
    CHECK(std::filesystem::exists(dir.file("out/in.report.json")));
    CHECK(err.find("failed verification") != std::string::npos);
  }
  SECTION("check: a verify-failed finding, exit 1 whatever --fail-on says") {
    const int code =
        runCommand(cli("check " + dir.file("in.onnx") + " --verify --fail-on none --format json"), &out, &err);
    INFO(out << err);
    CHECK(code == 1);
    const json result = json::parse(out);
    CHECK(result["summary"]["verify_failed"] == 1);
    bool found = false;
    for (const json& finding : result["models"][0]["findings"])
      found = found || (finding["category"] == "verify-failed" && finding["severity"] == "error");
    CHECK(found);
  }
}

TEST_CASE("verify: a region that reads a string constant cannot be verified, and the run goes on", "[verify]") {
  // An invalid model: the statistic var is Mul(floats, strings), a chain the expanded training-mode BN no longer
  // reads, so the rewrite erases it. Recording the erased Mul's "before" read the strings as numbers and threw out
  // of the rewrite (the fuzzer's find); now the verdict says the original cannot be evaluated.
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[2,2,3,3] x, string[1] s) => (float[2,2,3,3] y, float[2] runningMean)
<float[2] scale = {1.0, 2.0}, float[2] bias = {0.5, 0.0}, float[2] mean = {0.1, 0.2}, float[2] v = {1.0, 1.5},
 string[1] s = {"a"}>
{
  var = Mul (v, s)
  y, runningMean = BatchNormalization <training_mode = 1> (x, scale, bias, mean, var)
}
)");
  Report report;
  REQUIRE_NOTHROW(report = run(*model, {"train-bn-expand"}));
  INFO(report.dump());
  const json& verify = onlyEntry(report, "expanded")["verify"];
  CHECK(verify["passed"] == false);
  CHECK_THAT(verify["error"].get<std::string>(), Catch::Contains("constant of type string cannot be read"));
  CHECK(report.json().at("verification")["failed"] == 1);
}
