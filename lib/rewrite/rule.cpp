#include "bnfold/rewrite/rule.h"

#include <fnmatch.h>

#include <algorithm>

#include "analysis/value_shape.h"
#include "bnfold/rewrite/rewriter.h"
#include "constant_eval.h"

namespace bnfold {

// The shapes the rules asked for. Following a Rewriter, it forgets what each change can affect: the outputs of a
// changed node, both values of a replacement, and (ShapeFacts::forget) what was inferred from them.
class RuleContext::Shapes final : public RewriteListener {
 public:
  analysis::ShapeFacts facts;
  bool following = false;
  uint64_t changeCountSeen = 0;  // when not following: the model's changeCount the facts were worked out at

  void nodeWillChange(const Node& node) override { facts.forgetOutputsOf(node); }
  void nodeChanged(const Node& node) override { facts.forgetOutputsOf(node); }
  void valueReplaced(const Value& from, const Value& to) override {
    facts.forget(from);
    facts.forget(to);
  }
};

RuleContext::RuleContext(const Model& model, const RuleOptions& options)
    : model_(model),
      options_(options),
      evaluator_(std::make_unique<ConstantEvaluator>(*this)),
      shapes_(std::make_unique<Shapes>()) {}
RuleContext::~RuleContext() = default;

std::optional<std::vector<int64_t>> RuleContext::knownShape(const Value& value) const {
  if (!shapes_->following && shapes_->changeCountSeen != model_.changeCount()) {
    shapes_->facts.clear();
    shapes_->changeCountSeen = model_.changeCount();
  }
  return shapes_->facts.knownShape(value);
}

void RuleContext::followChanges(Rewriter& rewriter) const {
  rewriter.addListener(shapes_.get());
  shapes_->following = true;
}

void RuleContext::stopFollowing(Rewriter& rewriter) const {
  rewriter.removeListener(shapes_.get());
  shapes_->following = false;
  shapes_->changeCountSeen = model_.changeCount();
}

bool globMatch(const std::string& pattern, const std::string& name) {
  return fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

bool RuleContext::isKept(const Node& node) const {
  const auto& ops = options_.keepOps;
  if (std::find(ops.begin(), ops.end(), node.opType()) != ops.end()) return true;
  for (const std::string& pattern : options_.keepNodes)
    if (globMatch(pattern, node.name())) return true;
  return false;
}

MatchResult RuleContext::match(const Rule& rule, const Node& root) const {
  evaluator_->startMatch();
  MatchResult result = rule.match(root, *this);
  if (result.matched()) result.evaluatedConstants_ = evaluator_->takeHandedOut();
  return result;
}

const Tensor* RuleContext::constantOf(const Value* value, MatchFailure* whyNot) const {
  const Tensor* tensor = anyConstantOf(value, whyNot);
  if (!tensor || isFloatingPoint(tensor->dataType()) || isIntegerType(tensor->dataType())) return tensor;
  // Strings, complex numbers, float8: no rule computes with them, and reading them as numbers would throw.
  if (whyNot)
    *whyNot = {reason::kUnsupportedType, "'" + value->name() + "' holds " + dataTypeName(tensor->dataType()) +
                                             ", not real numbers"};
  return nullptr;
}

std::optional<std::vector<int64_t>> RuleContext::integersOf(const Value* value, MatchFailure* whyNot) const {
  const Tensor* tensor = constantOf(value, whyNot);
  if (!tensor) return std::nullopt;
  if (isIntegerType(tensor->dataType())) return tensor->toInt64s();
  if (whyNot)
    *whyNot = {reason::kUnsupportedType, "'" + value->name() + "' holds " + dataTypeName(tensor->dataType()) +
                                             ", not integers"};
  return std::nullopt;
}

const Tensor* RuleContext::anyConstantOf(const Value* value, MatchFailure* whyNot) const {
  auto fail = [&](ReasonCode code, std::string message) -> const Tensor* {
    if (whyNot) *whyNot = {code, std::move(message)};
    return nullptr;
  };
  if (!value) return fail(reason::kParamsNotConstant, "an input is omitted");
  if (value->isSparseInitializer())
    return fail(reason::kParamsNotConstant, "'" + value->name() + "' is a sparse initializer");
  if (const Tensor* tensor = value->initializer()) {
    // From IR version 4 on, an initializer that is also a graph input is only a default a caller may
    // override at run time; in IR version 3 every initializer had to be listed as an input.
    if (value->isGraphInput() && model_.irVersion() >= 4 && !options_.inputDefaultsAreConstant)
      return fail(reason::kParamsOverridable,
                  "'" + value->name() + "' is an initializer that is also a graph input, so a caller may override "
                  "it at run time (IR version " + std::to_string(model_.irVersion()) +
                      "); pass --input-defaults-are-constant to fold it anyway");
    return tensor;
  }
  if (value->isGraphInput())
    return fail(reason::kParamsNotConstant, "'" + value->name() + "' is a graph input fed at run time");
  if (const Tensor* tensor = value->constantTensor()) return tensor;
  if (value->producer()) return evaluator_->evaluate(*value, whyNot);
  return fail(reason::kParamsNotConstant, "'" + value->name() + "' is not a constant");
}

}  // namespace bnfold
