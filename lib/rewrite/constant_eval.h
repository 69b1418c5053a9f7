#pragma once
// Constant evaluation: a value that real exporters compute from constants by a chain of pure ops (PyTorch's
// Identity of a de-duplicated tensor, caffe2's ConstantOfShape, Cast, Reshape/Unsqueeze/Transpose of a weight,
// Concat/Slice/Gather/Expand, `var + eps` and `1 / sqrt(...)` chains) is a constant for the rules.
//
// Evaluation is lazy (only what a rule asks about), bounded (no op whose result exceeds a byte limit is computed),
// and exact where it can be: floating values are computed in double and rounded once, to the chain's output type,
// when a tensor is made of them (an explicit Cast to a narrower type rounds where it stands); integers are
// computed in int64. Shape-only ops (Identity, Reshape, Squeeze, Unsqueeze, Flatten) of a stored tensor share its
// bytes instead of copying them. A successful match carries what it used (RuleContext::match) and the Rewriter
// materialises it (Rewriter::apply), so provenance and dead-node removal go through the one mutator. Everything
// cached is forgotten when the model changes (Model::changeCount): a rewrite may change what a chain computes.

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bnfold/rewrite/rule.h"

namespace bnfold {

/// True for the ops the evaluator computes (standard ONNX domain): pure functions of their inputs and attributes.
/// Dead-node removal takes only such nodes (and Constant).
bool isConstantFoldableOp(const Node& node);

class ConstantEvaluator {
 public:
  explicit ConstantEvaluator(const RuleContext& context);
  ~ConstantEvaluator();

  /// The constant computed by the chain behind `value` (whose producer is not a Constant node), or null with
  /// `whyNot` set: params-not-constant (a run-time input or an op it cannot evaluate), params-overridable,
  /// quantized-weights, constant-too-large, param-kept-by-user. The tensor lives until takeHandedOut moves it out,
  /// or the model changes, or the evaluator goes.
  const Tensor* evaluate(const Value& value, MatchFailure* whyNot);

  /// A match starts: forgets which values were handed out (their tensors stay cached while the model is unchanged).
  void startMatch() { handedOut_.clear(); }
  /// The chain values handed out since startMatch, with their tensors (moved out of the cache).
  std::vector<EvaluatedConstant> takeHandedOut();

  struct Result;  // an intermediate value (constant_eval.cpp)

 private:
  std::shared_ptr<const Result> evaluateValue(const Value& value, int depth, MatchFailure* whyNot);
  std::shared_ptr<const Result> evaluateNode(const Node& node, int depth, MatchFailure* whyNot);
  /// Drops everything cached when the model changed since it was computed.
  void forgetIfModelChanged();

  const RuleContext& context_;
  std::unordered_map<const Value*, std::shared_ptr<const Result>> results_;
  std::unordered_map<const Value*, MatchFailure> failures_;
  std::unordered_map<const Value*, EvaluatedConstant> tensors_;
  std::vector<const Value*> handedOut_;
  uint64_t cachedAtChange_ = 0;  // Model::changeCount when the cache was last known valid
};

}  // namespace bnfold
