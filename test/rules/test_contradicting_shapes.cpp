// Shapes declared in a model (value_info, graph outputs) that contradict the shapes propagated from its inputs are
// not facts: a rule that needs the shape refuses instead of rewriting for a shape the value does not have. Each case
// is a model ONNX Runtime runs (it only warns about the wrong declaration); bnfold once turned its MatMul into a
// Gemm of a rank-3 input, which ONNX Runtime cannot load or run.

#include <catch2/catch.hpp>

#include "bnfold/rewrite/driver.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;

namespace {

constexpr double kTol = 1e-5;

const char* const kWeights =
    "float[5,4] w = {0.5, -1, 2, 0.25, 1, 0.75, -0.5, 1.5, -2, 1, 0.5, -0.25, 0.125, 2, -1, 1, 1.5, -0.75, 0.25, 3}";

/// The rule's own verdict on the first node of `opType`.
MatchFailure refusal(Model& model, const std::string& ruleName, const std::string& opType) {
  const Node* node = findNode(model.graph(), opType);
  REQUIRE(node);
  const RuleOptions options;
  RuleContext context(model, options);
  MatchResult result = findRule(ruleName)->match(*node, context);
  REQUIRE_FALSE(result.matched());
  return result.failure();
}

/// Applies `rule` and checks that the model is left as it was and still runs in ONNX Runtime as before.
void checkLeftAloneAndRuns(Model& model, const std::string& rule, const std::string& ops) {
  FoldOutcome outcome = applyRulesAndCompare(model, {rule}, kTol, kTol);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  CHECK(opSequence(model.graph()) == ops);
}

}  // namespace

TEST_CASE("bias-add: a MatMul input declared 2-D but propagated 3-D does not become a Gemm", "[bias-add][shape]") {
  // r is [1,1,5] (Relu of x), but value_info says [1,5]: a Gemm would get a rank-3 input.
  auto model = parseModel(std::string(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,1,5] x) => (float[1,4] y)
<)") + kWeights + R"(, float[4] b = {1, 2, 3, 4}, float[1,5] r>
{
  r = Relu (x)
  mm = MatMul (r, w)
  y = Add (mm, b)
}
)");
  const MatchFailure why = refusal(*model, "bias-add", "Add");
  CHECK(why.code == reason::kLayerHasNoBias);
  CHECK_THAT(why.message, Catch::Contains("of unknown rank"));
  checkLeftAloneAndRuns(*model, "bias-add", "Relu,MatMul,Add");
}

TEST_CASE("bias-add: the same MatMul with a consistent declaration still becomes a Gemm", "[bias-add][shape]") {
  auto model = parseModel(std::string(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,5] x) => (float[1,4] y)
<)") + kWeights + R"(, float[4] b = {1, 2, 3, 4}, float[1,5] r>
{
  r = Relu (x)
  mm = MatMul (r, w)
  y = Add (mm, b)
}
)");
  checkLeftAloneAndRuns(*model, "bias-add", "Relu,Gemm");
}

TEST_CASE("bn-fold: a BN output declared 2-D but propagated 3-D is not folded into MatMul columns", "[bn-fold][shape]") {
  // MatMul gives [1,4,4]; the graph output says [4,4]. BN normalizes axis 1, which for the real rank-3 output is
  // not MatMul's column axis: folding would change the function, and the Gemm would not load.
  SECTION("the contradiction at the BN's output: the MatMul's propagated rank decides") {
    auto model = parseModel(std::string(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,4,5] x) => (float[4,4] y)
<)") + kWeights + R"(, float[4] s = {1, 2, 3, 4}, float[4] o = {1, 2, 3, 4}, float[4] m = {0, 1, 0, 1}, float[4] v = {1, 2, 1, 2}>
{
  mm = MatMul (x, w)
  y = BatchNormalization (mm, s, o, m, v)
}
)");
    const MatchFailure why = refusal(*model, "bn-fold", "BatchNormalization");
    CHECK(why.code == reason::kChannelAxisMismatch);
    CHECK_THAT(why.message, Catch::Contains("has rank 3"));
    checkLeftAloneAndRuns(*model, "bn-fold", "MatMul,BatchNormalization");
  }
  SECTION("the contradiction at the MatMul's output: every shape after it is unknown") {
    auto model = parseModel(std::string(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,4,5] x) => (float[4,4] y)
<)") + kWeights + R"(, float[4] s = {1, 2, 3, 4}, float[4] o = {1, 2, 3, 4}, float[4] m = {0, 1, 0, 1}, float[4] v = {1, 2, 1, 2}, float[4,4] mm>
{
  mm = MatMul (x, w)
  y = BatchNormalization (mm, s, o, m, v)
}
)");
    const MatchFailure why = refusal(*model, "bn-fold", "BatchNormalization");
    CHECK(why.code == reason::kRankUnknown);
    checkLeftAloneAndRuns(*model, "bn-fold", "MatMul,BatchNormalization");
  }
}
