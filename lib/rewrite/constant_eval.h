#pragma once
// Constant evaluation: a value that real exporters compute from constants by a chain of pure ops (PyTorch's
// Identity of a de-duplicated tensor, caffe2's ConstantOfShape, Cast, Reshape/Unsqueeze/Transpose of a weight,
// Concat/Slice/Gather/Expand, `var + eps` and `1 / sqrt(...)` chains) is a constant for the rules.
//
// Evaluation is lazy (only what a rule asks about), bounded (no op whose result exceeds a byte limit is computed),
// and exact where it can be: floating values are computed in double and rounded once, to the chain's output type,
// when a tensor is made of them (an explicit Cast to a narrower type rounds where it stands); integers are
// computed in int64. Shape-only ops (Identity, Reshape, Squeeze, Unsqueeze, Flatten) of a stored tensor share its
// bytes instead of copying them. The driver then has the Rewriter materialise what a successful match used (see
// Rewriter::materializeConstant), so provenance and dead-node removal go through the one mutator.

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

/// A chain's value as a tensor, with the nodes it was computed by (in evaluation order).
struct EvaluatedConstant {
  const Value* value = nullptr;
  std::unique_ptr<Tensor> tensor;
  std::vector<const Node*> nodes;
};

class ConstantEvaluator {
 public:
  explicit ConstantEvaluator(const RuleContext& context);
  ~ConstantEvaluator();

  /// The constant computed by the chain behind `value` (whose producer is not a Constant node), or null with
  /// `whyNot` set: params-not-constant (a run-time input or an op it cannot evaluate), params-overridable,
  /// quantized-weights, constant-too-large, param-kept-by-user. The tensor lives until takePending/the end.
  const Tensor* evaluate(const Value& value, MatchFailure* whyNot);

  /// The chain values handed to rules since the last call, with their tensors (moved out).
  std::vector<EvaluatedConstant> takePending();
  /// Forgets which values were handed out since the last call (their tensors stay cached).
  void discardPending() { pending_.clear(); }

  struct Result;  // an intermediate value (constant_eval.cpp)

 private:
  std::shared_ptr<const Result> evaluateValue(const Value& value, int depth, MatchFailure* whyNot);
  std::shared_ptr<const Result> evaluateNode(const Node& node, int depth, MatchFailure* whyNot);

  const RuleContext& context_;
  std::unordered_map<const Value*, std::shared_ptr<const Result>> results_;
  std::unordered_map<const Value*, MatchFailure> failures_;
  std::unordered_map<const Value*, EvaluatedConstant> tensors_;
  std::vector<const Value*> pending_;
};

}  // namespace bnfold
