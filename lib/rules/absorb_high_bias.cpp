// Before:     Y = L2(Relu(L1(X, W1, B1)), W2, B2)        L1 = Conv | ConvTranspose | Gemm | MatMul (2-D),
//                                                         L2 = Conv (not padded) | Gemm | MatMul (2-D)
// After:      Y = L2(Relu(L1(X, W1, B1 - c)), W2, B2 + W2 c)   (a 2-D MatMul becomes a Gemm with a bias)
// Conditions: L1's output channels have statistics (gamma, beta) from the BatchNormalization bn-fold folded into
//             it, scaled with any equalization since (rewrite/pre_activation_statistics.h); L1's output read only
//             by one Relu and the Relu's only by L2 as its data input, neither a graph output; the channels on the
//             axis L2 reads (as equalize requires); L2 does not zero-pad its input (Conv pads 0, auto_pad NOTSET or
//             VALID; never a ConvTranspose, whose border outputs see fewer inputs); some c_i > 0.
// Math:       c_i = max(0, beta_i - 3|gamma_i|). Where z_i >= c_i, Relu(z_i) = Relu(z_i - c_i) + c_i, and a layer
//             without padding turns a constant c_i on input channel i into sum(W2[o, i, ...]) c_i on output o
//             (times alpha for a Gemm). Exact only where L1's pre-activation stays >= c, which the BN statistics
//             make likely (three standard deviations below the mean), not certain: the report and --verify say so.
//
// Rooted at L1. Runs after equalize (Rule::runsAfterFixedPoint, listed after it), so it reads the statistics as
// equalize rescaled them. The biases stay float: this serves activation quantization (a smaller range after the
// Relu), not weight quantization.

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include "affine_layer.h"
#include "bnfold/rewrite/pre_activation_statistics.h"
#include "bnfold/rewrite/rewriter.h"
#include "kernels/high_bias_math.h"
#include "rewrite/understood_ops.h"
#include "rules.h"

namespace bnfold::rules {
namespace {

// Whether the layer reads zeros beyond its input's border, where a shifted input would not be shifted.
std::optional<std::string> paddingProblem(const Node& layer) {
  if (layer.isOnnxOp("ConvTranspose"))
    return describe(layer) + " is a ConvTranspose: its outputs at the border and between strides sum fewer inputs";
  if (!layer.isOnnxOp("Conv")) return std::nullopt;
  const std::string autoPad = layer.attributeString("auto_pad", "NOTSET");
  if (autoPad != "NOTSET" && autoPad != "VALID")
    return describe(layer) + " pads its input (auto_pad " + autoPad + ")";
  for (int64_t pad : layer.attributeInts("pads"))
    if (pad != 0) return describe(layer) + " pads its input with zeros (pads not 0)";
  return std::nullopt;
}

struct HighBiasLink : Match {
  AffineLayer first;
  const Node* relu = nullptr;
  AffineLayer second;
  ChannelStatistics statistics;
  std::vector<double> absorbed;     // c per channel of L1
  std::vector<double> secondShift;  // added to L2's output channels
};

nlohmann::json jsonNumbers(const std::vector<double>& values) {
  nlohmann::json out = nlohmann::json::array();
  for (double v : values) out.push_back(v);
  return out;
}

std::vector<double> negated(std::vector<double> values) {
  for (double& v : values) v = -v;
  return values;
}

// Adds `shift` to the layer's output channels through its bias; a 2-D MatMul becomes a Gemm with `shift` as its
// bias. Returns the layer node afterwards and whether its bias was created.
std::pair<const Node*, bool> shiftOutput(Rewriter& rewriter, const AffineLayer& layer, const std::vector<double>& shift) {
  if (layer.isMatMul()) return {replaceMatMulWithGemm(rewriter, layer, shift, layer.node->output(0)), true};
  const bool created = layer.biasValue == nullptr;
  if (auto bias = foldedBias(layer, {std::vector<double>(shift.size(), 1.0), shift})) writeBias(rewriter, layer, *bias);
  return {layer.node, created};
}

class AbsorbHighBias final : public Rule {
 public:
  const char* name() const override { return "absorb-high-bias"; }
  const char* summary() const override {
    return "High-bias absorption: move max(0, beta - 3|gamma|) of a folded BN's channels through a Relu into the "
           "next layer's bias (off by default; fold --equalize --absorb-high-bias; exact where the pre-activation "
           "stays above it)";
  }
  std::vector<std::string> rootOps() const override { return {"Conv", "ConvTranspose", "Gemm", "MatMul"}; }
  std::vector<OpVersions> opVersions() const override { return joinOps(layerOps(), {kRelu}); }
  bool enabledByDefault() const override { return false; }
  bool runsAfterFixedPoint() const override { return true; }
  bool readsPreActivationStatistics() const override { return true; }
  const char* failureSection() const override { return "high_bias_not_absorbed"; }

