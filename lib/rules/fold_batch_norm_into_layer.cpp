// Before:     Y = BatchNormalization(L(X, W, B?), s, b, m, v)     L = Conv | ConvTranspose | Gemm | MatMul
// After:      Y = L(X, W', B')                                      (MatMul with a bias: Y = Gemm(X, W', B'))
// Conditions: inference-mode BN (is_test=1 / no optional outputs / training_mode=0); s, b, m, v constant and
//             finite with v + eps > 0; spatial=0 params constant within each channel; L's weight and bias
//             constant; L's output read only by the BN and not a graph output; L in the BN's graph and not
//             kept; the BN's channel axis (1) is L's output channel axis (MatMul: only for 2-D outputs).
// Math:       k = s / sqrt(v + eps);  W'[c] = W[c] * k[c];  B' = (B - m) * k + b  (B = 0 when absent; Gemm:
//             C' = beta * C * k + (b - m * k) and beta = 1). Computed in double, rounded once to each tensor's
//             own type.
//
// Every check is in `match`; `rewrite` only writes new initializers (shared tensors are never edited; helpers
// in affine_layer.h) and lets the layer's output take over the BN output's name, so consumers and graph outputs
// keep working.

#include <algorithm>

#include "affine_layer.h"
#include "batch_norm.h"
#include "batch_norm_params.h"
#include "bnfold/rewrite/rewriter.h"
#include "kernels/fold_math.h"
#include "opset_emit.h"
#include "rules.h"
#include "value_shape.h"

namespace bnfold::rules {
namespace {

struct BatchNormFold : Match {
  const Node* bn = nullptr;
  AffineLayer layer;
  InferenceBatchNorm params;
  bool matMulToGemm = false;  // a MatMul that needs a bias becomes a Gemm
};

std::string describe(const Node& node) { return node.opType() + " '" + node.name() + "'"; }

/// readAffineLayer's reasons in this rule's vocabulary: the BN root is the node the driver reports as
/// kept-by-user, so a kept layer gets its own code, and a weight computed at run time is not a BN parameter.
MatchFailure layerFailure(MatchFailure why) {
  if (why.code == "kept-by-user") why.code = "layer-kept-by-user";
  if (why.code == "params-not-constant") why.code = "weights-not-constant";
  return why;
}

bool anyNonZero(const std::vector<double>& values) {
  return std::any_of(values.begin(), values.end(), [](double v) { return v != 0.0; });
}

class FoldBatchNormIntoLayer final : public Rule {
 public:
  const char* name() const override { return "bn-fold"; }
  const char* summary() const override {
    return "Fold inference-mode BatchNormalization into the preceding Conv, ConvTranspose, Gemm or MatMul";
  }
  std::vector<std::string> rootOps() const override { return {"BatchNormalization"}; }

  MatchResult match(const Node& bn, const RuleContext& context) const override {
    // Training mode first: it is the reason whatever precedes the BN.
    const BatchNormForm form = readBatchNormForm(bn, context.opset());
    if (form.training) {
      return MatchResult::failure("training-mode", describe(bn) + " normalizes with batch statistics (" +
                                                       form.trainingCause + ", " + form.formName +
                                                       "); only inference-mode BatchNormalization is folded");
    }

    // The layer: the producer of X, in the same graph, read by nothing else.
    const Value* x = bn.input(0);
    const Node* layerNode = x ? x->producer() : nullptr;
    if (!layerNode) {
      return MatchResult::failure("no-foldable-producer",
                                  describe(bn) + " reads '" + (x ? x->name() : std::string()) +
                                      "', a graph input or constant, not the output of a layer");
    }
    if (!isAffineLayerOp(*layerNode)) {
      return MatchResult::failure("no-foldable-producer",
                                  describe(bn) + " reads the output of " + describe(*layerNode) +
                                      ", not of a Conv, ConvTranspose, Gemm or MatMul");
    }
    if (x->isGraphOutput() || x->uses().size() != 1) {
      return MatchResult::failure("layer-has-other-consumers",
                                  "the output '" + x->name() + "' of " + describe(*layerNode) + " is " +
                                      (x->isGraphOutput() ? "a graph output" : "read by another node") +
                                      " besides " + describe(bn) + ", which needs it unnormalized");
    }
    if (layerNode->graph() != bn.graph()) {
      return MatchResult::failure("layer-in-outer-graph", describe(bn) + " is in a subgraph but its input comes from " +
                                                              describe(*layerNode) + " in an enclosing graph");
    }

    // The BN's parameters (constant, finite, var + eps > 0; spatial=0 only when uniform per channel).
    MatchFailure why;
    std::optional<InferenceBatchNorm> params =
        readInferenceBatchNorm(bn, context, PerElementParams::ReducePerChannel, &why);
    if (!params) return MatchResult::failure(why.code, why.message);

    // The layer's weights.
    std::optional<AffineLayer> layer = readAffineLayer(*layerNode, context, &why);
    if (!layer) {
      why = layerFailure(why);
      return MatchResult::failure(why.code, why.message);
    }
    if (const Node* kept = keptConstantProducer(context, {layer->weightValue, layer->biasValue})) {
      return MatchResult::failure("layer-kept-by-user", "a weight of " + describe(*layerNode) +
                                                            " comes from Constant '" + kept->name() +
                                                            "', which is kept by --keep/--keep-op");
    }
    if (params->channels != layer->outputChannels) {
      return MatchResult::failure("param-shape-mismatch",
                                  describe(bn) + " has " + std::to_string(params->channels) + " channels but " +
                                      describe(*layerNode) + " has " + std::to_string(layer->outputChannels) +
                                      " output channels");
    }
    if (layer->isMatMul()) {
      // BN normalizes axis 1; MatMul's output channels are its last axis. They coincide only for 2-D outputs.
      std::optional<std::vector<int64_t>> shape = knownShape(*bn.output(0));
      if (!shape) shape = knownShape(*x);
      if (!shape) {
        return MatchResult::failure(
            "rank-unknown", "the rank of the output of " + describe(*layerNode) +
                                " is not known; BatchNormalization normalizes axis 1, which is MatMul's column "
                                "axis only for a 2-D output");
      }
      if (shape->size() != 2) {
        return MatchResult::failure("channel-axis-mismatch",
                                    "the output of " + describe(*layerNode) + " has rank " +
                                        std::to_string(shape->size()) +
                                        ": BatchNormalization normalizes axis 1, not MatMul's column axis");
      }
    }

    auto match = std::make_unique<BatchNormFold>();
    match->matMulToGemm = layer->isMatMul() && anyNonZero(params->affine.shift);
    match->bn = &bn;
    match->layer = std::move(*layer);
    match->params = std::move(*params);
    return MatchResult::success(std::move(match));
  }

