#pragma once
// A path of layout ops (Identity, Transpose, Reshape, Flatten, Squeeze, Unsqueeze) between a layer and the
// BatchNormalization after it, as real exporters write them: old PyTorch's Gemm -> Unsqueeze -> BN -> Squeeze,
// Keras's Conv -> Transpose(0,2,3,1) -> Identity -> Transpose(0,3,1,2) -> BN, MatMul -> Reshape -> BN.
//
// A per-channel affine map commutes with such a path exactly when the path carries the layer's feature axis to
// one axis of its result, element for element: Transpose moves it, Unsqueeze/Squeeze shift it, and Reshape/Flatten
// keep it only when the feature dim stands whole in the result with the same number of elements after it. The
// path and the axis it ends on are found here, in `match`; the rewrite only folds and rewires.

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

#include "bnfold/rewrite/rule.h"

namespace bnfold::rules {

/// True for the layout ops a path may hold.
bool isLayoutOp(const Node& node);

/// The layout ops between the producer that is not one (the source) and `value`, in forward order. Each value on
/// the way is read only by the next node (the last one, `value`, only by its own reader) and is no graph output;
/// otherwise `whyNot` is layer-has-other-consumers — but only when `isSource(source)` holds, since a path to
/// something that cannot be folded into is no-foldable-producer whatever it reads. Nullopt when `value` has no
/// producer.
struct LayoutPath {
  const Node* source = nullptr;
  std::vector<const Node*> steps;  ///< forward order: steps.front() reads the source's output
};
LayoutPath findLayoutPath(const Value& value);

/// Where the path puts the source's feature axis `axis` (of a source output with `rank` and feature dim
/// `channels`): the axis of the path's last value, or nullopt with `whyNot` set (rank-unknown when a shape the
/// proof needs is not known, channel-axis-mismatch when the path merges or splits the feature dim).
std::optional<int64_t> mapFeatureAxis(const LayoutPath& path, int64_t rank, int64_t axis, int64_t channels,
                                      const RuleContext& context, MatchFailure* whyNot);

/// The first value on the path (the source's output side included) that another node reads or that is a graph
/// output, or null. `last` is the value the path ends on (read by the node after it).
const Value* sharedValueOnPath(const LayoutPath& path, const Value& last);

/// How many consecutive input features of the layer after `flatten` one channel of its input becomes (H*W for
/// an NCHW input), when `flatten` turns [N, C, ...] into [N, C*H*W]: Flatten with axis 1, or a Reshape to
/// [0, -1], [-1, C*H*W] or [N, -1]. The input's shape is read from the first of `sameShape` (values of the
/// flatten's input shape) whose shape is known; `source` (the channels' producer) names them in messages.
/// Nullopt with `whyNot` rank-unknown when the dims after the channel axis are not known, channel-axis-mismatch
/// when `flatten` does not give that form.
std::optional<int64_t> featuresPerChannel(const Node& source, std::initializer_list<const Value*> sameShape,
                                          const Node& flatten, const RuleContext& context, MatchFailure* whyNot);
/// The same with the flatten's input shape given (unknown dims as analysis::kUnknownDim): for a value whose shape
/// the rule derives itself, such as a spatial mean's [N, C, 1, 1].
std::optional<int64_t> featuresPerChannel(const Node& source, const std::optional<std::vector<int64_t>>& shape,
                                          const Node& flatten, const RuleContext& context, MatchFailure* whyNot);

}  // namespace bnfold::rules