  MatchResult match(const Node& root, const RuleContext& context) const override {
    MatchFailure why;
    auto first = readAffineLayer(root, context, &why);
    if (!first) return MatchResult::quietFailure(why.code, why.message);
    const Value* preActivation = root.output(0);
    // Only a layer followed by an activation or another layer is a candidate worth a report entry.
    if (!preActivation || preActivation->isGraphOutput() || preActivation->uses().size() != 1)
      return MatchResult::quietFailure(reason::kLayerHasOtherConsumers,
                                       "the output of " + describe(root) + " is not read by exactly one node");
    const Use& use = preActivation->uses().front();
    const Node& relu = *use.node;
    if (!relu.isOnnxOp("Relu") || use.slot != 0) {
      const std::string text = describe(root) + " is read by " + describe(relu) +
                               ", not a Relu: only a Relu cuts the absorbed bias exactly where it gives it back";
      const bool candidate = isAffineLayerOp(relu) || relu.isOnnxOp("LeakyRelu") || relu.isOnnxOp("PRelu");
      return candidate ? MatchResult::failure(reason::kActivationNotRelu, text)
                       : MatchResult::quietFailure(reason::kActivationNotRelu, text);
    }
    if (context.isKept(relu))
      return MatchResult::failure(reason::kKeptByUser, describe(relu) + " is kept by --keep or --keep-op");
    const Value* activated = relu.output(0);
    if (!activated || activated->isGraphOutput() || activated->uses().size() != 1)
      return MatchResult::failure(reason::kLayerHasOtherConsumers,
                                  "the output of " + describe(relu) +
                                      " is a graph output or read by several nodes, which would see the shift");
    const Use& next = activated->uses().front();
    if (!isAffineLayerOp(*next.node) || next.slot != 0)
      return MatchResult::failure(reason::kReaderNotLayer, "the output of " + describe(relu) + " is read by " +
                                                               describe(*next.node) +
                                                               ", not as the data input of a Conv, Gemm or MatMul");
    const Node& secondNode = *next.node;
    if (secondNode.graph() != root.graph())
      return MatchResult::failure(reason::kLayerInOtherGraph,
                                  describe(secondNode) + " is in another graph than " + describe(root));
    auto second = readAffineLayer(secondNode, context, &why);
    if (!second) {
      const MatchFailure layerWhy = asLayerFailure(why);
      return MatchResult::failure(layerWhy.code, layerWhy.message);
    }
    if (first->isSpatial() != second->isSpatial() || (second->isGemm() && second->transA) ||
        first->outputChannels != second->inputChannels)
      return MatchResult::failure(reason::kChannelAxisMismatch, "the output channels of " + describe(root) +
                                                                    " are not the input channels of " +
                                                                    describe(secondNode));
    if (auto padding = paddingProblem(secondNode))
      return MatchResult::failure(reason::kLayerPadsInput,
                                  *padding + ": the bias taken from " + describe(root) +
                                      " would not come back where the kernel reads the padding");
    const PreActivationStatistics* known = context.statistics();
    const ChannelStatistics* statistics = known ? known->find(root) : nullptr;
    if (!statistics || static_cast<int64_t>(statistics->gamma.size()) != first->outputChannels)
      return MatchResult::failure(reason::kNoBnStatistics,
                                  "no BatchNormalization statistics are known for the output of " + describe(root) +
                                      " (none was folded into it, or a later rewrite changed its output)");
    for (const AffineLayer* layer : {&*first, &*second})
      if (layer->isMatMul() && layer->outputRank != 2)
        return MatchResult::failure(
            layer->outputRank < 0 ? reason::kRankUnknown : reason::kLayerHasNoBias,
            describe(*layer->node) + " has no bias input and its output is not known to be 2-D (a Gemm's form)");
    if (const Node* kept = keptConstantProducer(context, {first->biasValue, second->biasValue}))
      return MatchResult::failure(reason::kLayerKeptByUser,
                                  "Constant node '" + kept->name() + "' is kept by --keep or --keep-op");

    auto match = std::make_unique<HighBiasLink>();
    match->absorbed = kernels::absorbableBias(statistics->gamma, statistics->beta);
    if (std::all_of(match->absorbed.begin(), match->absorbed.end(), [](double c) { return c == 0.0; }))
      return MatchResult::quietFailure(reason::kNoHighBias, "no channel of " + describe(root) +
                                                                " has beta above three standard deviations");
    match->secondShift = kernels::outputShiftOfInputShift(second->layout, second->weight->toDoubles(),
                                                          second->weight->dims(), match->absorbed);
    for (double& shift : match->secondShift) shift *= second->alpha;
    match->statistics = *statistics;
    match->first = std::move(*first);
    match->relu = &relu;
    match->second = std::move(*second);
    return MatchResult::success(std::move(match));
  }

