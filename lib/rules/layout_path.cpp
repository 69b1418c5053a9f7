#include "layout_path.h"

#include <algorithm>
#include <functional>
#include <string>
#include <unordered_map>

#include "affine_layer.h"
#include "bnfold/dims_text.h"
#include "value_shape.h"

namespace bnfold::rules {
namespace {

using Dims = std::vector<int64_t>;

// A path longer than this is not followed (exporters write one to three layout ops).
constexpr std::size_t kMaxSteps = 16;

bool known(const Dims& dims, std::size_t from = 0) {
  return std::all_of(dims.begin() + static_cast<std::ptrdiff_t>(std::min(from, dims.size())), dims.end(),
                     [](int64_t d) { return d != kUnknownDim; });
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

/// The integers of an axes/shape operand: input `slot` when present (a constant), else attribute `attribute`.
std::optional<std::vector<int64_t>> intsOperand(const Node& node, std::size_t slot, const char* attribute,
                                                const RuleContext& context) {
  if (const Value* input = node.input(slot)) {
    const Tensor* tensor = context.constantOf(input);
    if (!tensor) return std::nullopt;
    return tensor->toInt64s();
  }
  return node.attributeInts(attribute);
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
  const auto rank = static_cast<int64_t>(in.dims.size());
  std::vector<int64_t> perm = node.attributeInts("perm");
  if (perm.empty())
    for (int64_t i = rank - 1; i >= 0; --i) perm.push_back(i);
  if (static_cast<int64_t>(perm.size()) != rank) {
    *whyNot = {reason::kChannelAxisMismatch, describe(node) + " has a perm of another rank than its input"};
    return std::nullopt;
  }
  AxisState out{Dims(perm.size()), -1};
  for (std::size_t j = 0; j < perm.size(); ++j) {
    if (perm[j] < 0 || perm[j] >= rank) {
      *whyNot = {reason::kChannelAxisMismatch, describe(node) + " has an invalid perm"};
      return std::nullopt;
    }
    out.dims[j] = in.dims[static_cast<std::size_t>(perm[j])];
    if (perm[j] == in.axis) out.axis = static_cast<int64_t>(j);
  }
  return out;
}

std::optional<AxisState> unsqueezeStep(const Node& node, const AxisState& in, int64_t, const RuleContext& context,
                                       MatchFailure* whyNot) {
  auto axes = intsOperand(node, 1, "axes", context);
  if (!axes || axes->empty()) {
    *whyNot = {reason::kRankUnknown, "the axes of " + describe(node) + " are not known constants"};
    return std::nullopt;
  }
  const auto rank = static_cast<int64_t>(in.dims.size() + axes->size());
  std::vector<bool> inserted(static_cast<std::size_t>(rank), false);
  for (int64_t a : *axes) {
    a = a < 0 ? a + rank : a;
    // A repeated axis would leave fewer input dims than the output has places for (the model is invalid too).
    if (a < 0 || a >= rank || inserted[static_cast<std::size_t>(a)]) {
      *whyNot = {reason::kChannelAxisMismatch, describe(node) + " has an invalid or repeated axis"};
      return std::nullopt;
    }
    inserted[static_cast<std::size_t>(a)] = true;
  }
  AxisState out{{}, -1};
  int64_t next = 0;
  for (int64_t i = 0; i < rank; ++i) {
    if (inserted[static_cast<std::size_t>(i)]) {
      out.dims.push_back(1);
      continue;
    }
    if (next == in.axis) out.axis = i;
    out.dims.push_back(in.dims[static_cast<std::size_t>(next++)]);
  }
  return out;
}

std::optional<AxisState> squeezeStep(const Node& node, const AxisState& in, int64_t, const RuleContext& context,
                                     MatchFailure* whyNot) {
  auto axes = intsOperand(node, 1, "axes", context);
  if (!axes) {
    *whyNot = {reason::kRankUnknown, "the axes of " + describe(node) + " are not known constants"};
    return std::nullopt;
  }
  const auto rank = static_cast<int64_t>(in.dims.size());
  std::vector<bool> removed(in.dims.size(), false);
  if (axes->empty()) {
    // Every dim of size 1 goes: all dims must be known.
    if (!known(in.dims)) {
      *whyNot = {reason::kRankUnknown, "the input dims of " + describe(node) + ", which squeezes every dim of size 1, "
                                                                         "are not known"};
      return std::nullopt;
    }
    for (std::size_t i = 0; i < in.dims.size(); ++i) removed[i] = in.dims[i] == 1;
  }
  for (int64_t a : *axes) {
    a = a < 0 ? a + rank : a;
    if (a < 0 || a >= rank) {
      *whyNot = {reason::kChannelAxisMismatch, describe(node) + " has an invalid axis"};
      return std::nullopt;
    }
    removed[static_cast<std::size_t>(a)] = true;
  }
  if (removed[static_cast<std::size_t>(in.axis)]) {
    *whyNot = {reason::kChannelAxisMismatch, describe(node) + " removes the channel axis"};
    return std::nullopt;
  }
  AxisState out{{}, -1};
  for (std::size_t i = 0; i < in.dims.size(); ++i) {
    if (removed[i]) continue;
    if (static_cast<int64_t>(i) == in.axis) out.axis = static_cast<int64_t>(out.dims.size());
    out.dims.push_back(in.dims[i]);
  }
  return out;
}

std::optional<AxisState> flattenStep(const Node& node, const AxisState& in, int64_t channels, const RuleContext&,
                                     MatchFailure* whyNot) {
  const auto rank = static_cast<int64_t>(in.dims.size());
  int64_t axis = node.attributeInt("axis", 1);
  if (axis < 0) axis += rank;
  Dims out(2, kUnknownDim);
  const Dims front(in.dims.begin(), in.dims.begin() + std::clamp<int64_t>(axis, 0, rank));
  if (known(front)) out[0] = product(front, 0);
  if (known(in.dims, static_cast<std::size_t>(std::max<int64_t>(axis, 0))))
    out[1] = product(in.dims, static_cast<std::size_t>(std::max<int64_t>(axis, 0)));
  auto mapped = reshapedAxis(node, in, out, channels, whyNot);
  if (!mapped) return std::nullopt;
  return AxisState{out, *mapped};
}

std::optional<AxisState> reshapeStep(const Node& node, const AxisState& in, int64_t channels,
                                     const RuleContext& context, MatchFailure* whyNot) {
  auto shape = intsOperand(node, 1, "shape", context);
  if (!shape) {
    *whyNot = {reason::kRankUnknown, "the target shape of " + describe(node) + " is not a known constant"};
    return std::nullopt;
  }
  const bool allowZero = node.attributeInt("allowzero", 0) != 0;
  Dims out;
  int inferred = -1;
  for (std::size_t i = 0; i < shape->size(); ++i) {
    const int64_t d = (*shape)[i];
    if (d == 0 && !allowZero) out.push_back(i < in.dims.size() ? in.dims[i] : kUnknownDim);
    else if (d == -1) {
      inferred = static_cast<int>(i);
      out.push_back(kUnknownDim);
    } else {
      out.push_back(d);
    }
  }
  if (inferred >= 0 && known(in.dims)) {
    Dims others = out;
    others.erase(others.begin() + inferred);
    if (known(others) && product(others, 0) != 0) out[static_cast<std::size_t>(inferred)] = product(in.dims, 0) / product(others, 0);
  }
  auto mapped = reshapedAxis(node, in, out, channels, whyNot);
  if (!mapped) return std::nullopt;
  return AxisState{out, *mapped};
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
  AxisState state{Dims(static_cast<std::size_t>(rank), kUnknownDim), axis};
  state.dims[static_cast<std::size_t>(axis)] = channels;
  auto fillFrom = [](AxisState& s, const Value* value) {
    if (!value) return;
    auto declared = knownShape(*value);
    if (!declared || declared->size() != s.dims.size()) return;
    for (std::size_t i = 0; i < s.dims.size(); ++i)
      if (s.dims[i] == kUnknownDim) s.dims[i] = (*declared)[i];
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

}  // namespace bnfold::rules
