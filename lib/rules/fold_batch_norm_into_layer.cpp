// Before:     Y = BatchNormalization(P(L(X, W, B?)), s, b, m, v)   L = Conv | ConvTranspose | Gemm | MatMul
//             (or P(Concat(L1(...), L2(...), ...)) on the layers' channel axis)
//             P = a path of layout ops (Identity, Transpose, Reshape, Flatten, Squeeze, Unsqueeze), maybe empty
// After:      Y = P(L(X, W', B'))                                  (MatMul with a bias: Gemm(X, W', B') when 2-D,
//                                                                    Add(MatMul(X, W'), B') otherwise)
// Conditions: inference-mode BN (is_test=1 / no optional outputs / training_mode=0); s, b, m, v constant and
//             finite with v + eps > 0; spatial=0 params constant within each channel; L's weight and bias
//             constant; every value from L to the BN read only by the next node and not a graph output; L in the
//             BN's graph and not kept; P carries L's output channel axis (1; MatMul: the last) to the BN's axis 1
//             element for element (layout_path.h); a Concat joins layers on their channel axis, and BN channels
//             [begin, end) of each layer's range fold into that layer.
// Math:       k = s / sqrt(v + eps);  W'[c] = W[c] * k[c];  B' = (B - m) * k + b  (B = 0 when absent; Gemm:
//             C' = beta * C * k + (b - m * k) and beta = 1). Computed in double, rounded once to each tensor's
//             own type. A per-channel affine map commutes with a layout op that keeps the channels apart.
//
// Every check is in `match`; `rewrite` only writes new initializers (shared tensors are never edited; helpers
// in affine_layer.h) and lets the BN's input take over the BN output's name, so consumers and graph outputs
// keep working. The layout ops stay.

#include <algorithm>
#include <optional>
#include <string>

#include "affine_layer.h"
#include "batch_norm.h"
#include "batch_norm_params.h"
#include "bnfold/rewrite/pre_activation_statistics.h"
#include "bnfold/rewrite/rewriter.h"
#include "kernels/fold_math.h"
#include "layout_path.h"
#include "opset_emit.h"
#include "rules.h"
#include "rewrite/understood_ops.h"
#include "rewrite/op_versions.h"

namespace bnfold::rules {
namespace {

/// One layer the BN folds into, with the BN channels [begin, end) that are its outputs.
struct LayerPart {
  AffineLayer layer;
  int64_t begin = 0, end = 0;
  bool needsBias = false;  // a MatMul whose shift is not zero: becomes a Gemm (2-D) or gets an Add
};

struct BatchNormFold : Match {
  const Node* bn = nullptr;
  InferenceBatchNorm params;
  LayoutPath path;
  const Node* concat = nullptr;
  std::vector<LayerPart> parts;
};

constexpr char kFoldedSuffix[] = "_folded";  // of a folded weight's name

bool anyNonZero(const std::vector<double>& values) {
  return std::any_of(values.begin(), values.end(), [](double v) { return v != 0.0; });
}

std::string pathText(const LayoutPath& path) {
  std::string text;
  for (const Node* step : path.steps) text += (text.empty() ? "" : " -> ") + describe(*step);
  return text.empty() ? "" : " (through " + text + ")";
}

kernels::ChannelAffine sliceOf(const kernels::ChannelAffine& affine, int64_t begin, int64_t end) {
  return {{affine.scale.begin() + begin, affine.scale.begin() + end}, {affine.shift.begin() + begin, affine.shift.begin() + end}};
}

/// The BN's output distribution on channels [begin, end): gamma and beta, one per channel (spatial=0 parameters
/// are uniform within a channel, see readInferenceBatchNorm).
ChannelStatistics channelStatistics(const InferenceBatchNorm& params, int64_t begin, int64_t end, const Node& bn) {
  ChannelStatistics statistics;
  statistics.batchNorm = bn.name();
  const std::size_t perChannel = params.gamma.size() / static_cast<std::size_t>(params.channels);
  for (int64_t c = begin; c < end; ++c) {
    statistics.gamma.push_back(params.gamma[static_cast<std::size_t>(c) * perChannel]);
    statistics.beta.push_back(params.beta[static_cast<std::size_t>(c) * perChannel]);
  }
  return statistics;
}

/// Reads one layer the BN folds into (its output read only on the way to the BN), or fails.
std::optional<AffineLayer> readLayer(const Node& layerNode, const Node& bn, const RuleContext& context,
                                     MatchFailure* why) {
  if (layerNode.graph() != bn.graph()) {
    *why = {reason::kLayerInOtherGraph, describe(bn) + " is in a subgraph but its input comes from " + describe(layerNode) +
                                        " in an enclosing graph"};
    return std::nullopt;
  }
  return readLayerForBatchNorm(layerNode, context, why);
}

class FoldBatchNormIntoLayer final : public Rule {
 public:
  const char* name() const override { return "bn-fold"; }
  const char* summary() const override {
    return "Fold inference-mode BatchNormalization into the preceding Conv, ConvTranspose, Gemm or MatMul";
  }
  std::vector<std::string> rootOps() const override { return {"BatchNormalization"}; }
  std::vector<OpVersions> opVersions() const override {
    return joinOps({kBatchNormalization, kConcat, kAdd}, joinOps(layerOps(), layoutOps()));
  }

