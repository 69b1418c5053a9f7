// Before:     Y, Mean?, InvStdDev? = LayerNormalization(X, scale, B?)          (also RMSNormalization,
//             GroupNormalization-18/-21, InstanceNormalization)
// After:      the op's own function body in primitives, in the model's opset form:
//               Xs = Cast(X, stash)                             (only when stash_type differs from X's type)
//               Mean = ReduceMean(Xs, axes);  D = Sub(Xs, Mean)  (RMSNormalization: D = Xs, no mean)
//               InvStdDev = Reciprocal(Sqrt(Add(ReduceMean(Mul(D, D), axes), eps)))
//               Y = Add(Mul(Cast(Mul(D, InvStdDev), T), scale), B)
//             GroupNormalization: on Reshape(Xs, [0, G, -1]) with axes [2], reshaped back to X's dims; the
//             per-group scale and bias of opset 18 are applied in the grouped view as [G, 1], the per-channel ones
//             of 21 after it as [C, 1, ..., 1]. InstanceNormalization: axes 2.., scale and bias as [C, 1, ..., 1].
// Conditions: off by default (for compilers and accelerators without these ops). X's element type known (the
//             Casts depend on it); stash_type a floating type. LayerNormalization/RMSNormalization with a
//             non-negative axis need X's rank (a negative axis is its own list of negative axes);
//             InstanceNormalization needs X's rank and opset >= 7 (before it Sub and Mul cannot broadcast the
//             kept statistics); GroupNormalization needs X's channel count, at most one unknown spatial dim (the
//             Reshape back writes -1 for it) and C divisible by num_groups. LayerNormalization's Mean and
//             InvStdDev outputs, when read, become the emitted statistics (in the stash type, as the spec says).
// Math:       the ONNX function bodies; the variance is E[(x - mean)^2] (population).

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "affine_layer.h"
#include "analysis/op_forms.h"
#include "analysis/shape_ops.h"
#include "analysis/value_shape.h"
#include "bnfold/dims_text.h"
#include "bnfold/rewrite/rewriter.h"
#include "opset_emit.h"
#include "rewrite/op_versions.h"
#include "rewrite/understood_ops.h"
#include "rules.h"

namespace bnfold::rules {
namespace {

enum class NormKind { Layer, Rms, Group, Instance };

struct NormDecomposition : Match {
  const Node* norm = nullptr;
  NormKind kind = NormKind::Layer;
  DataType type = DataType::Float;   // X's
  DataType stash = DataType::Float;  // the statistics'
  std::vector<int64_t> axes;         // reduced, in the (grouped) view the statistics are computed on
  double epsilon = 1e-5;
  int64_t groups = 0;
  std::vector<int64_t> restoreDims;  // GroupNormalization: Reshape back to X's dims
  std::vector<int64_t> paramAxes;    // Unsqueeze axes turning [C] (or [G]) into a broadcastable shape; may be empty
  bool perGroupAffine = false;
};

// Not Node::attributeFloat: the fallback stays a double (1e-5, not the float nearest it).
double floatAttributeOf(const Node& node, const std::string& name, double fallback) {
  const onnx::AttributeProto* attribute = node.attribute(name);
  return attribute && attribute->type() == onnx::AttributeProto::FLOAT ? static_cast<double>(attribute->f())
                                                                        : fallback;
}

bool isOutputRead(const Value* value) { return value && (value->hasUses() || value->isGraphOutput()); }

std::vector<int64_t> range(int64_t from, int64_t to) {
  std::vector<int64_t> values;
  for (int64_t v = from; v < to; ++v) values.push_back(v);
  return values;
}

/// Emits the nodes of one decomposition before the norm and remembers their op types for the report.
class Emitter {
 public:
  Emitter(Rewriter& rewriter, const Node& anchor)
      : rewriter_(rewriter),
        anchor_(anchor),
        names_{anchor.name().empty() ? anchor.output(0)->name() : anchor.name(), anchor.output(0)->name()} {}