  void rewrite(Match& base, Rewriter& rewriter) const override {
    auto& match = static_cast<HighBiasLink&>(base);
    const std::string preActivation = match.first.node->output(0)->name();
    const std::string firstName = match.first.node->name(), secondName = match.second.node->name();
    const ChannelStatistics* secondStatistics = rewriter.statistics().find(*match.second.node);
    std::optional<ChannelStatistics> keptForSecond;
    if (secondStatistics) keptForSecond = *secondStatistics;

    const auto [first, firstBiasCreated] = shiftOutput(rewriter, match.first, negated(match.absorbed));
    rewriter.includeUnchanged(match.relu);  // the two biases are exact only together, through the Relu
    const auto [second, secondBiasCreated] = shiftOutput(rewriter, match.second, match.secondShift);

    // L1's channels now have mean beta - c; L2's output is what it was.
    ChannelStatistics shifted = match.statistics;
    for (std::size_t i = 0; i < shifted.beta.size(); ++i) shifted.beta[i] -= match.absorbed[i];
    rewriter.statistics().record(*first, std::move(shifted));
    if (keptForSecond) rewriter.statistics().record(*second, std::move(*keptForSecond));

    const std::string assumption = "exact where the pre-activation '" + preActivation + "' of '" + firstName +
                                   "' is at least `absorbed` in every channel";
    rewriter.assume({preActivation, match.first.outputChannelAxis(), match.absorbed,
                     std::vector<double>(match.absorbed.size(), 0.0), assumption});
    rewriter.record("high_bias_absorbed", {{"node", first->name()},
                                           {"op", first->opType()},
                                           {"layer1", first->name()},
                                           {"layer2", second->name()},
                                           {"activation", match.relu->opType()},
                                           {"absorbed", jsonNumbers(match.absorbed)},
                                           {"gamma", jsonNumbers(match.statistics.gamma)},
                                           {"beta", jsonNumbers(match.statistics.beta)},
                                           {"bn", match.statistics.batchNorm},
                                           {"layer1_bias_created", firstBiasCreated},
                                           {"layer2_bias_created", secondBiasCreated},
                                           {"replaced_nodes", replacedNodes(firstName, first, secondName, second)},
                                           {"assumption", assumption}});
  }

 private:
  static nlohmann::json replacedNodes(const std::string& firstName, const Node* first, const std::string& secondName,
                                      const Node* second) {
    nlohmann::json replaced = nlohmann::json::array();
    if (first->name() != firstName) replaced.push_back(firstName);
    if (second->name() != secondName) replaced.push_back(secondName);
    return replaced;
  }
};

}  // namespace

std::unique_ptr<Rule> makeAbsorbHighBias() { return std::make_unique<AbsorbHighBias>(); }

}  // namespace bnfold::rules
