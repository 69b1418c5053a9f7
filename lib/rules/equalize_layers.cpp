// Before:     Y = L2(A(L1(X, W1, B1)), W2, B2)        A = Relu | LeakyRelu | PRelu | none, L = Conv | ConvTranspose
//             (and longer chains L1 -> A -> L2 -> A -> L3 ...)        | Gemm | MatMul with a constant 2-D weight
// After:      Y = L2(A(L1(X, W1', B1')), W2', B2)
// Conditions: every layer readable as an affine layer (constant floating weight and bias, not kept); L1's output
//             read only by A (or L2), A's only by L2 as its data input, neither a graph output; the channels
//             on the same axis (Conv/ConvTranspose to Conv/ConvTranspose, Gemm/MatMul to Gemm (transA = 0) /
//             MatMul) and as many of them; weights and L1's bias read by no other node, not DequantizeLinear's;
//             the scales lower the two weights' int8 noise, per channel with one step per tensor (else the link is left).
// Math:       A(s z) = s A(z) for s > 0 (per-channel slopes stay with their channel), so with
//             s_i = sqrt(r1_i / r2_i), r1_i = max|W1 feeding output channel i|, r2_i = max|W2 reading input
//             channel i|: W1'[i] = W1[i] / s_i, B1'[i] = B1[i] / s_i, W2'[:, i] = W2[:, i] * s_i. A chain is
//             swept link by link until the scales stop moving (kernels/equalize_math.h).
//
// Rooted at the first layer of a chain (a layer no link reaches), so one match sees the whole chain and its
// rewrite writes every new weight once. The driver runs this rule after the fold rules' fixed point
// (Rule::runsAfterFixedPoint), so no BatchNormalization a fold would remove is left between two layers.

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <variant>

#include "affine_layer.h"
#include "bnfold/rewrite/pre_activation_statistics.h"
#include "bnfold/rewrite/rewriter.h"
#include "kernels/equalize_math.h"
#include "rewrite/understood_ops.h"
#include "rules.h"