  Value* op(const std::string& type, const std::vector<const Value*>& inputs, const std::string& step,
            std::vector<onnx::AttributeProto> attributes = {}) {
    ops_.push_back(type);
    return rewriter_.createNode(&anchor_, type, inputs, {names_.value(step)}, names_.node(step), std::move(attributes))
        ->output(0);
  }
  const Value* castIfNeeded(const Value* value, DataType from, DataType to, const std::string& step) {
    if (from == to) return value;
    return op("Cast", {value}, step, {intAttribute("to", static_cast<int64_t>(to))});
  }
  Value* reduceMean(const Value* value, const std::vector<int64_t>& axes, const std::string& step) {
    ops_.push_back("ReduceMean");
    return emitReduceMean(rewriter_, &anchor_, value, axes, true, names_, step);
  }
  const Value* unsqueeze(const Value* value, const std::vector<int64_t>& axes, const std::string& step) {
    if (axes.empty()) return value;
    ops_.push_back("Unsqueeze");
    return emitUnsqueeze(rewriter_, &anchor_, value, axes, names_, step);
  }
  Value* reshape(const Value* value, const std::vector<int64_t>& dims, const std::string& step) {
    ops_.push_back("Reshape");
    return emitReshape(rewriter_, &anchor_, value, dims, names_, step);
  }
  Value* scalar(DataType type, double value, const std::string& step) {
    return addTensor(rewriter_, anchor_, type, {}, {value}, names_.value(step));
  }
  const std::vector<std::string>& ops() const { return ops_; }

 private:
  Rewriter& rewriter_;
  const Node& anchor_;
  EmitNames names_;
  std::vector<std::string> ops_;
};

struct Standardized {
  Value* normalized = nullptr;
  Value* mean = nullptr;  // null without mean subtraction
  Value* invStdDev = nullptr;
};

/// (x - mean) / sqrt(var + eps) over `axes` (x / sqrt(mean(x^2) + eps) without `subtractMean`).
Standardized standardize(Emitter& e, const Value* x, const std::vector<int64_t>& axes, double epsilon, DataType stash,
                         bool subtractMean) {
  Standardized s;
  const Value* centered = x;
  if (subtractMean) {
    s.mean = e.reduceMean(x, axes, "mean");
    centered = e.op("Sub", {x, s.mean}, "centered");
  }
  Value* squares = e.op("Mul", {centered, centered}, "squared");
  Value* variance = e.reduceMean(squares, axes, subtractMean ? "variance" : "mean_square");
  Value* shifted = e.op("Add", {variance, e.scalar(stash, epsilon, "epsilon")}, "variance_eps");
  Value* deviation = e.op("Sqrt", {shifted}, "std_dev");
  s.invStdDev = e.op("Reciprocal", {deviation}, "inv_std_dev");
  s.normalized = e.op("Mul", {centered, s.invStdDev}, "normalized");
  return s;
}

const OpVersions kLayerNormalizationOp{"LayerNormalization", {17}};
const OpVersions kRmsNormalizationOp{"RMSNormalization", {23}};
const OpVersions kGroupNormalizationOp{"GroupNormalization", {18, 21}};
const OpVersions kInstanceNormalizationOp{"InstanceNormalization", {1, 6, 22}};

class DecomposeNorm final : public Rule {
 public:
  const char* name() const override { return "norm-decompose"; }
  const char* summary() const override {
    return "Replace LayerNormalization, RMSNormalization, GroupNormalization and InstanceNormalization by the "
           "primitive ops of their ONNX function bodies";
  }
  std::vector<std::string> rootOps() const override {
    return {"LayerNormalization", "RMSNormalization", "GroupNormalization", "InstanceNormalization"};
  }
  std::vector<OpVersions> opVersions() const override {
    return {kLayerNormalizationOp, kRmsNormalizationOp, kGroupNormalizationOp, kInstanceNormalizationOp,
            kReduceMean, kSub, kMul, kAdd, kSqrt, kReciprocal, kCast, kReshape, kUnsqueeze};
  }
  bool enabledByDefault() const override { return false; }
  const char* failureSection() const override { return "norms_not_decomposed"; }