  void rewrite(Match& base, Rewriter& rewriter) const override {
    auto& match = static_cast<BatchNormFold&>(base);
    const Node& bn = *match.bn;
    const AffineLayer& layer = match.layer;
    const Node* into = layer.node;
    const kernels::ChannelAffine& affine = match.params.affine;
    nlohmann::json entry = describeBatchNorm(bn, match.params);
    entry["direction"] = "backward";
    entry["weight_before"] = layer.weightValue->name();
    entry["bias_before"] = layer.biasValue ? nlohmann::json(layer.biasValue->name()) : nlohmann::json();

    // W' = W * k per output channel, always into a new initializer (W may be shared).
    const std::string weightAfter = writeScaledWeight(rewriter, layer, ChannelSide::Output, affine.scale, "_folded");
    entry["weight_after"] = weightAfter;

    const Value* output = into->output(0);
    nlohmann::json biasAfter = entry["bias_before"];
    bool biasCreated = false;
    if (match.matMulToGemm) {
      // A 2-D MatMul with a bias is a Gemm: Y = Gemm(X, W', shift).
      Value* bias = addTensor(rewriter, *into, layer.type(), {layer.outputChannels}, kernels::foldBias(affine),
                              into->name() + "_bias");
      std::vector<onnx::AttributeProto> attributes;
      if (modelOpset(rewriter) < 7) attributes.push_back(intAttribute("broadcast", 1));  // C broadcasts only if told
      const Node* gemm = rewriter.createNode(into, "Gemm", {into->input(0), into->input(1), bias}, {output->name()},
                                             into->name() + "_gemm", std::move(attributes));
      entry["replaced_node"] = into->name();
      entry["replaced_op"] = into->opType();
      // The Gemm's output takes over the MatMul's value (and name); the MatMul goes.
      rewriter.replaceValueKeepingName(output, gemm->output(0));
      into = gemm;
      output = gemm->output(0);
      biasAfter = bias->name();
      biasCreated = true;
    } else if (!layer.isMatMul()) {
      if (auto bias = foldedBias(layer, affine)) {
        biasAfter = writeBias(rewriter, layer, *bias);
        biasCreated = layer.biasValue == nullptr;
        if (layer.isGemm() && modelOpset(rewriter) < 7) rewriter.setAttribute(into, intAttribute("broadcast", 1));
      }
    }
    // The layer's output takes over Y's name; the BN and the constants only it read disappear.
    rewriter.replaceValueKeepingName(bn.output(0), output);

    entry["into"] = into->name();
    entry["into_op"] = into->opType();
    entry["bias_after"] = biasAfter;
    entry["bias_created"] = biasCreated;
    rewriter.record("folds", std::move(entry));
  }
};

}  // namespace

std::unique_ptr<Rule> makeFoldBatchNormIntoLayer() { return std::make_unique<FoldBatchNormIntoLayer>(); }

}  // namespace bnfold::rules
