// Before:     Y = BatchNormalization(X, s, b, m, v)                (inference mode, not foldable into a layer)
// After:      Y = Add(Mul(X, k), t)
// Conditions: inference-mode BN with constant, finite params and v + eps > 0; X's rank known, so k and t can be
//             shaped [C, 1, ..., 1] (rank of X minus 1) to broadcast over the channel axis 1 — numpy broadcasting
//             aligns from the last axis, so a plain [C] would land on the last axis; spatial=0 params
//             [C, D1, ...] already have the shape of one sample and are used as they are; X's element type
//             known (from opset 15 the params may have another type than X). Off by default: it only helps
//             runtimes without a BatchNormalization kernel, as TVM's SimplifyInference does.
// Math:       k = s / sqrt(v + eps),  t = b - m * k   (computed in double, rounded once to X's type)

#include <memory>

#include "affine_layer.h"
#include "batch_norm_params.h"
#include "bnfold/rewrite/rewriter.h"
#include "rules.h"
#include "value_shape.h"

namespace bnfold::rules {
namespace {

struct Decomposition : Match {
  const Node* bn = nullptr;
  InferenceBatchNorm params;
  std::vector<int64_t> constantDims;
  DataType type = DataType::Float;
};

std::string describe(const Node& node) { return node.opType() + " '" + node.name() + "'"; }

class DecomposeBatchNorm final : public Rule {
 public:
  const char* name() const override { return "bn-decompose"; }
  const char* summary() const override {
    return "Replace an inference-mode BatchNormalization left in place by Mul and Add of per-channel constants";
  }
  std::vector<std::string> rootOps() const override { return {"BatchNormalization"}; }
  // Before opset 7 Mul and Add broadcast only with `broadcast`/`axis` attributes.
  int64_t minOpset() const override { return 7; }
  bool enabledByDefault() const override { return false; }

  MatchResult match(const Node& bn, const RuleContext& context) const override {
    MatchFailure why;
    auto params = readInferenceBatchNorm(bn, context, PerElementParams::Keep, &why);
    if (!params) return MatchResult::failure(why.code, why.message);
    const Value* x = bn.input(0);

    auto match = std::make_unique<Decomposition>();
    if (params->paramDims.size() > 1) {
      // One value per element of a sample: [C, D1, ...] lines up with X's trailing axes as it is.
      match->constantDims = params->paramDims;
    } else {
      std::optional<std::vector<int64_t>> shape = knownShape(*x);
      if (!shape) shape = knownShape(*bn.output(0));
      if (!shape || shape->size() < 2)
        return MatchResult::failure("rank-unknown", "the rank of the input of " + describe(bn) +
                                                        " is not known, so per-channel constants cannot be shaped "
                                                        "to broadcast over its channel axis");
      match->constantDims.assign(shape->size() - 1, 1);
      match->constantDims[0] = params->channels;
    }
    // Mul and Add need constants of X's type; before opset 15 the params share it.
    std::optional<DataType> type = params->paramValues[0]->constantTensor()->dataType();
    if (context.opset() >= 15) {
      type = knownElementType(*x);
      if (!type) type = knownElementType(*bn.output(0));
    }
    if (!type || !isFloatingPoint(*type))
      return MatchResult::failure("unknown-type", "the element type of the input of " + describe(bn) +
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
    Node* mul = rewriter.createNode(&bn, "Mul", {bn.input(0), scale}, {valueBase + "_scaled"}, bn.name() + "/mul");
    Node* add = rewriter.createNode(&bn, "Add", {mul->output(0), shift}, {valueBase + "_shifted"}, bn.name() + "/add");
    nlohmann::json entry = describeBatchNorm(bn, match.params);
    rewriter.replaceValueKeepingName(y, add->output(0));
    entry["mul"] = mul->name();
    entry["add"] = add->name();
    entry["scale_tensor"] = scale->name();
    entry["shift_tensor"] = shift->name();
    entry["constant_dims"] = match.constantDims;
    entry["scale"] = match.params.affine.scale;
    entry["shift"] = match.params.affine.shift;
    rewriter.record("decomposed", std::move(entry));
  }
};

}  // namespace

std::unique_ptr<Rule> makeDecomposeBatchNorm() { return std::make_unique<DecomposeBatchNorm>(); }

}  // namespace bnfold::rules
