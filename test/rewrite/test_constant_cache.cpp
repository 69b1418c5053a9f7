// What constantOf evaluates from chains belongs to the match that asked (RuleContext::match hands it over), and
// nothing the evaluator cached survives a change of the model.

#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "bnfold/ir/model.h"
#include "bnfold/report/report.h"
#include "bnfold/rewrite/rewriter.h"
#include "bnfold/rewrite/rule.h"
#include "test_support.h"

using namespace bnfold;
using bnfold::test::findNode;
using bnfold::test::parseModel;

namespace {

// `c` is computed from an initializer by an Identity; `d` from the graph input.
const char* kChains = R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[2] x) => (float[2] y, float[2] z)
<float[2] w1 = {1, 2}, float[2] w2 = {5, 7}>
{
  c = Identity (w1)
  y = Add (x, c)
  d = Neg (x)
  z = Mul (x, d)
}
)";

Value* valueNamed(Model& model, const std::string& name) { return model.graph().findLocal(name); }

std::vector<double> constantValues(const RuleContext& context, const Value* value) {
  const Tensor* tensor = context.constantOf(value);
  return tensor ? tensor->toDoubles() : std::vector<double>{};
}

// Matches when the root's input 1 is a constant; `failAfterAsking` makes it fail anyway once it has asked.
class ConstantOperandRule final : public Rule {
 public:
  explicit ConstantOperandRule(bool failAfterAsking) : failAfterAsking_(failAfterAsking) {}
  const char* name() const override { return "test-constant-operand"; }
  const char* summary() const override { return "test rule"; }
  std::vector<std::string> rootOps() const override { return {"Add", "Mul"}; }
  std::vector<OpVersions> opVersions() const override { return {}; }
  MatchResult match(const Node& root, const RuleContext& context) const override {
    MatchFailure why;
    if (!context.constantOf(root.input(1), &why)) return MatchResult::failure(why.code, why.message);
    if (failAfterAsking_) return MatchResult::failure(reason::kParamsNotConstant, "asked, then gave up");
    return MatchResult::success(std::make_unique<Match>());
  }
  void rewrite(Match&, Rewriter&) const override {}

 private:
  bool failAfterAsking_;
};

}  // namespace

TEST_CASE("constant cache: a rewrite that changes a chain's input changes its value", "[rewrite][constants]") {
  auto model = parseModel(kChains);
  const RuleOptions options;
  const RuleContext context(*model, options);
  const Value* c = valueNamed(*model, "c");
  REQUIRE(constantValues(context, c) == std::vector<double>{1, 2});

  Report report;
  Rewriter rewriter(*model, report);
  rewriter.setInput(c->producer(), 0, valueNamed(*model, "w2"));
  CHECK(constantValues(context, c) == std::vector<double>{5, 7});
}

TEST_CASE("constant cache: a value that was not constant is once a rewrite makes it so", "[rewrite][constants]") {
  auto model = parseModel(kChains);
  const RuleOptions options;
  const RuleContext context(*model, options);
  const Value* d = valueNamed(*model, "d");
  MatchFailure why;
  REQUIRE_FALSE(context.constantOf(d, &why));
  CHECK(why.code == reason::kParamsNotConstant);

  Report report;
  Rewriter rewriter(*model, report);
  rewriter.setInput(d->producer(), 0, valueNamed(*model, "w1"));
  CHECK(constantValues(context, d) == std::vector<double>{-1, -2});
}

TEST_CASE("constant cache: a successful match carries what it evaluated, a failed one nothing",
          "[rewrite][constants]") {
  auto model = parseModel(kChains);
  const RuleOptions options;
  const RuleContext context(*model, options);
  const Node* add = findNode(model->graph(), "Add");
  const ConstantOperandRule giveUp(true), accept(false);

  MatchResult failed = context.match(giveUp, *add);
  REQUIRE_FALSE(failed.matched());
  CHECK(failed.evaluatedConstants().empty());

  MatchResult matched = context.match(accept, *add);
  REQUIRE(matched.matched());
  REQUIRE(matched.evaluatedConstants().size() == 1);
  const EvaluatedConstant& constant = matched.evaluatedConstants().front();
  CHECK(constant.value == valueNamed(*model, "c"));
  REQUIRE(constant.tensor);
  CHECK(constant.tensor->toDoubles() == std::vector<double>{1, 2});
  REQUIRE(constant.nodes.size() == 1);
  CHECK(constant.nodes.front()->opType() == "Identity");

  // Applying the match makes the constant an initializer; the Identity goes with nothing left to read it.
  Report report;
  Rewriter rewriter(*model, report);
  rewriter.apply(accept, matched);
  rewriter.finish();
  CHECK(valueNamed(*model, "c")->initializer());
  CHECK_FALSE(findNode(model->graph(), "Identity"));
  REQUIRE(report.section("evaluated").size() == 1);
  CHECK(report.section("evaluated")[0]["rule"] == "test-constant-operand");
}