namespace bnfold::rules {
namespace {

// Scales this close to 1 (|log s| below it) leave a link as it is: a model equalized once is left unchanged.
constexpr double kTrivialLogScale = 1e-4;

bool isHomogeneousActivation(const Node& node) {
  return node.isOnnxOp("Relu") || node.isOnnxOp("LeakyRelu") || node.isOnnxOp("PRelu");
}

// Element-wise ops that do not commute with a positive per-channel scale.
bool isNonHomogeneousActivation(const Node& node) {
  static const char* const kOps[] = {
      "Clip",     "Sigmoid", "HardSigmoid", "HardSwish",       "Tanh", "Elu", "Selu", "Celu", "Softplus",
      "Softsign", "Gelu",    "Mish",        "ThresholdedRelu", "Exp",  "Log", "Swish"};
  if (!node.isOnnxDomain()) return false;
  for (const char* op : kOps)
    if (node.opType() == op) return true;
  return false;
}

bool isResidualJoin(const Node& node) { return node.isOnnxOp("Add") || node.isOnnxOp("Sum"); }

bool isQuantized(const Value* weight) {
  return weight && weight->producer() && weight->producer()->isOnnxOp("DequantizeLinear");
}

bool isSpatial(const AffineLayer& layer) { return !layer.isGemm() && !layer.isMatMul(); }

bool sharedByOthers(const Value* value) { return value && value->uses().size() > 1; }

double largestLogScale(const std::vector<double>& scale) {
  double largest = 0.0;
  for (double s : scale) largest = std::max(largest, std::abs(std::log(s)));
  return largest;
}

struct Link {
  const Node* activation = nullptr;  // null: L2 reads L1's output directly
  AffineLayer next;
};

// Why a layer has no link after it; `quiet` when that is no candidate worth a report entry.
struct LinkProblem {
  MatchFailure failure;
  bool quiet = false;
};

MatchFailure describe(ReasonCode code, std::string message) { return MatchFailure{code, std::move(message)}; }

// Why the output of `value`'s readers cannot carry a per-channel scale to one layer.
MatchFailure readersProblem(const Value& value, const std::string& from) {
  if (value.isGraphOutput())
    return describe(reason::kLayerHasOtherConsumers, "'" + value.name() + "' after '" + from + "' is a graph output");
  for (const Use& use : value.uses()) {
    if (isResidualJoin(*use.node))
      return describe(reason::kResidualAdd, "'" + value.name() + "' after '" + from + "' is added by '" +
                                                use.node->name() + "' (" + use.node->opType() +
                                                ") to another path, which would need the same scales");
    if (isNonHomogeneousActivation(*use.node))
      return describe(reason::kNonHomogeneousActivation,
                      "'" + use.node->name() + "' (" + use.node->opType() + ") after '" + from +
                          "' is not positively homogeneous: a channel scale does not pass through it");
  }
  if (value.uses().size() > 1)
    return describe(reason::kLayerHasOtherConsumers, "'" + value.name() + "' after '" + from + "' is read by " +
                                                         std::to_string(value.uses().size()) + " nodes");
  if (value.uses().empty())
    return describe(reason::kReaderNotLayer, "'" + value.name() + "' after '" + from + "' is not read");
  const Node& reader = *value.uses().front().node;
  return describe(reason::kReaderNotLayer, "'" + value.name() + "' after '" + from + "' is read by '" + reader.name() +
                                               "' (" + reader.opType() +
                                               "), not as the data input of a Conv, ConvTranspose, Gemm or MatMul");
}

// The layer after `first`, through at most one homogeneous activation, or why there is none to equalize with.
std::variant<Link, LinkProblem> linkAfter(const AffineLayer& first, const RuleContext& context) {
  const std::string& from = first.node->name();
  const Value* output = first.node->output(0);
  if (!output) return LinkProblem{describe(reason::kMissingOutput, "'" + from + "' has no output")};
  Link link;
  const Value* carried = output;
  if (!output->isGraphOutput() && output->uses().size() == 1 && isHomogeneousActivation(*output->uses().front().node) &&
      output->uses().front().slot == 0) {
    link.activation = output->uses().front().node;
    carried = link.activation->output(0);
    if (!carried)
      return LinkProblem{describe(reason::kMissingOutput, "'" + link.activation->name() + "' has no output")};
    if (context.isKept(*link.activation))
      return LinkProblem{
          describe(reason::kKeptByUser, "activation '" + link.activation->name() + "' is kept by --keep or --keep-op")};
  }
  const std::string& via = link.activation ? link.activation->name() : from;
  // A layer read directly by a non-layer (a pool, a graph output) is no candidate worth a report entry; after an
  // activation it is.
  auto problem = [&] {
    LinkProblem why{readersProblem(*carried, via)};
    why.quiet = !link.activation && (why.failure.code == reason::kReaderNotLayer || carried->isGraphOutput());
    return why;
  };
  if (carried->isGraphOutput() || carried->uses().size() != 1) return problem();
  const Use& use = carried->uses().front();
  if (!isAffineLayerOp(*use.node) || use.slot != 0) return problem();
  const Node& second = *use.node;
  if (second.graph() != first.node->graph())
    return LinkProblem{
        describe(reason::kLayerInOtherGraph, "'" + second.name() + "' is in another graph than '" + from + "'")};
  if (isQuantized(second.input(1)))
    return LinkProblem{
        describe(reason::kQuantizedWeights, "the weight of '" + second.name() + "' comes from DequantizeLinear")};
  MatchFailure why;
  auto next = readAffineLayer(second, context, &why);
  if (!next) return LinkProblem{asLayerFailure(why)};
  if (isSpatial(first) != isSpatial(*next) || (next->isGemm() && next->transA))
    return LinkProblem{describe(reason::kChannelAxisMismatch, "the output channels of '" + from + "' (" +
                                                                  first.node->opType() + ") are not on the axis '" +
                                                                  second.name() + "' (" + second.opType() +
                                                                  ") reads as its input channels")};
  if (first.outputChannels != next->inputChannels)
    return LinkProblem{describe(reason::kChannelAxisMismatch,
                                "'" + from + "' has " + std::to_string(first.outputChannels) + " output channels, '" +
                                    second.name() + "' reads " + std::to_string(next->inputChannels))};
  for (const Value* value : {first.weightValue, first.biasValue, next->weightValue})
    if (sharedByOthers(value))
      return LinkProblem{describe(reason::kSharedWeights, "'" + value->name() + "' is read by " +
                                                              std::to_string(value->uses().size()) + " nodes")};
  if (const Node* kept = keptConstantProducer(context, {first.weightValue, first.biasValue, next->weightValue}))
    return LinkProblem{
        describe(reason::kLayerKeptByUser, "Constant node '" + kept->name() + "' is kept by --keep or --keep-op")};
  link.next = std::move(*next);
  return link;
}

// Whether a link reaches `node` from a layer before it, which makes `node` part of that layer's chain.
bool isReachedByLink(const Node& node, const RuleContext& context) {
  const Value* input = node.input(0);
  const Node* producer = input ? input->producer() : nullptr;
  if (producer && isHomogeneousActivation(*producer) && producer->input(0)) producer = producer->input(0)->producer();
  if (!producer || !isAffineLayerOp(*producer) || isQuantized(producer->input(1))) return false;
  auto previous = readAffineLayer(*producer, context, nullptr);
  if (!previous) return false;
  auto link = linkAfter(*previous, context);
  const Link* found = std::get_if<Link>(&link);
  return found && found->next.node == &node;
}

struct EqualizeMatch : Match {
  std::vector<AffineLayer> layers;
  std::vector<const Node*> activations;  // per link
  std::vector<kernels::ChainLayer> weights;
  kernels::ChainScales scales;
  std::vector<bool> changed;       // per link: kept and not trivial
  std::optional<LinkProblem> end;  // why the chain stops after its last layer
};

nlohmann::json jsonNumbers(const std::vector<double>& values) {
  nlohmann::json out = nlohmann::json::array();
  for (double v : values) out.push_back(v);
  return out;
}

class EqualizeLayers final : public Rule {
 public:
  const char* name() const override { return "equalize"; }
  const char* summary() const override {
    return "Cross-layer equalization: rescale the channels between two layers joined by Relu/LeakyRelu/PRelu "
           "(or nothing) so their per-tensor int8 weights lose less (off by default; fold --equalize)";
  }
  std::vector<std::string> rootOps() const override { return {"Conv", "ConvTranspose", "Gemm", "MatMul"}; }
  std::vector<OpVersions> opVersions() const override { return joinOps(layerOps(), {kRelu, kLeakyRelu, kPRelu}); }
  bool enabledByDefault() const override { return false; }
  bool runsAfterFixedPoint() const override { return true; }
  const char* failureSection() const override { return "not_equalized"; }