  MatchResult match(const Node& bn, const RuleContext& context) const override {
    // Training mode first: it is the reason whatever precedes the BN.
    const BatchNormForm form = readBatchNormForm(bn, context.opset());
    if (form.training) {
      return MatchResult::failure(reason::kTrainingMode, describe(bn) + " normalizes with batch statistics (" +
                                                       form.trainingCause + ", " + form.formName +
                                                       "); only inference-mode BatchNormalization is folded");
    }

    // The layer (or Concat of layers) before the BN, maybe through layout ops.
    const Value* x = bn.input(0);
    if (!x) return MatchResult::failure(reason::kNoFoldableProducer, describe(bn) + " has no input");
    auto match = std::make_unique<BatchNormFold>();
    match->path = findLayoutPath(*x);
    const Node* source = match->path.source;
    if (!source) {
      return MatchResult::failure(reason::kNoFoldableProducer,
                                  describe(bn) + " reads '" + x->name() + "'" + pathText(match->path) +
                                      ", a graph input or constant, not the output of a layer");
    }
    const bool isConcat = source->isOnnxOp("Concat");
    if (!isAffineLayerOp(*source) && !isConcat) {
      return MatchResult::failure(reason::kNoFoldableProducer,
                                  describe(bn) + " reads the output of " + describe(*source) + pathText(match->path) +
                                      ", not of a Conv, ConvTranspose, Gemm or MatMul");
    }
    if (const Value* shared = sharedValueOnPath(match->path, *x)) {
      return MatchResult::failure(reason::kLayerHasOtherConsumers,
                                  "'" + shared->name() + "' on the way from " + describe(*source) + " to " +
                                      describe(bn) + " is " + (shared->isGraphOutput() ? "a graph output" : "read by another node") +
                                      ", which needs it unnormalized");
    }

    // The BN's parameters (constant, finite, var + eps > 0; spatial=0 only when uniform per channel).
    MatchFailure why;
    std::optional<InferenceBatchNorm> params =
        readInferenceBatchNorm(bn, context, PerElementParams::ReducePerChannel, &why);
    if (!params) return MatchResult::failure(why.code, why.message);

    // The layers and the axis their channels are on.
    int64_t rank = -1, axis = -1, channels = 0;
    if (isConcat) {
      match->concat = source;
      for (const Value* input : source->inputs()) {
        const Node* producer = input ? input->producer() : nullptr;
        if (!producer || !isAffineLayerOp(*producer))
          return MatchResult::failure(reason::kNoFoldableProducer,
                                      describe(bn) + " reads " + describe(*source) + ", whose input '" +
                                          (input ? input->name() : std::string()) +
                                          "' is not the output of a Conv, ConvTranspose, Gemm or MatMul");
        if (input->isGraphOutput() || input->uses().size() != 1)
          return MatchResult::failure(reason::kLayerHasOtherConsumers,
                                      "the output '" + input->name() + "' of " + describe(*producer) + " is read by " +
                                          "another node besides " + describe(*source) + " or is a graph output");
        auto layer = readLayer(*producer, bn, context, &why);
        if (!layer) return MatchResult::failure(why.code, why.message);
        if (layer->outputRank < 0)
          return MatchResult::failure(reason::kRankUnknown, "the rank of the output of " + describe(*producer) + " is not known");
        const int64_t concatAxis = source->attributeInt("axis", 0) < 0 ? source->attributeInt("axis", 0) + layer->outputRank
                                                                      : source->attributeInt("axis", 0);
        if (rank >= 0 && layer->outputRank != rank)
          return MatchResult::failure(reason::kChannelAxisMismatch, describe(*source) + " joins outputs of different ranks");
        if (concatAxis != layer->outputChannelAxis())
          return MatchResult::failure(reason::kChannelAxisMismatch,
                                      describe(*source) + " joins along axis " + std::to_string(concatAxis) + ", not the " +
                                          "channel axis " + std::to_string(layer->outputChannelAxis()) + " of " +
                                          describe(*producer));
        rank = layer->outputRank;
        axis = concatAxis;
        LayerPart part;
        part.begin = channels;
        channels += layer->outputChannels;
        part.end = channels;
        part.layer = std::move(*layer);
        match->parts.push_back(std::move(part));
      }
    } else {
      auto layer = readLayer(*source, bn, context, &why);
      if (!layer) return MatchResult::failure(why.code, why.message);
      rank = layer->outputRank;
      axis = layer->outputChannelAxis();
      channels = layer->outputChannels;
      LayerPart part;
      part.end = channels;
      part.layer = std::move(*layer);
      match->parts.push_back(std::move(part));
    }
    if (params->channels != channels) {
      return MatchResult::failure(reason::kParamShapeMismatch,
                                  describe(bn) + " has " + std::to_string(params->channels) + " channels but " +
                                      describe(*source) + " has " + std::to_string(channels) + " output channels");
    }

    const bool directMatMul = match->path.steps.empty() && !isConcat && match->parts[0].layer.isMatMul();
    if (directMatMul) {
      // BN normalizes axis 1; MatMul's output channels are its last axis. They coincide only for 2-D outputs.
      std::optional<std::vector<int64_t>> shape = context.knownShape(*bn.output(0));
      if (!shape) shape = context.knownShape(*x);
      if (!shape) {
        return MatchResult::failure(
            reason::kRankUnknown, "the rank of the output of " + describe(*source) +
                                " is not known; BatchNormalization normalizes axis 1, which is MatMul's column "
                                "axis only for a 2-D output");
      }
      if (shape->size() != 2) {
        return MatchResult::failure(reason::kChannelAxisMismatch,
                                    "the output of " + describe(*source) + " has rank " +
                                        std::to_string(shape->size()) +
                                        ": BatchNormalization normalizes axis 1, not MatMul's column axis");
      }
      match->parts[0].layer.outputRank = 2;
    } else if (!match->path.steps.empty() || match->parts[0].layer.isMatMul()) {
      if (rank < 0)
        return MatchResult::failure(reason::kRankUnknown, "the rank of the output of " + describe(*source) +
                                                        " is not known, so the channel axis cannot be followed" +
                                                        pathText(match->path));
      std::optional<int64_t> mapped = mapFeatureAxis(match->path, rank, axis, channels, context, &why);
      if (!mapped) return MatchResult::failure(why.code, why.message);
      if (*mapped != 1)
        return MatchResult::failure(reason::kChannelAxisMismatch,
                                    "the channel axis " + std::to_string(axis) + " of " + describe(*source) +
                                        " ends on axis " + std::to_string(*mapped) + pathText(match->path) +
                                        ", but " + describe(bn) + " normalizes axis 1");
    }

    for (LayerPart& part : match->parts)
      part.needsBias = part.layer.isMatMul() &&
                       anyNonZero({params->affine.shift.begin() + part.begin, params->affine.shift.begin() + part.end});
    match->bn = &bn;
    match->params = std::move(*params);
    return MatchResult::success(std::move(match));
  }