  MatchResult match(const Node& norm, const RuleContext& context) const override {
    auto match = std::make_unique<NormDecomposition>();
    const std::string& op = norm.opType();
    match->kind = op == "LayerNormalization"   ? NormKind::Layer
                  : op == "RMSNormalization"   ? NormKind::Rms
                  : op == "GroupNormalization" ? NormKind::Group
                                               : NormKind::Instance;
    const Value* x = norm.input(0);
    if (!x || !norm.input(1) || (match->kind != NormKind::Layer && match->kind != NormKind::Rms && !norm.input(2)))
      return MatchResult::failure(reason::kMissingInput, describe(norm) + " lacks a required input");
    std::optional<DataType> type = analysis::knownElementType(*x);
    if (!type) type = analysis::knownElementType(*norm.output(0));
    if (!type || !isFloatingPoint(*type))
      return MatchResult::failure(reason::kTypeUnknown, "the element type of the input of " + describe(norm) +
                                                          " is not known (or not a floating type): the Casts of "
                                                          "stash_type depend on it");
    match->type = *type;
    const bool hasStashType = match->kind == NormKind::Layer || match->kind == NormKind::Rms ||
                              (match->kind == NormKind::Group && context.opset() >= kGroupNormPerChannelOpset);
    match->stash = hasStashType ? static_cast<DataType>(norm.attributeInt("stash_type", 1)) : *type;
    if (!isFloatingPoint(match->stash))
      return MatchResult::failure(reason::kUnsupportedType, describe(norm) + " has stash_type " +
                                                              dataTypeName(match->stash) + ", not a floating type");
    match->epsilon = floatAttributeOf(norm, "epsilon", 1e-5);

    std::optional<std::vector<int64_t>> shape = context.knownShape(*x);
    if (!shape) shape = context.knownShape(*norm.output(0));
    const auto rank = shape ? static_cast<int64_t>(shape->size()) : int64_t{-1};
    switch (match->kind) {
      case NormKind::Layer:
      case NormKind::Rms: {
        const int64_t axis = norm.attributeInt("axis", -1);
        if (axis < 0) {
          match->axes = range(axis, 0);  // ReduceMean takes negative axes from opset 11; these ops are newer
        } else if (rank < 0) {
          return MatchResult::failure(reason::kRankUnknown, "the rank of the input of " + describe(norm) +
                                                              " is not known, so axis " + std::to_string(axis) +
                                                              " cannot be turned into the list of reduced axes");
        } else {
          if (axis >= rank)
            return MatchResult::failure(reason::kRankTooLow, describe(norm) + " normalizes from axis " +
                                                               std::to_string(axis) + " of a rank-" +
                                                               std::to_string(rank) + " input");
          match->axes = range(axis, rank);
        }
        break;
      }
      case NormKind::Instance:
        if (context.opset() < kNumpyBroadcastOpset)
          return MatchResult::failure(reason::kUnsupportedOpset,
                                      describe(norm) + ": before opset 7 Sub and Mul cannot broadcast the per-"
                                                       "instance statistics (legacy broadcasting does not expand "
                                                       "size-1 dims), so the decomposition cannot be written");
        if (rank < 3)
          return MatchResult::failure(rank < 0 ? reason::kRankUnknown : reason::kRankTooLow,
                                      "the input of " + describe(norm) +
                                          (rank < 0 ? " has no known rank" : " has rank " + std::to_string(rank)) +
                                          ": the spatial axes to reduce are not known");
        match->axes = range(2, rank);
        match->paramAxes = range(1, rank - 1);
        break;
      case NormKind::Group: {
        const int64_t channels = rank >= 2 ? (*shape)[1] : analysis::kUnknownDim;
        int64_t unknownSpatial = 0;
        for (int64_t d = 2; d < rank; ++d) unknownSpatial += (*shape)[static_cast<std::size_t>(d)] == analysis::kUnknownDim;
        if (channels == analysis::kUnknownDim || unknownSpatial > 1)
          return MatchResult::failure(reason::kRankUnknown,
                                      "the dims of the input of " + describe(norm) +
                                          (shape ? " are " + formatDims(*shape) : std::string(" are not known")) +
                                          ": reshaping the groups back needs the channel count and all but one "
                                          "spatial dim");
        match->groups = norm.attributeInt("num_groups", 0);
        if (match->groups <= 0 || channels % match->groups != 0)
          return MatchResult::failure(reason::kParamShapeMismatch,
                                      describe(norm) + ": " + std::to_string(channels) + " channels do not split into " +
                                          std::to_string(match->groups) + " groups");
        match->axes = {2};
        match->restoreDims = {0, channels};
        for (int64_t d = 2; d < rank; ++d) match->restoreDims.push_back((*shape)[static_cast<std::size_t>(d)]);
        match->perGroupAffine = context.opset() < kGroupNormPerChannelOpset;
        match->paramAxes = match->perGroupAffine ? std::vector<int64_t>{1} : range(1, rank - 1);
        break;
      }
    }
    match->norm = &norm;
    return MatchResult::success(std::move(match));
  }

