// bn-decompose (off by default): an inference BatchNormalization nothing could fold becomes Mul + Add of
// per-channel constants shaped [C, 1, ..., 1] so they broadcast over the channel axis (numpy broadcasting aligns
// from the last axis). Constants are checked against values computed here; every case runs in ONNX Runtime.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "bnfold/rewrite/driver.h"
#include "test_bn_fold_support.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;

namespace {

constexpr double kTol = 1e-5;

std::string bnText(const BnParams& p, const std::string& extra = "") {
  char eps[32];
  std::snprintf(eps, sizeof eps, "%.9g", p.epsilon);
  return std::string("BatchNormalization <epsilon = ") + eps + extra + ">";
}

std::vector<double> bnShift(const BnParams& p) {
  const auto k = bnMultiplier(p);
  std::vector<double> t(k.size());
  for (std::size_t c = 0; c < t.size(); ++c) t[c] = p.beta[c] - p.mean[c] * k[c];
  return t;
}

std::string dimsText(const std::vector<int64_t>& dims) {
  std::string text;
  for (std::size_t i = 0; i < dims.size(); ++i) text += (i ? "," : "") + std::to_string(dims[i]);
  return text;
}

void checkFoldsInOrt(const FoldOutcome& outcome) {
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
}

}  // namespace

TEST_CASE("bn-decompose: constants shaped [C,1,...] for every input rank", "[bn-decompose]") {
  struct Case {
    std::vector<int64_t> inputDims;
    std::vector<int64_t> constantDims;
  };
  const std::vector<Case> cases = {
      {{2, 3}, {3}},
      {{2, 3, 5}, {3, 1}},
      {{1, 3, 4, 4}, {3, 1, 1}},
      {{1, 3, 2, 3, 2}, {3, 1, 1, 1}},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION("input [" << dimsText(c.inputDims) << "]") {
      const BnParams p = makeBnParams(3, 1.0 + static_cast<double>(c.inputDims.size()));
      const std::string type = "float[" + dimsText(c.inputDims) + "]";
      auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g ()" + type + " x) => (" + type + R"( y)
<)" + bnInitializers(p) + R"(>
{
  y = )" + bnText(p) + R"( (x, s, b, m, v)
}
)");
      FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-decompose"}, kTol, kTol);
      checkFoldsInOrt(outcome);
      const Graph& graph = model->graph();
      CHECK(opSequence(graph) == "Mul,Add");
      const Node* mul = findNode(graph, "Mul");
      const Node* add = findNode(graph, "Add");
      CHECK(mul->input(0)->name() == "x");
      CHECK(add->input(0) == mul->output(0));
      CHECK(add->output(0)->name() == "y");
      CHECK(add->output(0)->isGraphOutput());
      const Tensor* scale = mul->input(1)->constantTensor();
      const Tensor* shift = add->input(1)->constantTensor();
      REQUIRE(scale);
      REQUIRE(shift);
      CHECK(scale->dims() == c.constantDims);
      CHECK(shift->dims() == c.constantDims);
      checkClose(scale->toDoubles(), bnMultiplier(p), 1e-7);
      checkClose(shift->toDoubles(), bnShift(p), 1e-6);
      // The parameters are gone with the BN.
      CHECK(graph.findLocal("s") == nullptr);
      CHECK(graph.findLocal("v") == nullptr);
      const auto& entries = outcome.report.section("decomposed");
      REQUIRE(entries.size() == 1);
      CHECK(entries[0]["rule"] == "bn-decompose");
      CHECK(entries[0]["bn"] == "BatchNormalization_0");
      CHECK(entries[0]["mul"] == mul->name());
      CHECK(entries[0]["add"] == add->name());
      CHECK(entries[0]["scale_tensor"] == mul->input(1)->name());
      CHECK(entries[0]["shift_tensor"] == add->input(1)->name());
      CHECK(entries[0]["constant_dims"].get<std::vector<int64_t>>() == c.constantDims);
      CHECK(entries[0]["mean"].get<std::vector<double>>() == p.mean);
      CHECK(outcome.report.section("skipped").empty());
    }
  }
}

TEST_CASE("bn-decompose is off by default and runs last among BN rules", "[bn-decompose]") {
  const auto defaults = parseRuleSelection("default");
  CHECK(std::find(defaults.begin(), defaults.end(), "bn-decompose") == defaults.end());
  const auto withDecompose = parseRuleSelection("+bn-decompose");
  REQUIRE(std::find(withDecompose.begin(), withDecompose.end(), "bn-decompose") != withDecompose.end());
  // Every other BN rule comes before it in the priority list.
  std::size_t decomposeAt = 0, lastOtherBnRule = 0;
  for (std::size_t i = 0; i < builtinRules().size(); ++i) {
    const Rule& rule = *builtinRules()[i];
    const auto roots = rule.rootOps();
    if (std::find(roots.begin(), roots.end(), "BatchNormalization") == roots.end()) continue;
    if (std::string(rule.name()) == "bn-decompose") decomposeAt = i;
    else lastOtherBnRule = i;
  }
  CHECK(decomposeAt > lastOtherBnRule);

  const BnParams p = makeBnParams(2, 7.0);
  const std::string text = R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y, float[1,2,4,4] z)
