// Before:     Y = Mul(L(X, W, B?), k)    (or Mul(k, ...))   L = Conv | ConvTranspose | Gemm | MatMul   "after"
//             Y = L'(Mul(X, k), W, B?)   (or Mul(k, X))     L' = Conv | ConvTranspose | Gemm           "before"
// After:      Y = L(X, W', B'')                             Y = L'(X, W'', B?)
// Conditions: k constant; after: k per-channel for L's output (numpy broadcasting, shapes aligned from the last
//             axis) and L's output read only by the Mul, not a graph output; before: k per input channel of L'
//             (Conv/ConvTranspose: axis 1; Gemm: the K axis of A, axis 0 when transA), the Mul's output read
//             only by L' as its data input, and the Mul must not broadcast X to a bigger shape (X's shape must be
//             known where k could grow it). W, B constant; the layer in the Mul's graph; neither layer nor a
//             Constant node that goes away kept by the user.
// Math:       after:  W'[o] = W[o] * k[o], B''[o] = B[o] * k[o] (Gemm: C'' = beta * C * k, beta = 1)
//             before: W'' = W with every weight reading input channel c times k[c] (Conv: axis 1, in group
//             c / (C/group); ConvTranspose: axis 0; Gemm: the K axis of B). Exact even with zero padding: a
//             padded 0 scaled by k is still 0.

#include <memory>

#include "affine_layer.h"
#include "bnfold/dims_text.h"
#include "bnfold/rewrite/rewriter.h"
#include "rules.h"
#include "rewrite/understood_ops.h"

namespace bnfold::rules {
namespace {

struct ScaleFoldMatch : Match {
  const Node* mul = nullptr;
  AffineLayer layer;
  const Value* constant = nullptr;
  std::vector<double> scale;  // one value per output channel (after) or input channel (before)
  bool before = false;
  const Value* input = nullptr;  // before: the Mul's other operand, which the layer reads directly afterwards
};

class FoldScaleIntoWeights final : public Rule {
 public:
  const char* name() const override { return "scale-fold"; }
  const char* summary() const override {
    return "Per-channel constant Mul after a Conv/ConvTranspose/Gemm/MatMul, or before a Conv/ConvTranspose/Gemm, "
           "folded into its weights";
  }
  std::vector<std::string> rootOps() const override { return {"Mul"}; }
  std::vector<OpVersions> opVersions() const override {
    return joinOps({kMulNumpyBroadcast}, joinOps(layerOps(), layoutOps()));
  }
  // Before opset 7 Mul broadcasts with `broadcast`/`axis` attributes instead of numpy rules.

  MatchResult match(const Node& mul, const RuleContext& context) const override {
    MatchFailure afterWhy;
    if (auto match = matchAfterLayer(mul, context, &afterWhy)) return MatchResult::success(std::move(match));
    MatchFailure beforeWhy;
    if (auto match = matchBeforeLayer(mul, context, &beforeWhy)) return MatchResult::success(std::move(match));
    // Report the attempt that got furthest: a Mul that follows a layer is explained by the "after" reason.
    const MatchFailure& why = afterWhy.code == reason::kNoFoldableLayer ? beforeWhy : afterWhy;
    return MatchResult::failure(why.code, why.message);
  }

  void rewrite(Match& base, Rewriter& rewriter) const override {
    auto& match = static_cast<ScaleFoldMatch&>(base);
    const AffineLayer& layer = match.layer;
    nlohmann::json entry = {{"mul", match.mul->name()},
                            {"layer", layer.node->name()},
                            {"layer_op", layer.node->opType()},
                            {"position", match.before ? "before" : "after"},
                            {"constant", match.constant->name()},
                            {"scale", match.scale},
                            {"weight_before", layer.weightValue->name()}};
    const nlohmann::json biasBefore =
        layer.biasValue ? nlohmann::json(layer.biasValue->name()) : nlohmann::json(nullptr);
    entry["bias_before"] = biasBefore;
    entry["bias_after"] = biasBefore;
    if (match.before) {
      entry["weight_after"] = writeScaledWeight(rewriter, layer, ChannelSide::Input, match.scale, "_scaled");
      rewriter.setInput(layer.node, 0, match.input);
      rewriter.eraseNode(match.mul);
    } else {
      entry["weight_after"] = writeScaledWeight(rewriter, layer, ChannelSide::Output, match.scale, "_scaled");
      if (layer.biasSlot >= 0) {
        const std::vector<double> noShift(match.scale.size(), 0.0);
        if (auto bias = foldedBias(layer, {match.scale, noShift}))
          entry["bias_after"] = writeBias(rewriter, layer, *bias);
      }
      rewriter.replaceValueKeepingName(match.mul->output(0), layer.node->output(0));
    }
    rewriter.record("scale_folded", std::move(entry));
  }

 private:
  static std::unique_ptr<ScaleFoldMatch> failWith(MatchFailure* whyNot, ReasonCode code, std::string message) {
    *whyNot = {code, std::move(message)};
    return nullptr;
  }

