#include "layout_path.h"

#include <algorithm>
#include <functional>
#include <string>
#include <unordered_map>

#include "affine_layer.h"
#include "bnfold/dims_text.h"
#include "analysis/op_forms.h"
#include "analysis/shape_ops.h"
#include "analysis/value_shape.h"

namespace bnfold::rules {
namespace {

using Dims = std::vector<int64_t>;

// A path longer than this is not followed (exporters write one to three layout ops).
constexpr std::size_t kMaxSteps = 16;

bool known(const Dims& dims, std::size_t from = 0) {
  return std::all_of(dims.begin() + static_cast<std::ptrdiff_t>(std::min(from, dims.size())), dims.end(),
                     [](int64_t d) { return d != analysis::kUnknownDim; });
}

// INT64_MAX when the dims' product does not fit (shapes come from the file), which no real dim matches.
int64_t product(const Dims& dims, std::size_t from) {
  return saturatingElementCount(Dims(dims.begin() + static_cast<std::ptrdiff_t>(std::min(from, dims.size())), dims.end()));
}

/// Where a step leaves the feature axis: the axis and the dims of its output as far as known.
struct AxisState {
  Dims dims;
  int64_t axis;
};

/// The integers of an axes/shape operand at the model's opset: input `slot` (a constant) from `inputOpset` on, else
/// attribute `attribute`.
std::optional<std::vector<int64_t>> intsOperand(const Node& node, std::size_t slot, const char* attribute,
                                                int64_t inputOpset, const RuleContext& context) {
  if (context.opset() < inputOpset) return node.attributeInts(attribute);
  const Value* input = node.input(slot);
  if (!input) return std::vector<int64_t>{};
  return context.integersOf(input);
}

/// Where a step that carries axes one to one (Transpose, Squeeze, Unsqueeze) puts input axis `axis`, or -1.
int64_t carriedAxis(const analysis::OutputShape& out, int64_t axis) {
  auto at = std::find(out.sourceAxis.begin(), out.sourceAxis.end(), axis);
  return at == out.sourceAxis.end() ? -1 : static_cast<int64_t>(at - out.sourceAxis.begin());
}

/// An output shape the model's own operands contradict is not known.
MatchFailure unformedShape(const Node& node, const analysis::OutputShape& out) {
  return {reason::kRankUnknown, "the output shape of " + describe(node) + " is not known: it " + out.message};
}

/// The feature axis after a reshape from `in` to `out`: the axis holding a dim of `channels` with as many elements
/// after it as there were after `axis` in `in` (so every element keeps its channel).
std::optional<int64_t> reshapedAxis(const Node& node, const AxisState& in, const Dims& out, int64_t channels,
                                    MatchFailure* whyNot) {
  if (!known(in.dims, static_cast<std::size_t>(in.axis) + 1)) {
    *whyNot = {reason::kRankUnknown, "the dims after the channel axis of the input of " + describe(node) +
                                   " are not known, so it cannot be proven to keep the channels apart"};
    return std::nullopt;
  }
  const int64_t after = product(in.dims, static_cast<std::size_t>(in.axis) + 1);
  for (std::size_t j = 0; j < out.size(); ++j)
    if (out[j] == channels && known(out, j + 1) && product(out, j + 1) == after) return static_cast<int64_t>(j);
  if (!known(out)) {
    *whyNot = {reason::kRankUnknown, "the output shape of " + describe(node) + " is not known, so it cannot be proven to "
                                                                         "keep the channel axis"};
  } else {
    *whyNot = {reason::kChannelAxisMismatch, describe(node) + " reshapes " + formatDims(in.dims) + " to " +
                                            formatDims(out) + ", which merges or splits the " +
                                            std::to_string(channels) + " channels of axis " +
                                            std::to_string(in.axis)};
  }
  return std::nullopt;
}

using StepFunction =
    std::function<std::optional<AxisState>(const Node&, const AxisState&, int64_t, const RuleContext&, MatchFailure*)>;

std::optional<AxisState> identityStep(const Node&, const AxisState& in, int64_t, const RuleContext&, MatchFailure*) {
  return in;
}

std::optional<AxisState> transposeStep(const Node& node, const AxisState& in, int64_t, const RuleContext&,
                                       MatchFailure* whyNot) {
  const analysis::OutputShape out = analysis::transposeShape(in.dims, node.attributeInts("perm"));
  if (!out.ok()) {
    *whyNot = {reason::kChannelAxisMismatch,
               describe(node) + (out.problem == analysis::ShapeProblem::kPermRankMismatch
                                     ? " has a perm of another rank than its input"
                                     : " has an invalid perm")};
    return std::nullopt;
  }
  return AxisState{out.dims, carriedAxis(out, in.axis)};
}

std::optional<AxisState> unsqueezeStep(const Node& node, const AxisState& in, int64_t, const RuleContext& context,
                                       MatchFailure* whyNot) {
  auto axes = intsOperand(node, 1, "axes", kSqueezeAxesInputOpset, context);
  if (!axes || axes->empty()) {
    *whyNot = {reason::kRankUnknown, "the axes of " + describe(node) + " are not known constants"};
    return std::nullopt;
  }
  const analysis::OutputShape out = analysis::unsqueezeShape(in.dims, *axes);
  if (!out.ok()) {
    *whyNot = {reason::kChannelAxisMismatch, describe(node) + " has an invalid or repeated axis"};
    return std::nullopt;
  }
  return AxisState{out.dims, carriedAxis(out, in.axis)};
}

std::optional<AxisState> squeezeStep(const Node& node, const AxisState& in, int64_t, const RuleContext& context,
                                     MatchFailure* whyNot) {
  auto axes = intsOperand(node, 1, "axes", kSqueezeAxesInputOpset, context);
  if (!axes) {
    *whyNot = {reason::kRankUnknown, "the axes of " + describe(node) + " are not known constants"};
    return std::nullopt;
  }
  const analysis::OutputShape out = analysis::squeezeShape(in.dims, *axes);
  if (out.problem == analysis::ShapeProblem::kUnknownInputDims) {
    *whyNot = {reason::kRankUnknown, "the input dims of " + describe(node) + ", which squeezes every dim of size 1, "
                                                                       "are not known"};
    return std::nullopt;
  }
  const bool removesChannels = out.ok() ? carriedAxis(out, in.axis) < 0
                                        : out.problem == analysis::ShapeProblem::kSqueezesNonUnitDim &&
                                              out.problemAxis == in.axis;
  if (removesChannels) {
    *whyNot = {reason::kChannelAxisMismatch, describe(node) + " removes the channel axis"};
    return std::nullopt;
  }
  if (!out.ok()) {
    *whyNot = {reason::kChannelAxisMismatch, describe(node) + " has an invalid axis"};
    return std::nullopt;
  }
  return AxisState{out.dims, carriedAxis(out, in.axis)};
}

std::optional<AxisState> flattenStep(const Node& node, const AxisState& in, int64_t channels, const RuleContext&,
                                     MatchFailure* whyNot) {
  const analysis::OutputShape out = analysis::flattenShape(in.dims, node.attributeInt("axis", 1));
  if (!out.ok()) {
    *whyNot = unformedShape(node, out);
    return std::nullopt;
  }
  auto mapped = reshapedAxis(node, in, out.dims, channels, whyNot);
  if (!mapped) return std::nullopt;
  return AxisState{out.dims, *mapped};
}

std::optional<AxisState> reshapeStep(const Node& node, const AxisState& in, int64_t channels,
                                     const RuleContext& context, MatchFailure* whyNot) {
  auto shape = intsOperand(node, 1, "shape", kReshapeShapeInputOpset, context);
  if (!shape) {
    *whyNot = {reason::kRankUnknown, "the target shape of " + describe(node) + " is not a known constant"};
    return std::nullopt;
  }
  const analysis::OutputShape out =
      analysis::reshapeShape(in.dims, *shape, analysis::reshapeAllowsZero(node));
  if (!out.ok()) {
    *whyNot = unformedShape(node, out);
    return std::nullopt;
  }
  auto mapped = reshapedAxis(node, in, out.dims, channels, whyNot);
  if (!mapped) return std::nullopt;
  return AxisState{out.dims, *mapped};
}

const std::unordered_map<std::string, StepFunction>& stepTable() {
  static const std::unordered_map<std::string, StepFunction> table = {
      {"Identity", identityStep}, {"Transpose", transposeStep}, {"Unsqueeze", unsqueezeStep},
      {"Squeeze", squeezeStep},   {"Flatten", flattenStep},     {"Reshape", reshapeStep},
  };
  return table;
}

}  // namespace

bool isLayoutOp(const Node& node) {
  return node.isOnnxDomain() && stepTable().count(node.opType()) != 0;
}

LayoutPath findLayoutPath(const Value& value) {
  LayoutPath path;
  const Value* current = &value;
  while (current && current->producer() && isLayoutOp(*current->producer()) && path.steps.size() < kMaxSteps &&
         current->producer()->graph() == value.graph()) {
    path.steps.insert(path.steps.begin(), current->producer());
    current = current->producer()->input(0);
  }
  path.source = current ? current->producer() : nullptr;
  return path;
}

const Value* sharedValueOnPath(const LayoutPath& path, const Value& last) {
  for (const Node* step : path.steps) {
    const Value* in = step->input(0);
    if (in && (in->isGraphOutput() || in->uses().size() != 1)) return in;
  }
  if (last.isGraphOutput() || last.uses().size() != 1) return &last;
  return nullptr;
}

std::optional<int64_t> mapFeatureAxis(const LayoutPath& path, int64_t rank, int64_t axis, int64_t channels,
                                      const RuleContext& context, MatchFailure* whyNot) {
  AxisState state{Dims(static_cast<std::size_t>(rank), analysis::kUnknownDim), axis};
  state.dims[static_cast<std::size_t>(axis)] = channels;
  auto fillFrom = [&context](AxisState& s, const Value* value) {
    if (!value) return;
    auto declared = context.knownShape(*value);
    if (!declared || declared->size() != s.dims.size()) return;
    for (std::size_t i = 0; i < s.dims.size(); ++i)
      if (s.dims[i] == analysis::kUnknownDim) s.dims[i] = (*declared)[i];
  };
  if (!path.steps.empty()) fillFrom(state, path.steps.front()->input(0));
  for (const Node* step : path.steps) {
    auto next = stepTable().at(step->opType())(*step, state, channels, context, whyNot);
    if (!next) return std::nullopt;
    state = std::move(*next);
    fillFrom(state, step->output(0));
  }
  return state.axis;
}

std::optional<int64_t> featuresPerChannel(const Node& source, std::initializer_list<const Value*> sameShape,
                                          const Node& flatten, const RuleContext& context, MatchFailure* whyNot) {
  std::optional<Dims> shape;
  for (const Value* value : sameShape)
    if (value && !shape) shape = context.knownShape(*value);
  return featuresPerChannel(source, shape, flatten, context, whyNot);
}

std::optional<int64_t> featuresPerChannel(const Node& source, const std::optional<Dims>& shape, const Node& flatten,
                                          const RuleContext& context, MatchFailure* whyNot) {
  if (!shape || shape->size() < 2 || !known(*shape, 2)) {
    *whyNot = {reason::kRankUnknown, "the dims after the channel axis of the output of " + describe(source) +
                                         " are not known, so the features each channel becomes after " +
                                         describe(flatten) + " are not known"};
    return std::nullopt;
  }
  const int64_t block = product(*shape, 2);
  const int64_t channels = (*shape)[1];
  bool keepsBatch = false;
  if (flatten.isOnnxOp("Flatten")) {
    const int64_t axis = flatten.attributeInt("axis", 1);
    keepsBatch = axis == 1 || axis == 1 - static_cast<int64_t>(shape->size());
  } else if (const std::optional<std::vector<int64_t>> target = context.integersOf(flatten.input(1))) {
    const std::vector<int64_t>& dims = *target;
    const bool allowZero = analysis::reshapeAllowsZero(flatten);
    const bool copiesBatch =
        dims.size() == 2 &&
        ((dims[0] == 0 && !allowZero) || ((*shape)[0] != analysis::kUnknownDim && dims[0] == (*shape)[0]));
    keepsBatch = dims.size() == 2 &&
                 ((channels != analysis::kUnknownDim && dims[1] == checkedProduct(channels, block)) ||
                  (dims[1] == -1 && copiesBatch));
  }
  if (!keepsBatch) {
    *whyNot = {reason::kChannelAxisMismatch, describe(flatten) + " does not turn the output of " + describe(source) +
                                                 " into [batch, channels * " + std::to_string(block) +
                                                 "], so a channel is not a block of the next layer's input features"};
    return std::nullopt;
  }
  return block;
}

}  // namespace bnfold::rules
