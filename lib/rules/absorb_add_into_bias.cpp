// Before:     Y = Add(L(X, W, B?), k)   or   Y = Add(k, L(X, W, B?))      L = Conv | ConvTranspose | Gemm
//             Y = Add(MatMul(X, W), k)  with X 2-D
// After:      Y = L(X, W, B')                                            (MatMul: Y = Gemm(X, W, k'))
// Conditions: k constant and per-channel for L's output under numpy broadcasting (shapes align from the LAST
//             axis: for NCHW [C,1,1], [1,C,1,1], scalars and all-ones shapes; after Gemm/MatMul [C] and [1,C]),
//             which also means Y keeps L's output shape; L's output read only by the Add and not a graph
//             output; W and B constant; neither L nor the Constant nodes that go away kept by the user.
// Math:       B'[c] = B[c] + k[c] (B = 0 when absent);  Gemm: C' = beta * C + k with beta' = 1.
// A [C] constant on a 4-D output runs along W, not the channels: it is left alone (reason not-per-channel).

#include <memory>

#include "affine_layer.h"
#include "bnfold/rewrite/rewriter.h"
#include "rules.h"
#include "rewrite/understood_ops.h"

namespace bnfold::rules {
namespace {

struct BiasAddMatch : Match {
  const Node* add = nullptr;
  AffineLayer layer;
  const Value* constant = nullptr;
  std::vector<double> addend;  // one value per output channel
  bool toGemm = false;         // a MatMul that becomes a Gemm
};

class AbsorbAddIntoBias final : public Rule {
 public:
  const char* name() const override { return "bias-add"; }
  const char* summary() const override {
    return "Add of a per-channel constant after Conv/ConvTranspose/Gemm/MatMul becomes the layer's bias";
  }
  std::vector<std::string> rootOps() const override { return {"Add"}; }
  std::vector<OpVersions> opVersions() const override {
    return joinOps({kAddNumpyBroadcast}, joinOps(layerOps(), layoutOps()));
  }

  MatchResult match(const Node& add, const RuleContext& context) const override {
    const int layerSlot = layerOperandSlot(add, context);
    if (layerSlot < 0)
      return MatchResult::failure(reason::kNoFoldableLayer, "'" + add.name() + "' does not add a constant to the output "
                                                       "of a Conv, ConvTranspose, Gemm or MatMul");
    const Value* layerOutput = add.input(static_cast<std::size_t>(layerSlot));
    const Value* constant = add.input(static_cast<std::size_t>(1 - layerSlot));
    const Node& layerNode = *layerOutput->producer();
    if (soleConsumer(*layerOutput) != &add || layerOutput->producerOutputIndex() != 0)
      return MatchResult::failure(reason::kLayerHasOtherConsumers,
                                  "the output '" + layerOutput->name() + "' of '" + layerNode.name() +
                                      "' is read by other nodes too or is a graph output");
    if (layerNode.graph() != add.graph())
      return MatchResult::failure(reason::kLayerInOtherGraph, "'" + add.name() + "' is in a subgraph and reads '" +
                                                              layerNode.name() + "' from an enclosing graph");
    MatchFailure why;
    auto layer = readAffineLayer(layerNode, context, &why);
    if (!layer) return MatchResult::failure(why.code, why.message);

    auto match = std::make_unique<BiasAddMatch>();
    match->add = &add;
    match->constant = constant;
    if (layer->isMatMul()) {
      // MatMul has no bias input; with a 2-D input it can become a Gemm, which has one.
      if (layer->outputRank != 2)
        return MatchResult::failure(
            reason::kLayerHasNoBias, "MatMul '" + layerNode.name() + "' has no bias input and its input is " +
                                     (layer->outputRank < 0 ? std::string("of unknown rank")
                                                            : "rank " + std::to_string(layer->outputRank)) +
                                     ", so it cannot become a Gemm");
      match->toGemm = true;
    }
    const Tensor* tensor = context.constantOf(constant);
    auto addend = perChannelConstant(*constant, *tensor, layer->outputRank, layer->outputChannelAxis(),
                                     layer->outputChannels, &why);
    if (!addend) return MatchResult::failure(why.code, why.message);
    if (!hasLayerType(*constant, *tensor, *layer, &why) ||
        !noKeptConstantProducer(context, {constant, layer->biasValue}, &why))
      return MatchResult::failure(why.code, why.message);
    match->addend = std::move(*addend);
    match->layer = *layer;
    return MatchResult::success(std::move(match));
  }

  void rewrite(Match& base, Rewriter& rewriter) const override {
    auto& match = static_cast<BiasAddMatch&>(base);
    const AffineLayer& layer = match.layer;
    const Node* add = match.add;
    const Value* layerOutput = layer.node->output(0);
    nlohmann::json entry = {{"add", add->name()},
                            {"layer", layer.node->name()},
                            {"layer_op", layer.node->opType()},
                            {"constant", match.constant->name()},
                            {"added", match.addend}};
    if (match.toGemm) {
      // Y = MatMul(X, W) + k  ==  Gemm(X, W, k) with alpha = beta = 1.
      const Node* gemm = replaceMatMulWithGemm(rewriter, layer, match.addend, add->output(0));
      entry["replaced_by"] = gemm->name();
      entry["bias_before"] = nullptr;
      entry["bias_after"] = gemm->input(2)->name();
      entry["bias_created"] = true;
      rewriter.eraseNode(layer.node);
    } else {
      const auto bias = foldedBias(layer, {std::vector<double>(match.addend.size(), 1.0), match.addend});
      entry["bias_before"] = layer.biasValue ? nlohmann::json(layer.biasValue->name()) : nlohmann::json(nullptr);
      entry["bias_created"] = layer.biasValue == nullptr;
      // A zero addend onto a bias-less layer needs no bias: the Add just goes.
      entry["bias_after"] = bias ? nlohmann::json(writeBias(rewriter, layer, *bias)) : entry["bias_before"];
      if (!bias) entry["bias_created"] = false;
      rewriter.replaceValueKeepingName(add->output(0), layerOutput);
    }
    rewriter.record("bias_absorbed", std::move(entry));
  }
};

}  // namespace

std::unique_ptr<Rule> makeAbsorbAddIntoBias() { return std::make_unique<AbsorbAddIntoBias>(); }

}  // namespace bnfold::rules