  void rewrite(Match& base, Rewriter& rewriter) const override {
    auto& match = static_cast<NormDecomposition&>(base);
    const Node& norm = *match.norm;
    Emitter e(rewriter, norm);
    const Value* x = e.castIfNeeded(norm.input(0), match.type, match.stash, "stashed");
    const Value* scale = norm.input(1);
    const Value* bias = norm.input(2);
    Value* y = nullptr;
    Standardized s;
    switch (match.kind) {
      case NormKind::Layer:
      case NormKind::Rms: {
        s = standardize(e, x, match.axes, match.epsilon, match.stash, match.kind == NormKind::Layer);
        const Value* normalized = e.castIfNeeded(s.normalized, match.stash, match.type, "normalized_cast");
        y = e.op("Mul", {normalized, scale}, "scaled");
        if (bias) y = e.op("Add", {y, bias}, "shifted");
        break;
      }
      case NormKind::Instance: {
        s = standardize(e, x, match.axes, match.epsilon, match.stash, true);
        y = e.op("Mul", {s.normalized, e.unsqueeze(scale, match.paramAxes, "scale")}, "scaled");
        y = e.op("Add", {y, e.unsqueeze(bias, match.paramAxes, "bias")}, "shifted");
        break;
      }
      case NormKind::Group: {
        const Value* grouped = e.reshape(x, {0, match.groups, -1}, "grouped");
        s = standardize(e, grouped, match.axes, match.epsilon, match.stash, true);
        const Value* normalized = e.castIfNeeded(s.normalized, match.stash, match.type, "normalized_cast");
        if (match.perGroupAffine) {
          Value* scaled = e.op("Mul", {normalized, e.unsqueeze(scale, match.paramAxes, "scale")}, "scaled");
          Value* shifted = e.op("Add", {scaled, e.unsqueeze(bias, match.paramAxes, "bias")}, "shifted");
          y = e.reshape(shifted, match.restoreDims, "ungrouped");
        } else {
          Value* restored = e.reshape(normalized, match.restoreDims, "ungrouped");
          y = e.op("Mul", {restored, e.unsqueeze(scale, match.paramAxes, "scale")}, "scaled");
          y = e.op("Add", {y, e.unsqueeze(bias, match.paramAxes, "bias")}, "shifted");
        }
        break;
      }
    }
    nlohmann::json entry = {{"node", norm.name()},
                            {"op", norm.opType()},
                            {"graph", norm.graph()->name()},
                            {"epsilon", match.epsilon},
                            {"axes", match.axes},
                            {"stash_type", dataTypeName(match.stash)},
                            {"ops", e.ops()}};
    if (match.kind == NormKind::Group) entry["num_groups"] = match.groups;
    std::vector<std::string> keptOutputs;
    if (match.kind == NormKind::Layer) {
      if (isOutputRead(norm.output(1))) {
        keptOutputs.push_back("Mean");
        rewriter.replaceValueKeepingName(norm.output(1), s.mean);
      }
      if (isOutputRead(norm.output(2))) {
        keptOutputs.push_back("InvStdDev");
        rewriter.replaceValueKeepingName(norm.output(2), s.invStdDev);
      }
    }
    entry["statistics_outputs"] = keptOutputs;
    rewriter.replaceValueKeepingName(norm.output(0), y);
    rewriter.record("norms_decomposed", std::move(entry));
  }
};

}  // namespace

std::unique_ptr<Rule> makeDecomposeNorm() { return std::make_unique<DecomposeNorm>(); }

}  // namespace bnfold::rules