<)" + bnInitializers(p) + ", " + tensorText("float", "w", {2, 3, 1, 1}, asFloats(sampleValues(6, 8.0))) + R"(>
{
  c = Conv (x, w)
  y = )" + bnText(p) + R"( (c, s, b, m, v)
  r = Relu (c)
  z = )" + bnText(p) + R"( (r, s, b, m, v)
}
)";
  SECTION("default rules leave a BN after Relu in place") {
    auto model = parseModel(text);
    Report report = applyRules(*model, parseRuleSelection("default"));
    CHECK(countOps(*model, "BatchNormalization") == 2);
    CHECK(report.section("decomposed").empty());
  }
  SECTION("+bn-decompose: only what could not be folded is decomposed") {
    // The Conv output feeds the Relu as well, so the first BN cannot be folded either: both decompose.
    auto model = parseModel(text);
    FoldOutcome outcome = applyRulesAndCompare(*model, parseRuleSelection("+bn-decompose"), kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(countOps(*model, "BatchNormalization") == 0);
    CHECK(outcome.report.section("decomposed").size() == 2);
    CHECK(outcome.report.section("folds").empty());
    CHECK(opSequence(model->graph()) == "Conv,Mul,Add,Relu,Mul,Add");
  }
}

TEST_CASE("bn-decompose: a foldable BN is folded, not decomposed", "[bn-decompose]") {
  const BnParams p = makeBnParams(2, 9.0);
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + bnInitializers(p) + ", " + tensorText("float", "w", {2, 3, 1, 1}, asFloats(sampleValues(6, 10.0))) + R"(>
{
  c = Conv (x, w)
  y = )" + bnText(p) + R"( (c, s, b, m, v)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, parseRuleSelection("+bn-decompose"), kTol, kTol);
  checkFoldsInOrt(outcome);
  CHECK(opSequence(model->graph()) == "Conv");
  CHECK(outcome.report.section("folds").size() == 1);
  CHECK(outcome.report.section("decomposed").empty());
}

TEST_CASE("bn-decompose: spatial=0 parameters keep their per-element shape", "[bn-decompose]") {
  // Opset 7, spatial=0: params [C, H, W] hold one value per element of a sample; as Mul/Add constants of that
  // shape they line up with X's last three axes.
  BnParams p;
  const std::size_t count = 3 * 2 * 2;
  p.gamma = asFloats(sampleValues(count, 11.1, -2.0, 2.0));
  p.beta = asFloats(sampleValues(count, 11.2));
  p.mean = asFloats(sampleValues(count, 11.3, -0.5, 0.5));
  p.var = asFloats(sampleValues(count, 11.4, 0.2, 2.0));
  p.epsilon = static_cast<double>(1e-3f);
  const std::vector<int64_t> dims{3, 2, 2};
  auto model = parseModel(R"(<ir_version: 3, opset_import: ["" : 7]>
g (float[2,3,2,2] x) => (float[2,3,2,2] y)
<)" + tensorText("float", "s", dims, p.gamma) + ", " + tensorText("float", "b", dims, p.beta) + ", " +
                          tensorText("float", "m", dims, p.mean) + ", " + tensorText("float", "v", dims, p.var) + R"(>
{
  y = )" + bnText(p, ", spatial = 0") + R"( (x, s, b, m, v)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-decompose"}, kTol, kTol);
  checkFoldsInOrt(outcome);
  const Node* mul = findNode(model->graph(), "Mul");
  REQUIRE(mul);
  CHECK(mul->input(1)->constantTensor()->dims() == dims);
  checkClose(mul->input(1)->constantTensor()->toDoubles(), bnMultiplier(p), 1e-7);
  checkClose(findNode(model->graph(), "Add")->input(1)->constantTensor()->toDoubles(), bnShift(p), 1e-6);
}

TEST_CASE("bn-decompose: float16 input with float parameters (opset 15 types T and T1)", "[bn-decompose]") {
  const BnParams p = makeBnParams(3, 12.0);
  auto model = parseModelAs(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,3,4,4] x) => (float[1,3,4,4] y)
<)" + bnInitializers(p) + R"(>
{
  y = )" + bnText(p) + R"( (x, s, b, m, v)
}
)",
                            onnx::TensorProto::FLOAT16, {"s", "b", "m", "v"});
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-decompose"}, 1e-2, 1e-2);
  checkFoldsInOrt(outcome);
  const Node* mul = findNode(model->graph(), "Mul");
  REQUIRE(mul);
  // Mul(X, k) needs k of X's type, not of the parameters'.
  CHECK(mul->input(1)->constantTensor()->dataType() == DataType::Float16);
  CHECK(findNode(model->graph(), "Add")->input(1)->constantTensor()->dataType() == DataType::Float16);
  checkClose(mul->input(1)->constantTensor()->toDoubles(), bnMultiplier(p), 1e-3);
}

