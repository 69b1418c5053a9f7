// Before:     Y = BatchNormalization(X, s, b, m, v)                (inference mode, not foldable into a layer)
// After:      Y = Add(Mul(X, k), t)                                                      (opset 7 and later)
//             Y = Add(Mul(X, k, broadcast=1, axis=1), t, broadcast=1, axis=1)           (opsets 1 and 6)
// Conditions: inference-mode BN (opsets 1/6: is_test=1) with constant, finite params and v + eps > 0; X's
//             element type known (from opset 15 the params may have another type than X). Off by default: it
//             only helps runtimes without a BatchNormalization kernel, as TVM's SimplifyInference does.
//             Opset 7+: numpy broadcasting aligns shapes from the last axis, so a plain [C] would land on the
//             last axis: X's rank must be known, and k and t are shaped [C, 1, ..., 1] (rank of X minus 1).
//             Opsets 1/6: Mul and Add broadcast only when told (`broadcast=1`), aligning the right operand's
//             shape with X's from `axis`; axis=1 puts [C] on the channel axis whatever X's rank, so the rank
//             need not be known. Legacy broadcasting cannot expand size-1 dims, so spatial=0 params must have
//             exactly X's dims after N (checked when X's shape is known). The attributes are the same in
//             Mul-1/Add-1 (whose `consumed_inputs` is optional and left out) and Mul-6/Add-6.
//             spatial=0 params [C, D1, ...] (one value per element of a sample) are used as they are: they
//             line up with X's trailing axes under numpy broadcasting, and with axis=1 under legacy rules.
// Math:       k = s / sqrt(v + eps),  t = b - m * k   (computed in double, rounded once to X's type)

#include <memory>

#include "affine_layer.h"
#include "batch_norm_params.h"
#include "bnfold/dims_text.h"
#include "bnfold/rewrite/rewriter.h"
#include "opset_emit.h"
#include "rules.h"
#include "rewrite/understood_ops.h"
#include "analysis/value_shape.h"
#include "rewrite/op_versions.h"

namespace bnfold::rules {
namespace {

// Multidirectional (numpy) broadcasting arrived in opset 7; before it, Mul and Add broadcast only with
// `broadcast=1`, aligning the right operand's shape with the left one's from `axis`.

struct Decomposition : Match {
  const Node* bn = nullptr;
  bool legacyBroadcast = false;
  InferenceBatchNorm params;
  std::vector<int64_t> constantDims;
  DataType type = DataType::Float;
};

// Legacy broadcasting with axis=1: the constant's dims are X's dims 1, 2, ... exactly (no size-1 expansion).
// Dims of X that are not known are taken to match.
bool legacyBroadcastable(const std::vector<int64_t>& inputDims, const std::vector<int64_t>& constantDims) {
  if (constantDims.size() + 1 > inputDims.size()) return false;
  for (std::size_t i = 0; i < constantDims.size(); ++i) {
    const int64_t dim = inputDims[i + 1];
    if (dim != analysis::kUnknownDim && dim != constantDims[i]) return false;
  }
  return true;
}

class DecomposeBatchNorm final : public Rule {
 public:
  const char* name() const override { return "bn-decompose"; }
  const char* summary() const override {
    return "Replace an inference-mode BatchNormalization left in place by Mul and Add of per-channel constants";
  }
  std::vector<std::string> rootOps() const override { return {"BatchNormalization"}; }
  std::vector<OpVersions> opVersions() const override { return {kBatchNormalization, kMul, kAdd}; }
  bool enabledByDefault() const override { return false; }