  MatchResult match(const Node& root, const RuleContext& context) const override {
    if (isQuantized(root.input(1)))
      return MatchResult::failure(reason::kQuantizedWeights,
                                  "the weight of '" + root.name() + "' comes from DequantizeLinear");
    MatchFailure why;
    auto head = readAffineLayer(root, context, &why);
    if (!head) return MatchResult::quietFailure(why.code, why.message);
    if (isReachedByLink(root, context))
      return MatchResult::quietFailure(reason::kNoFoldableLayer, "'" + root.name() +
                                                                     "' is equalized with the "
                                                                     "chain of the layer before it");
    auto match = std::make_unique<EqualizeMatch>();
    match->layers.push_back(std::move(*head));
    for (;;) {
      auto link = linkAfter(match->layers.back(), context);
      if (auto* failure = std::get_if<LinkProblem>(&link)) {
        match->end = std::move(*failure);
        break;
      }
      auto& found = std::get<Link>(link);
      match->activations.push_back(found.activation);
      match->layers.push_back(std::move(found.next));
    }
    if (match->layers.size() == 1)
      return match->end->quiet ? MatchResult::quietFailure(match->end->failure.code, match->end->failure.message)
                               : MatchResult::failure(match->end->failure.code, match->end->failure.message);

    for (const AffineLayer& layer : match->layers)
      match->weights.push_back({layer.layout, layer.weight->toDoubles(), layer.weight->dims()});
    const std::size_t links = match->activations.size();
    match->scales = kernels::equalizeChain(match->weights, std::vector<bool>(links, true));
    match->changed.assign(links, false);
    std::string refused;
    for (std::size_t k = 0; k < links; ++k) {
      const bool trivial = largestLogScale(match->scales.proposed[k]) < kTrivialLogScale;
      match->changed[k] = match->scales.kept[k] && !trivial;
      if (!match->scales.kept[k] && !trivial)
        refused += (refused.empty() ? "" : ", ") + std::string("'") + match->layers[k].node->name() + "' -> '" +
                   match->layers[k + 1].node->name() + "'";
    }
    if (std::find(match->changed.begin(), match->changed.end(), true) == match->changed.end()) {
      if (!refused.empty())
        return MatchResult::failure(reason::kNotImproving, "equalizing " + refused +
                                                               " would not lower the per-tensor "
                                                               "int8 weight error");
      return MatchResult::quietFailure(reason::kNotImproving,
                                       "the chain from '" + root.name() + "' is equalized already");
    }
    return MatchResult::success(std::move(match));
  }

