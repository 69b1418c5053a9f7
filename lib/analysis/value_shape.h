#pragma once
// What is statically known about a value's shape and element type, for rules that must know how a constant
// broadcasts against it (bias-add, scale-fold, bn-decompose; bn-fold uses it too) and for the verifier's inputs.
// Sources: a constant's own dims, the value's declared type (graph input, graph output or value_info), and a small
// forward inference through the ops these rules meet: Conv / ConvTranspose / Gemm / MatMul (rank and channel count
// from the weight), shape-preserving element-wise ops (Relu, BatchNormalization, ...), pooling (batch and channels
// pass through), Add/Sub/Mul/Div (numpy broadcast of both sides) and the layout ops (shape_ops.h).
//
// Shapes propagated from the graph's inputs and constants win over those declared for a value inside the graph or
// for a graph output: a declared shape fills only dims inference leaves unknown. Where the two contradict each other
// (another rank, or another value for a dim both know), neither is a fact: the shape is unknown, and so is every
// shape inferred from it, whatever is declared further on. Nothing else is guessed: an unknown shape stays unknown
// and the rule declines with a reason.

//
// Inference follows producers at most kMaxDepth steps from the value asked about, so an answer depends on how far the
// asked value is from where shapes become known. ShapeFacts remembers, for each value it worked out, its shape at every
// number of steps left (a few runs of equal answers), so that a later query starting elsewhere reads them instead of
// following the same producers again.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "bnfold/ir/graph.h"
#include "shape_ops.h"

namespace bnfold::analysis {

/// The value's dims as far as known (kUnknownDim for unknown ones), or nullopt when even the rank is unknown. Works
/// the answer out afresh; ShapeFacts gives the same answers and remembers them.
std::optional<std::vector<int64_t>> knownShape(const Value& value);

/// knownShape for many queries on one model: what one query worked out serves the next. Its answers stay exact only
/// while it is told of every change before the next query: forget(value) for each value whose own sources change (its
/// producer, that producer's inputs or attributes, its constant, its declared type or name); what was inferred from
/// the value is forgotten with it.
class ShapeFacts {
 public:
  ShapeFacts();
  ~ShapeFacts();
  ShapeFacts(const ShapeFacts&) = delete;
  ShapeFacts& operator=(const ShapeFacts&) = delete;

  std::optional<std::vector<int64_t>> knownShape(const Value& value);
  void forget(const Value& value);
  void forgetOutputsOf(const Node& node);
  void clear();

 private:
  class Store;
  std::unique_ptr<Store> store_;
};

/// The value's element type when it is known, else nullopt.
std::optional<DataType> knownElementType(const Value& value);

/// A Reshape's `allowzero` (opset 14; 0 when absent): whether a 0 in its target is a dim of 0 rather than a copy of
/// the input's dim. For reshapeShape.
bool reshapeAllowsZero(const Node& reshape);

}  // namespace bnfold::analysis