  MatchResult match(const Node& bn, const RuleContext& context) const override {
    MatchFailure why;
    auto params = readInferenceBatchNorm(bn, context, PerElementParams::Keep, &why);
    if (!params) return MatchResult::failure(why.code, why.message);
    const Value* x = bn.input(0);

    auto match = std::make_unique<Decomposition>();
    match->legacyBroadcast = context.opset() < kNumpyBroadcastOpset;
    std::optional<std::vector<int64_t>> shape = context.knownShape(*x);
    if (!shape) shape = context.knownShape(*bn.output(0));
    if (match->legacyBroadcast) {
      // axis=1 aligns the constants with X's axes from the channel axis on, whatever X's rank.
      if (shape && shape->size() < 2)
        return MatchResult::failure(reason::kRankUnknown, "the input of " + describe(bn) + " has rank " +
                                                        std::to_string(shape->size()) + ", so it has no channel axis");
      if (shape && !legacyBroadcastable(*shape, params->paramDims))
        return MatchResult::failure(reason::kParamShapeMismatch,
                                    "the parameters of " + describe(bn) + " have dims " +
                                        formatDims(params->paramDims) + ", which do not match the dims " +
                                        formatDims(*shape) + " of its input from axis 1 on, as opset-" +
                                        std::to_string(context.opset()) +
                                        " broadcasting (broadcast=1, axis=1) needs");
      match->constantDims = params->paramDims;
    } else if (params->paramDims.size() > 1) {
      // One value per element of a sample: [C, D1, ...] lines up with X's trailing axes as it is.
      match->constantDims = params->paramDims;
    } else {
      if (!shape || shape->size() < 2)
        return MatchResult::failure(reason::kRankUnknown, "the rank of the input of " + describe(bn) +
                                                        " is not known, so per-channel constants cannot be shaped "
                                                        "to broadcast over its channel axis");
      match->constantDims.assign(shape->size() - 1, 1);
      match->constantDims[0] = params->channels;
    }
    // Mul and Add need constants of X's type; before opset 15 the params share it.
    std::optional<DataType> type = context.constantOf(params->paramValues[0])->dataType();
    if (context.opset() >= kBatchNormMixedTypesOpset) {
      type = analysis::knownElementType(*x);
      if (!type) type = analysis::knownElementType(*bn.output(0));
    }
    if (!type || !isFloatingPoint(*type))
      return MatchResult::failure(reason::kTypeUnknown, "the element type of the input of " + describe(bn) +
                                                      " is not known (or not a floating type), and from opset 15 "
                                                      "it may differ from the parameters'");
    match->type = *type;
    match->bn = &bn;
    match->params = std::move(*params);
    return MatchResult::success(std::move(match));
  }

  void rewrite(Match& base, Rewriter& rewriter) const override {
    auto& match = static_cast<Decomposition&>(base);
    const Node& bn = *match.bn;
    const Value* y = bn.output(0);
    const std::string valueBase = y->name();
    Value* scale = addTensor(rewriter, bn, match.type, match.constantDims, match.params.affine.scale,
                             bn.name() + "_scale");
    Value* shift = addTensor(rewriter, bn, match.type, match.constantDims, match.params.affine.shift,
                             bn.name() + "_shift");
    // Before opset 7 the constants broadcast only when told, aligned at the channel axis.
    const int64_t opset = modelOpset(rewriter);
    Node* mul = rewriter.createNode(&bn, "Mul", {bn.input(0), scale}, {valueBase + "_scaled"}, bn.name() + "/mul",
                                    broadcastAttributes(opset, 1));
    Node* add = rewriter.createNode(&bn, "Add", {mul->output(0), shift}, {valueBase + "_shifted"}, bn.name() + "/add",
                                    broadcastAttributes(opset, 1));
    ReportRecord entry = describeBatchNorm(bn, match.params);
    rewriter.replaceValueKeepingName(y, add->output(0));
    entry.setText("mul", mul->name());
    entry.setText("add", add->name());
    entry.setText("scale_tensor", scale->name());
    entry.setText("shift_tensor", shift->name());
    entry.setJson("constant_dims", match.constantDims);
    if (match.legacyBroadcast) entry.setInteger("broadcast_axis", 1);
    entry.setNumbers("scale", match.params.affine.scale);
    entry.setNumbers("shift", match.params.affine.shift);
    rewriter.record("decomposed", std::move(entry));
  }
};

}  // namespace

std::unique_ptr<Rule> makeDecomposeBatchNorm() { return std::make_unique<DecomposeBatchNorm>(); }

}  // namespace bnfold::rules