  static std::unique_ptr<ScaleFoldMatch> matchAfterLayer(const Node& mul, const RuleContext& context,
                                                         MatchFailure* whyNot) {
    const int layerSlot = layerOperandSlot(mul, context);
    if (layerSlot < 0)
      return failWith(whyNot, reason::kNoFoldableLayer, "'" + mul.name() + "' does not multiply the output of a Conv, "
                                                   "ConvTranspose, Gemm or MatMul by a constant");
    const Value* layerOutput = mul.input(static_cast<std::size_t>(layerSlot));
    const Value* constant = mul.input(static_cast<std::size_t>(1 - layerSlot));
    const Node& layerNode = *layerOutput->producer();
    if (soleConsumer(*layerOutput) != &mul || layerOutput->producerOutputIndex() != 0)
      return failWith(whyNot, reason::kLayerHasOtherConsumers, "the output '" + layerOutput->name() + "' of '" +
                                                               layerNode.name() +
                                                               "' is read by other nodes too or is a graph output");
    if (layerNode.graph() != mul.graph())
      return failWith(whyNot, reason::kLayerInOtherGraph, "'" + mul.name() + "' is in a subgraph and reads '" +
                                                          layerNode.name() + "' from an enclosing graph");
    auto layer = readAffineLayer(layerNode, context, whyNot);
    if (!layer) return nullptr;
    const Tensor* tensor = context.constantOf(constant);
    int64_t rank = layer->outputRank;
    if (rank < 0) {
      // A MatMul output has rank >= 1 with its channels last, so a constant of rank <= 1 is safe to judge.
      if (tensor->rank() > 1)
        return failWith(whyNot, reason::kRankUnknown, "the rank of the output of '" + layerNode.name() +
                                                    "' is not known, so the broadcasting of '" + constant->name() +
                                                    "' cannot be checked");
      rank = 1;
    }
    const int64_t channelAxis = layer->isMatMul() ? rank - 1 : 1;
    auto scale = perChannelConstant(*constant, *tensor, rank, channelAxis, layer->outputChannels, whyNot);
    if (!scale) return nullptr;
    if (!hasLayerType(*constant, *tensor, *layer, whyNot) ||
        !noKeptConstantProducer(context, {constant, layer->weightValue, layer->biasValue}, whyNot))
      return nullptr;
    auto match = std::make_unique<ScaleFoldMatch>();
    match->mul = &mul;
    match->layer = *layer;
    match->constant = constant;
    match->scale = std::move(*scale);
    return match;
  }

  static std::unique_ptr<ScaleFoldMatch> matchBeforeLayer(const Node& mul, const RuleContext& context,
                                                          MatchFailure* whyNot) {
    const Value* output = mul.output(0);
    int consumerSlot = -1;
    const Node* consumer = output ? soleConsumer(*output, &consumerSlot) : nullptr;
    if (!consumer || consumerSlot != 0 ||
        !(consumer->isOnnxOp("Conv") || consumer->isOnnxOp("ConvTranspose") || consumer->isOnnxOp("Gemm")))
      return failWith(whyNot, reason::kNoFoldableLayer, "'" + mul.name() + "' is neither applied to a layer's output "
                                                   "nor read only by a Conv, ConvTranspose or Gemm as its data input");
    if (consumer->graph() != mul.graph())
      return failWith(whyNot, reason::kLayerInOtherGraph, "'" + mul.name() + "' is read by '" + consumer->name() +
                                                          "' in a subgraph");
    // The scale is the constant operand; prefer the second one as Mul(X, k) is the usual order.
    int constantSlot = -1;
    for (int slot : {1, 0})
      if (constantSlot < 0 && context.constantOf(mul.input(static_cast<std::size_t>(slot)))) constantSlot = slot;
    if (constantSlot < 0)
      return failWith(whyNot, reason::kOperandNotConstant, "neither operand of '" + mul.name() + "' is a constant");
    const Value* constant = mul.input(static_cast<std::size_t>(constantSlot));
    const Value* input = mul.input(static_cast<std::size_t>(1 - constantSlot));
    auto layer = readAffineLayer(*consumer, context, whyNot);
    if (!layer) return nullptr;

    // The layer's data input: Conv and ConvTranspose [N, C, ...] have the channels on axis 1; Gemm's A holds K
    // on axis 1, or on axis 0 when transA transposes it.
    const int64_t rank = layer->isGemm() ? 2 : layer->weight->rank();
    const int64_t channelAxis = layer->isGemm() && layer->transA ? 0 : 1;
    const Tensor* tensor = context.constantOf(constant);
    auto scale = perChannelConstant(*constant, *tensor, rank, channelAxis, layer->inputChannels, whyNot);
    if (!scale) return nullptr;
    if (!hasLayerType(*constant, *tensor, *layer, whyNot)) return nullptr;
    // The layer must see exactly X's shape once the Mul is gone: k must not raise X's rank or spread a single
    // channel of X over all channels.
    const auto constDims = tensor->dims();
    const bool couldRaiseRank = tensor->rank() == rank;
    const int64_t channelIndex = channelAxis - (rank - tensor->rank());  // k's axis on the channel axis
    const bool couldSpreadChannel = channelIndex >= 0 && constDims[static_cast<std::size_t>(channelIndex)] > 1;
    if (couldRaiseRank || couldSpreadChannel) {
      const auto shape = context.knownShape(*input);
      if (!shape || static_cast<int64_t>(shape->size()) != rank ||
          (couldSpreadChannel && (*shape)[static_cast<std::size_t>(channelAxis)] != layer->inputChannels)) {
        const std::string known = shape ? formatDims(*shape) : std::string("unknown");
        return failWith(whyNot, reason::kMulMayBroadcastInput,
                        "'" + mul.name() + "' could broadcast '" + input->name() + "' (shape " + known +
                            ") to a bigger shape with '" + constant->name() + "' " + formatDims(constDims) +
                            ", so the layer would not see the same input without it");
      }
    }
    if (!noKeptConstantProducer(context, {constant, layer->weightValue}, whyNot)) return nullptr;
    auto match = std::make_unique<ScaleFoldMatch>();
    match->mul = &mul;
    match->layer = *layer;
    match->constant = constant;
    match->scale = std::move(*scale);
    match->before = true;
    match->input = input;
    return match;
  }
};

}  // namespace

std::unique_ptr<Rule> makeFoldScaleIntoWeights() { return std::make_unique<FoldScaleIntoWeights>(); }

}  // namespace bnfold::rules
