// Before:     Y = L(BatchNormalization(X, s, b, m, v), W, B?)     L = Conv | Gemm (transA = 0)
//             Y = L(F(BatchNormalization(X, s, b, m, v)), W, B?)  F = Flatten (axis 1) | Reshape to [N, C*H*W],
//                                                                  L = Gemm (transA = 0) | MatMul (a CNN head)
// After:      Y = L(X, W', B')  /  Y = L(F(X), W', B')             (a MatMul that needs a bias becomes a Gemm)
// Conditions: inference-mode BN with constant, finite params and v + eps > 0 (spatial=0 params only when uniform
//             per channel); the BN output read only by L (or by F, whose output L alone reads), as its data
//             input, and not a graph output; L in the BN's graph with constant W and B and not kept; the shift t
//             folds only when L does no zero padding (pads all 0, auto_pad NOTSET or VALID): a padded border sees
//             0, not t. A zero shift always folds. Through F: X's dims after the channel axis known (their
//             product is the block), F's output [N, C*block], so channel c is the contiguous block of L's input
//             features [c*block, (c+1)*block).
// Math:       k = s / sqrt(v + eps), t = b - m * k (the BN is x * k + t on the input channels)
//             W'[:, c] = W[:, c] * k[c]        (grouped Conv: input channel c lives in group c / (C/group))
//             B'[o] = B[o] + sum over c and kernel positions of W[o, c, ...] * t[c]   (original W)
//             Gemm: C' = beta * C + alpha * (t . B-matrix) per column, beta = 1.
//             Through F: the same with k and t repeated block times per channel (feature f has channel f / block).

#include <algorithm>
#include <memory>

#include "affine_layer.h"
#include "batch_norm_params.h"
#include "bnfold/rewrite/rewriter.h"
#include "kernels/forward_fold_math.h"
#include "opset_emit.h"
#include "rules.h"
#include "rewrite/understood_ops.h"
#include "analysis/value_shape.h"
#include "rewrite/op_versions.h"

namespace bnfold::rules {
namespace {

struct ForwardFold : Match {
  const Node* bn = nullptr;
  AffineLayer layer;
  InferenceBatchNorm params;
  bool foldShift = false;
  const Node* flatten = nullptr;  // the Flatten/Reshape between the BN and a Gemm/MatMul, or null
  int64_t featuresPerChannel = 1;
};

/// k and t of each input feature when channel c covers features [c*block, (c+1)*block).
kernels::ChannelAffine repeatPerFeature(const kernels::ChannelAffine& affine, int64_t block) {
  kernels::ChannelAffine out;
  for (std::size_t c = 0; c < affine.scale.size(); ++c)
    for (int64_t i = 0; i < block; ++i) {
      out.scale.push_back(affine.scale[c]);
      out.shift.push_back(affine.shift[c]);
    }
  return out;
}

bool anyNonZero(const std::vector<double>& values) {
  return std::any_of(values.begin(), values.end(), [](double v) { return v != 0.0; });
}

/// Why a Conv pads its input with zeros, or "" when it does not.
std::string zeroPadding(const Node& conv) {
  const std::string autoPad = conv.attributeString("auto_pad", "NOTSET");
  if (autoPad != "NOTSET" && autoPad != "VALID") return "auto_pad=" + autoPad;
  const std::vector<int64_t> pads = conv.attributeInts("pads");
  if (std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p != 0; })) return "non-zero pads";
  return "";
}

class FoldBatchNormForward final : public Rule {
 public:
  const char* name() const override { return "bn-forward"; }
  const char* summary() const override {
    return "Fold inference-mode BatchNormalization into the Conv or Gemm that follows it (exact cases only)";
  }
  std::vector<std::string> rootOps() const override { return {"BatchNormalization"}; }
  std::vector<OpVersions> opVersions() const override {
    return joinOps({kBatchNormalization}, joinOps(layerOps(), layoutOps()));
  }