  void rewrite(Match& base, Rewriter& rewriter) const override {
    auto& match = static_cast<EqualizeMatch&>(base);
    const std::size_t links = match.activations.size();
    // The scales as written: 1 on every link left alone.
    std::vector<std::vector<double>> applied = match.scales.scales;
    for (std::size_t k = 0; k < links; ++k)
      if (!match.changed[k]) std::fill(applied[k].begin(), applied[k].end(), 1.0);
    std::vector<std::vector<double>> after(match.layers.size());
    for (std::size_t k = 0; k < match.layers.size(); ++k) {
      const bool scalesOutput = k < links && match.changed[k];
      const bool scalesInput = k > 0 && match.changed[k - 1];
      if (!scalesOutput && !scalesInput) continue;
      const AffineLayer& layer = match.layers[k];
      after[k] = kernels::equalizedWeights(match.weights, applied, k);
      Value* weight = addTensor(rewriter, *layer.node, layer.type(), layer.weight->dims(), after[k],
                                scaledWeightNameHint(layer, "_equalized"));
      rewriter.setInput(layer.node, 1, weight);
      if (scalesOutput && layer.biasSlot >= 0) {
        std::vector<double> inverse(applied[k].size());
        for (std::size_t i = 0; i < inverse.size(); ++i) inverse[i] = 1.0 / applied[k][i];
        if (auto bias = foldedBias(layer, {inverse, std::vector<double>(inverse.size(), 0.0)}))
          writeBias(rewriter, layer, *bias);
      }
      // The pre-activation statistics high-bias absorption reads follow the output channels.
      if (scalesOutput)
        rewriter.statistics().divideChannels(*layer.node, applied[k]);
      else
        rewriter.statistics().outputUnchanged(*layer.node);
    }
    // The activations are unchanged, but the layers around them are exact only together with them.
    for (const Node* activation : match.activations)
      if (activation) rewriter.includeUnchanged(activation);

    for (std::size_t k = 0; k < links; ++k) {
      const AffineLayer& first = match.layers[k];
      const AffineLayer& second = match.layers[k + 1];
      if (!match.changed[k]) {
        if (largestLogScale(match.scales.proposed[k]) < kTrivialLogScale) continue;
        rewriter.record("not_equalized", {{"node", first.node->name()},
                                          {"op", first.node->opType()},
                                          {"next", second.node->name()},
                                          {"reason", reason::kNotImproving.str()},
                                          {"message", "the scales would not lower the per-tensor int8 weight error"},
                                          {"scales", jsonNumbers(match.scales.proposed[k])}});
        continue;
      }
      const auto& w1 = match.weights[k];
      const auto& w2 = match.weights[k + 1];
      const auto& w1After = after[k];
      const auto& w2After = after[k + 1];
      auto error = [&](std::size_t layer, const std::vector<double>& values) {
        return kernels::channelRelativeInt8Error(match.weights[layer].layout, values, match.weights[layer].dims,
                                                 layer == k);
      };
      const double errorBefore1 = error(k, w1.weights);
      const double errorBefore2 = error(k + 1, w2.weights);
      const double errorAfter1 = error(k, w1After);
      const double errorAfter2 = error(k + 1, w2After);
      // What never-worse compared with: the same two layers with every other link applied, this one not.
      std::vector<std::vector<double>> withoutLink = applied;
      std::fill(withoutLink[k].begin(), withoutLink[k].end(), 1.0);
      const double errorWithoutLink = error(k, kernels::equalizedWeights(match.weights, withoutLink, k)) +
                                      error(k + 1, kernels::equalizedWeights(match.weights, withoutLink, k + 1));
      const nlohmann::json activation =
          match.activations[k] ? nlohmann::json(match.activations[k]->opType()) : nlohmann::json(nullptr);
      rewriter.record("equalized",
                      {{"node", first.node->name()},
                       {"op", first.node->opType()},
                       {"layer1", first.node->name()},
                       {"layer2", second.node->name()},
                       {"activation", activation},
                       {"scales", jsonNumbers(applied[k])},
                       {"ranges_before",
                        {{"layer1_output", jsonNumbers(kernels::outputChannelRanges(w1.layout, w1.weights, w1.dims))},
                         {"layer2_input", jsonNumbers(kernels::inputChannelRanges(w2.layout, w2.weights, w2.dims))}}},
                       {"ranges_after",
                        {{"layer1_output", jsonNumbers(kernels::outputChannelRanges(w1.layout, w1After, w1.dims))},
                         {"layer2_input", jsonNumbers(kernels::inputChannelRanges(w2.layout, w2After, w2.dims))}}},
                       {"quant_error_before",
                        {{"layer1", errorBefore1}, {"layer2", errorBefore2}, {"sum", errorBefore1 + errorBefore2}}},
                       {"quant_error_after",
                        {{"layer1", errorAfter1}, {"layer2", errorAfter2}, {"sum", errorAfter1 + errorAfter2}}},
                       {"quant_error_without_link", errorWithoutLink},
                       {"chain_layers", match.layers.size()},
                       {"sweeps", match.scales.sweeps},
                       {"converged", match.scales.converged}});
    }
    if (match.end && !match.end->quiet)
      rewriter.record("not_equalized", {{"node", match.layers.back().node->name()},
                                        {"op", match.layers.back().node->opType()},
                                        {"reason", match.end->failure.code.str()},
                                        {"message", match.end->failure.message}});
  }
};

}  // namespace

std::unique_ptr<Rule> makeEqualizeLayers() { return std::make_unique<EqualizeLayers>(); }

}  // namespace bnfold::rules