  void rewrite(Match& base, Rewriter& rewriter) const override {
    auto& match = static_cast<BatchNormFold&>(base);
    const Node& bn = *match.bn;
    nlohmann::json path = nlohmann::json::array();
    for (const Node* step : match.path.steps) path.push_back({{"node", step->name()}, {"op", step->opType()}});
    for (const LayerPart& part : match.parts) {
      ReportRecord entry = describeBatchNorm(bn, match.params);
      entry.setText("direction", "backward");
      entry.setJson("path", path);
      if (match.concat) {
        entry.setText("split_by", match.concat->name());
        entry.setJson("channels", {part.begin, part.end});
      }
      const Node* layer = foldIntoLayer(rewriter, part, sliceOf(match.params.affine, part.begin, part.end), entry);
      if (layer && rewriter.statistics().recording())
        rewriter.statistics().record(*layer, channelStatistics(match.params, part.begin, part.end, bn));
      rewriter.record("folds", std::move(entry));
    }
    // The BN's input takes over Y's name; the BN and the constants only it read disappear.
    rewriter.replaceValueKeepingName(bn.output(0), bn.input(0));
  }

 private:
  // The layer whose output is now the BN's output (a Gemm that replaced a MatMul), or null when that is an Add
  // after the layer.
  static const Node* foldIntoLayer(Rewriter& rewriter, const LayerPart& part, const kernels::ChannelAffine& affine,
                                   ReportRecord& entry) {
    const AffineLayer& layer = part.layer;
    const Node* into = layer.node;
    entry.setText("weight_before", layer.weightValue->name());
    std::optional<std::string> biasAfter;
    if (layer.biasValue) biasAfter = layer.biasValue->name();
    entry.setTextOrNull("bias_before", biasAfter ? &*biasAfter : nullptr);
    // W' = W * k per output channel, always into a new initializer (W may be shared).
    entry.setText("weight_after", writeScaledWeight(rewriter, layer, ChannelSide::Output, affine.scale, kFoldedSuffix));

    bool biasCreated = false;
    const Value* output = into->output(0);
    if (part.needsBias && layer.outputRank == 2) {
      // A 2-D MatMul with a bias is a Gemm: Y = Gemm(X, W', shift); the MatMul goes.
      entry.setText("replaced_node", into->name());
      entry.setText("replaced_op", into->opType());
      into = replaceMatMulWithGemm(rewriter, layer, kernels::foldBias(affine), output);
      biasAfter = into->input(2)->name();
      biasCreated = true;
    } else if (part.needsBias) {
      // MatMul with more than two dims: the bias goes into an Add on its last (feature) axis.
      Value* bias = addTensor(rewriter, *into, layer.type(), {layer.outputChannels}, kernels::foldBias(affine),
                              biasNameHint(layer));  // a MatMul has no bias: its name + "_bias"
      const Use reader = output->uses().front();
      const Node* add = rewriter.createNode(reader.node, "Add", {output, bias}, {output->name() + "_biased"},
                                            into->name() + "_bias_add", broadcastAttributes(modelOpset(rewriter)));
      rewriter.setInput(reader.node, reader.slot, add->output(0));
      entry.setText("bias_node", add->name());
      biasAfter = bias->name();
      biasCreated = true;
    } else if (!layer.isMatMul()) {
      if (auto bias = foldedBias(layer, affine)) {
        biasAfter = writeBias(rewriter, layer, *bias);
        biasCreated = layer.biasValue == nullptr;
      }
    }
    entry.setText("into", into->name());
    entry.setText("into_op", into->opType());
    entry.setTextOrNull("bias_after", biasAfter ? &*biasAfter : nullptr);
    entry.setBool("bias_created", biasCreated);
    return part.needsBias && layer.outputRank != 2 ? nullptr : into;
  }
};

}  // namespace

std::unique_ptr<Rule> makeFoldBatchNormIntoLayer() { return std::make_unique<FoldBatchNormIntoLayer>(); }

}  // namespace bnfold::rules