  MatchResult match(const Node& bn, const RuleContext& context) const override {
    const Value* y = bn.output(0);
    int slot = -1;
    const Node* consumer = y ? soleConsumer(*y, &slot) : nullptr;
    if (!consumer)
      return MatchResult::failure(reason::kBnHasOtherConsumers,
                                  "the output of " + describe(bn) + " is read by several nodes or is a graph output, "
                                  "so it cannot be folded into one following layer");
    auto match = std::make_unique<ForwardFold>();
    if ((consumer->isOnnxOp("Flatten") || consumer->isOnnxOp("Reshape")) && slot == 0) {
      // A CNN head: BN -> Flatten -> Gemm/MatMul.
      const Node* flatten = consumer;
      const Value* flat = flatten->output(0);
      consumer = flat ? soleConsumer(*flat, &slot) : nullptr;
      if (!consumer)
        return MatchResult::failure(reason::kNoFoldableConsumer, "the output of " + describe(*flatten) + " after " +
                                                                describe(bn) + " is read by several nodes or is a "
                                                                "graph output");
      if (!(consumer->isOnnxOp("Gemm") || consumer->isOnnxOp("MatMul")) || slot != 0)
        return MatchResult::failure(reason::kNoFoldableConsumer, "the output of " + describe(bn) + " goes through " +
                                                                describe(*flatten) + " to " + describe(*consumer) +
                                                                ", not to the data input of a Gemm or MatMul");
      MatchFailure why;
      auto block = featuresPerChannel(bn, *flatten, context, &why);
      if (!block) return MatchResult::failure(why.code, why.message);
      match->flatten = flatten;
      match->featuresPerChannel = *block;
    }
    const bool layerOp = consumer->isOnnxOp("Conv") || consumer->isOnnxOp("Gemm") ||
                         (match->flatten && consumer->isOnnxOp("MatMul"));
    if (!layerOp || slot != 0)
      return MatchResult::failure(reason::kNoFoldableConsumer, "the output of " + describe(bn) + " is read by " +
                                                              describe(*consumer) +
                                                              ", not as the data input of a Conv or Gemm");
    if (consumer->graph() != bn.graph())
      return MatchResult::failure(reason::kLayerInOtherGraph, describe(*consumer) + " reads " + describe(bn) +
                                                              " from another graph");
    MatchFailure why;
    auto params = readInferenceBatchNorm(bn, context, PerElementParams::ReducePerChannel, &why);
    if (!params) return MatchResult::failure(why.code, why.message);
    auto layer = readLayerForBatchNorm(*consumer, context, &why);
    if (!layer) return MatchResult::failure(why.code, why.message);
    if (layer->isGemm() && layer->transA)
      return MatchResult::failure(reason::kChannelAxisMismatch,
                                  describe(*consumer) + " transposes its input (transA=1), so the BN's channels "
                                  "become its output rows, not its input channels");
    if (checkedProduct(params->channels, match->featuresPerChannel) != layer->inputChannels)
      return MatchResult::failure(reason::kParamShapeMismatch,
                                  describe(bn) + " has " + std::to_string(params->channels) + " channels" +
                                      (match->flatten ? " of " + std::to_string(match->featuresPerChannel) +
                                                            " features each"
                                                      : std::string()) +
                                      ", " + describe(*consumer) + " reads " + std::to_string(layer->inputChannels));
    const bool hasShift = anyNonZero(params->affine.shift);
    if (hasShift && layer->node->isOnnxOp("Conv")) {
      const std::string padding = zeroPadding(*layer->node);
      if (!padding.empty())
        return MatchResult::failure(reason::kLayerPadsInput,
                                    describe(*consumer) + " pads its input with zeros (" + padding + "): after "
                                    "folding, the border would see the BN's shift instead of 0, so " +
                                        describe(bn) + " cannot be folded into it exactly");
    }
    match->bn = &bn;
    match->layer = std::move(*layer);
    match->params = std::move(*params);
    match->foldShift = hasShift;
    return MatchResult::success(std::move(match));
  }

  void rewrite(Match& base, Rewriter& rewriter) const override {
    auto& match = static_cast<ForwardFold&>(base);
    const AffineLayer& layer = match.layer;
    const kernels::ChannelAffine affine = repeatPerFeature(match.params.affine, match.featuresPerChannel);
    ReportRecord entry = describeBatchNorm(*match.bn, match.params);
    entry.setText("direction", "forward");
    if (match.flatten) {
      entry.setJson("path",
                    nlohmann::json::array({{{"node", match.flatten->name()}, {"op", match.flatten->opType()}}}));
      entry.setInteger("features_per_channel", match.featuresPerChannel);
    }
    entry.setText("into", layer.node->name());
    entry.setText("into_op", layer.node->opType());
    entry.setText("weight_before", layer.weightValue->name());
    const std::string* biasBefore = layer.biasValue ? &layer.biasValue->name() : nullptr;
    entry.setTextOrNull("bias_before", biasBefore);
    entry.setTextOrNull("bias_after", biasBefore);
    entry.setBool("bias_created", false);

    if (match.foldShift) {
      // The shift, pushed through the original weights, is a constant per output channel.
      std::vector<double> response =
          kernels::inputShiftResponse(layer.layout, layer.weight->toDoubles(), layer.weight->dims(), affine.shift);
      for (double& r : response) r *= layer.alpha;
      if (layer.isMatMul()) {
        foldIntoMatMulAsGemm(match, affine, response, rewriter, entry);
        return;
      }
      const std::vector<double> ones(response.size(), 1.0);
      if (auto bias = foldedBias(layer, {ones, response})) {
        entry.setText("bias_after", writeBias(rewriter, layer, *bias));
        entry.setBool("bias_created", layer.biasValue == nullptr);
      }
    }
    entry.setText("weight_after", writeScaledWeight(rewriter, layer, ChannelSide::Input, affine.scale, "_folded"));
    removeBatchNorm(match, rewriter);
    rewriter.record("folds", std::move(entry));
  }