TEST_CASE("bn-decompose: inside an If branch the constants go into the branch", "[bn-decompose]") {
  const BnParams p = makeBnParams(2, 13.0);
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (bool cond, float[1,2,3] x) => (float[1,2,3] y)
<)" + bnInitializers(p) + R"(>
{
  y = If (cond) <
    then_branch = then_g () => (float[1,2,3] t) { t = )" + bnText(p) + R"( (x, s, b, m, v) },
    else_branch = else_g () => (float[1,2,3] e) { e = Neg (x) }
  >
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-decompose"}, kTol, kTol);
  checkFoldsInOrt(outcome);
  CHECK(countOps(*model, "BatchNormalization") == 0);
  Graph* branch = model->graph().nodeList()[0]->subgraphs()[0].graph.get();
  CHECK(opSequence(*branch) == "Mul,Add");
  const Node* mul = findNode(*branch, "Mul");
  CHECK(mul->input(1)->graph() == branch);
  CHECK(mul->input(1)->constantTensor()->dims() == std::vector<int64_t>{2, 1});
}

TEST_CASE("bn-decompose: refusals", "[bn-decompose]") {
  const BnParams p = makeBnParams(3, 14.0);
  SECTION("the input's rank is not known") {
    // Nothing declares or infers the Transpose output's shape, and the BN output is not declared either.
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,4,4,3] x) => (float[1,3,4,4] y)
<)" + bnInitializers(p) + R"(>
{
  t = Transpose <perm = [0,3,1,2]> (x)
  n = )" + bnText(p) + R"( (t, s, b, m, v)
  y = Relu (n)
}
)");
    Report report = applyRules(*model, {"bn-decompose"});
    CHECK(skipReason(report, "BatchNormalization_0") == "rank-unknown");
    CHECK(countOps(*model, "BatchNormalization") == 1);
  }
  SECTION("training mode") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[2,3,4] x) => (float[2,3,4] y)
<)" + bnInitializers(p) + R"(>
{
  y = BatchNormalization <training_mode = 1> (x, s, b, m, v)
}
)");
    CHECK(skipReason(applyRules(*model, {"bn-decompose"}), "BatchNormalization_0") == "training-mode");
  }
  SECTION("a mean fed at run time") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[2,3,4] x, float[3] m2) => (float[2,3,4] y)
<)" + bnInitializers(p) + R"(>
{
  y = )" + bnText(p) + R"( (x, s, b, m2, v)
}
)");
    CHECK(skipReason(applyRules(*model, {"bn-decompose"}), "BatchNormalization_0") == "params-not-constant");
  }
  SECTION("a negative variance") {
    BnParams bad = p;
    bad.var[1] = -1.0;
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[2,3,4] x) => (float[2,3,4] y)
<)" + bnInitializers(bad) + R"(>
{
  y = )" + bnText(bad) + R"( (x, s, b, m, v)
}
)");
    CHECK(skipReason(applyRules(*model, {"bn-decompose"}), "BatchNormalization_0") == "invalid-variance");
  }
  SECTION("kept by the user") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[2,3,4] x) => (float[2,3,4] y)
<)" + bnInitializers(p) + R"(>
{
  y = )" + bnText(p) + R"( (x, s, b, m, v)
}
)");
    RuleOptions options;
    options.keepNodes = {"Batch*"};
    CHECK(skipReason(applyRules(*model, {"bn-decompose"}, options), "BatchNormalization_0") == "kept-by-user");
    CHECK(opSequence(model->graph()) == "BatchNormalization");
  }
  SECTION("opset 6: Mul and Add do not broadcast numpy-style yet") {
    auto model = parseModel(R"(<ir_version: 3, opset_import: ["" : 6]>
g (float[2,3,4] x) => (float[2,3,4] y)
<)" + bnInitializers(p) + R"(>
{
  y = )" + bnText(p, ", is_test = 1") + R"( (x, s, b, m, v)
}
)");
    CHECK(skipReason(applyRules(*model, {"bn-decompose"}), "BatchNormalization_0") == "unsupported-opset");
  }
}
