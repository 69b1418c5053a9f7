// Before:     Y = L(BatchNormalization(X, s, b, m, v), W, B?)     L = Conv | Gemm (transA = 0)
// After:      Y = L(X, W', B')
// Conditions: inference-mode BN with constant, finite params and v + eps > 0 (spatial=0 params only when uniform
//             per channel); the BN output read only by L, as its data input, and not a graph output; L in the
//             BN's graph with constant W and B and not kept; the shift t folds only when L does no zero padding
//             (pads all 0, auto_pad NOTSET or VALID): a padded border sees 0, not t. A zero shift always folds.
// Math:       k = s / sqrt(v + eps), t = b - m * k (the BN is x * k + t on the input channels)
//             W'[:, c] = W[:, c] * k[c]        (grouped Conv: input channel c lives in group c / (C/group))
//             B'[o] = B[o] + sum over c and kernel positions of W[o, c, ...] * t[c]   (original W)
//             Gemm: C' = beta * C + alpha * (t . B-matrix) per column, beta = 1.

#include <algorithm>
#include <memory>

#include "affine_layer.h"
#include "batch_norm_params.h"
#include "bnfold/rewrite/rewriter.h"
#include "kernels/forward_fold_math.h"
#include "opset_emit.h"
#include "rules.h"

namespace bnfold::rules {
namespace {

struct ForwardFold : Match {
  const Node* bn = nullptr;
  AffineLayer layer;
  InferenceBatchNorm params;
  bool foldShift = false;
};

std::string describe(const Node& node) { return node.opType() + " '" + node.name() + "'"; }

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

  MatchResult match(const Node& bn, const RuleContext& context) const override {
    const Value* y = bn.output(0);
    int slot = -1;
    const Node* consumer = y ? soleConsumer(*y, &slot) : nullptr;
    if (!consumer)
      return MatchResult::failure("bn-has-other-consumers",
                                  "the output of " + describe(bn) + " is read by several nodes or is a graph output, "
                                  "so it cannot be folded into one following layer");
    if (!(consumer->isOnnxOp("Conv") || consumer->isOnnxOp("Gemm")) || slot != 0)
      return MatchResult::failure("no-foldable-consumer", "the output of " + describe(bn) + " is read by " +
                                                              describe(*consumer) +
                                                              ", not as the data input of a Conv or Gemm");
    if (consumer->graph() != bn.graph())
      return MatchResult::failure("layer-in-other-graph", describe(*consumer) + " reads " + describe(bn) +
                                                              " from another graph");
    MatchFailure why;
    auto params = readInferenceBatchNorm(bn, context, PerElementParams::ReducePerChannel, &why);
    if (!params) return MatchResult::failure(why.code, why.message);
    auto layer = readAffineLayer(*consumer, context, &why);
    if (!layer) {
      if (why.code == "kept-by-user") why.code = "layer-kept-by-user";  // the BN itself is not the kept node
      return MatchResult::failure(why.code, why.message);
    }
    if (const Node* kept = keptConstantProducer(context, {layer->weightValue, layer->biasValue}))
      return MatchResult::failure("layer-kept-by-user", "a weight of " + describe(*consumer) +
                                                            " comes from Constant '" + kept->name() +
                                                            "', which is kept by --keep/--keep-op");
    if (layer->isGemm() && layer->transA)
      return MatchResult::failure("channel-axis-mismatch",
                                  describe(*consumer) + " transposes its input (transA=1), so the BN's channels "
                                  "become its output rows, not its input channels");
    if (params->channels != layer->inputChannels)
      return MatchResult::failure("param-shape-mismatch", describe(bn) + " has " + std::to_string(params->channels) +
                                                              " channels, " + describe(*consumer) + " reads " +
                                                              std::to_string(layer->inputChannels));
    const bool hasShift = anyNonZero(params->affine.shift);
    if (hasShift && layer->node->isOnnxOp("Conv")) {
      const std::string padding = zeroPadding(*layer->node);
      if (!padding.empty())
        return MatchResult::failure("layer-pads-input",
                                    describe(*consumer) + " pads its input with zeros (" + padding + "): after "
                                    "folding, the border would see the BN's shift instead of 0, so " +
                                        describe(bn) + " cannot be folded into it exactly");
    }
    auto match = std::make_unique<ForwardFold>();
    match->bn = &bn;
    match->layer = std::move(*layer);
    match->params = std::move(*params);
    match->foldShift = hasShift;
    return MatchResult::success(std::move(match));
  }

  void rewrite(Match& base, Rewriter& rewriter) const override {
    auto& match = static_cast<ForwardFold&>(base);
    const AffineLayer& layer = match.layer;
    const kernels::ChannelAffine& affine = match.params.affine;
    nlohmann::json entry = describeBatchNorm(*match.bn, match.params);
    entry["direction"] = "forward";
    entry["into"] = layer.node->name();
    entry["into_op"] = layer.node->opType();
    entry["weight_before"] = layer.weightValue->name();
    entry["bias_before"] = layer.biasValue ? nlohmann::json(layer.biasValue->name()) : nlohmann::json();
    entry["bias_after"] = entry["bias_before"];
    entry["bias_created"] = false;

    if (match.foldShift) {
      // The shift, pushed through the original weights, is a constant per output channel.
      std::vector<double> response =
          kernels::inputShiftResponse(layer.layout, layer.weight->toDoubles(), layer.weight->dims(), affine.shift);
      for (double& r : response) r *= layer.alpha;
      const std::vector<double> ones(response.size(), 1.0);
      if (auto bias = foldedBias(layer, {ones, response})) {
        entry["bias_after"] = writeBias(rewriter, layer, *bias);
        entry["bias_created"] = layer.biasValue == nullptr;
        // Before opset 7 Gemm broadcasts C only when told to.
        if (layer.isGemm() && modelOpset(rewriter) < 7) rewriter.setAttribute(layer.node, intAttribute("broadcast", 1));
      }
    }
    entry["weight_after"] = writeScaledWeight(rewriter, layer, ChannelSide::Input, affine.scale, "_folded");

    rewriter.setInput(layer.node, 0, match.bn->input(0));
    rewriter.eraseNode(match.bn);
    rewriter.record("folds", std::move(entry));
  }
};

}  // namespace

std::unique_ptr<Rule> makeFoldBatchNormForward() { return std::make_unique<FoldBatchNormForward>(); }

}  // namespace bnfold::rules