 private:
  /// The layer (or the Flatten before it) reads the BN's input; the BN goes.
  static void removeBatchNorm(const ForwardFold& match, Rewriter& rewriter) {
    rewriter.setInput(match.flatten ? match.flatten : match.layer.node, 0, match.bn->input(0));
    rewriter.eraseNode(match.bn);
  }

  /// A 2-D MatMul whose input gets a shift needs a bias: it becomes Gemm(F(X), W', response).
  static void foldIntoMatMulAsGemm(const ForwardFold& match, const kernels::ChannelAffine& affine,
                                   const std::vector<double>& response, Rewriter& rewriter, ReportRecord& entry) {
    const AffineLayer& layer = match.layer;
    const Node* matMul = layer.node;
    entry.setText("weight_after", writeScaledWeight(rewriter, layer, ChannelSide::Input, affine.scale, "_folded"));
    entry.setText("replaced_node", matMul->name());
    entry.setText("replaced_op", "MatMul");
    const Node* gemm = replaceMatMulWithGemm(rewriter, layer, response, matMul->output(0));
    entry.setText("into", gemm->name());
    entry.setText("into_op", "Gemm");
    entry.setText("bias_after", gemm->input(2)->name());
    entry.setBool("bias_created", true);
    removeBatchNorm(match, rewriter);
    rewriter.record("folds", std::move(entry));
  }

  /// How many consecutive input features of the layer one BN channel becomes through `flatten` (H*W for an NCHW
  /// input): Flatten with axis 1, or a Reshape to [N, C*H*W] ([0, -1], [-1, C*H*W], [N, -1]).
  static std::optional<int64_t> featuresPerChannel(const Node& bn, const Node& flatten, const RuleContext& context,
                                                   MatchFailure* whyNot) {
    auto shape = context.knownShape(*bn.input(0));
    if (!shape) shape = context.knownShape(*bn.output(0));
    if (!shape || shape->size() < 2 ||
        std::any_of(shape->begin() + 2, shape->end(), [](int64_t d) { return d == analysis::kUnknownDim; })) {
      *whyNot = {reason::kRankUnknown, "the dims after the channel axis of the input of " + describe(bn) +
                                     " are not known, so the features each channel becomes after " +
                                     describe(flatten) + " are not known"};
      return std::nullopt;
    }
    const int64_t block = saturatingElementCount(std::vector<int64_t>(shape->begin() + 2, shape->end()));
    const int64_t channels = (*shape)[1];
    bool keepsBatch = false;
    if (flatten.isOnnxOp("Flatten")) {
      const int64_t axis = flatten.attributeInt("axis", 1);
      keepsBatch = axis == 1 || axis == 1 - static_cast<int64_t>(shape->size());
    } else if (const Tensor* target = context.constantOf(flatten.input(1))) {
      const std::vector<int64_t> dims = target->toInt64s();
      const bool allowZero = flatten.attributeInt("allowzero", 0) != 0;
      const bool copiesBatch =
          dims.size() == 2 && ((dims[0] == 0 && !allowZero) || ((*shape)[0] != analysis::kUnknownDim && dims[0] == (*shape)[0]));
      keepsBatch = dims.size() == 2 &&
                   ((channels != analysis::kUnknownDim && dims[1] == checkedProduct(channels, block)) ||
                    (dims[1] == -1 && copiesBatch));
    }
    if (!keepsBatch) {
      *whyNot = {reason::kChannelAxisMismatch, describe(flatten) + " does not turn the output of " + describe(bn) +
                                              " into [batch, channels * " + std::to_string(block) +
                                              "], so a channel is not a block of the next layer's input features"};
      return std::nullopt;
    }
    return block;
  }
};

}  // namespace

std::unique_ptr<Rule> makeFoldBatchNormForward() { return std::make_unique<FoldBatchNormForward>(); }

}  // namespace bnfold::rules
