// Before:     Y = L2(Clip(L1(X), 0, 6))        Clip with min 0 and max 6 (ReLU6), L1, L2 = Conv | ConvTranspose |
//                                              Gemm | MatMul; several readers L2, L3, ... as well
// After:      Y = L2(Relu(L1(X)))              so equalize can scale the channels between L1 and L2
// Conditions: only with --relu6-to-relu (it CHANGES THE FUNCTION: values of L1's output above 6 are no longer
//             clipped); min 0 and max 6 constant (attributes before opset 11, inputs from 11); the Clip's input an
//             affine layer's output read only by it, not a graph output; its output read only by affine layers
//             as their data input, not a graph output. Everything else is left quietly (Clips are common).
// Math:       Clip(z, 0, 6) = Relu(z) exactly where z <= 6; elsewhere Relu gives z instead of 6. --verify checks
//             the rewrite where its assumption holds: L1's output drawn in [-6, 6) per element, on both sides.

#include <memory>
#include <optional>
#include <string>

#include "affine_layer.h"
#include "bnfold/rewrite/rewriter.h"
#include "rewrite/understood_ops.h"
#include "rules.h"

namespace bnfold::rules {
namespace {

constexpr double kRelu6Max = 6.0;

struct Relu6Match : Match {
  const Node* clip = nullptr;
  const Node* layer = nullptr;
  int64_t channelAxis = 1;
  int64_t channels = 0;
  std::vector<std::string> readers;
};

// The Clip's bound: the attribute before opset 11, the optional constant scalar input from 11. Nullopt when it is
// not a constant; `fallback` when omitted.
std::optional<double> clipBound(const Node& clip, const char* attribute, std::size_t slot, double fallback,
                                const RuleContext& context) {
  if (context.opset() < 11) return static_cast<double>(clip.attributeFloat(attribute, static_cast<float>(fallback)));
  if (clip.inputs().size() <= slot || !clip.input(slot)) return fallback;
  const Tensor* tensor = context.constantOf(clip.input(slot));
  if (!tensor) return std::nullopt;
  const std::vector<double> values = tensor->toDoubles();
  if (values.size() != 1) return std::nullopt;
  return values.front();
}

class ReplaceRelu6WithRelu final : public Rule {
 public:
  const char* name() const override { return "relu6-to-relu"; }
  const char* summary() const override {
    return "With --relu6-to-relu (and --equalize): replace Clip(0, 6) between two layers with Relu so equalize can "
           "reach the link; CHANGES THE FUNCTION where the first layer's output exceeds 6 (off by default)";
  }
  std::vector<std::string> rootOps() const override { return {"Clip"}; }
  std::vector<OpVersions> opVersions() const override { return joinOps(layerOps(), {kClip, kRelu}); }
  bool enabledByDefault() const override { return false; }
  // After the folds' fixed point, so the layer before the Clip is the folded one, and before equalize.
  bool runsAfterFixedPoint() const override { return true; }

  MatchResult match(const Node& clip, const RuleContext& context) const override {
    const auto low = clipBound(clip, "min", 1, -3.4028234663852886e38, context);
    const auto high = clipBound(clip, "max", 2, 3.4028234663852886e38, context);
    if (!low || !high)
      return MatchResult::quietFailure(reason::kOperandNotConstant,
                                       "the bounds of '" + clip.name() + "' are not constant scalars");
    if (*low != 0.0 || *high != kRelu6Max)
      return MatchResult::quietFailure(reason::kNonHomogeneousActivation,
                                       "'" + clip.name() + "' clips to other bounds than [0, 6]: not a ReLU6");
    const Value* input = clip.input(0);
    const Node* producer = input ? input->producer() : nullptr;
    if (!producer || !isAffineLayerOp(*producer) || input->isGraphOutput() || input->uses().size() != 1)
      return MatchResult::quietFailure(reason::kNoFoldableProducer,
                                       "'" + clip.name() + "' does not read a layer's output alone");
    auto layer = readAffineLayer(*producer, context, nullptr);
    if (!layer)
      return MatchResult::quietFailure(reason::kNoFoldableProducer,
                                       "'" + producer->name() + "' before '" + clip.name() + "' is no affine layer");
    const Value* output = clip.output(0);
    if (!output || output->isGraphOutput() || output->uses().empty())
      return MatchResult::quietFailure(reason::kReaderNotLayer, "'" + clip.name() + "' is a graph output or unread");
    auto match = std::make_unique<Relu6Match>();
    for (const Use& use : output->uses()) {
      if (!isAffineLayerOp(*use.node) || use.slot != 0)
        return MatchResult::quietFailure(reason::kReaderNotLayer, "'" + clip.name() + "' is read by '" +
                                                                      use.node->name() + "' (" + use.node->opType() +
                                                                      "), not as a layer's data input");
      match->readers.push_back(use.node->name());
    }
    match->clip = &clip;
    match->layer = producer;
    match->channelAxis = layer->outputChannelAxis();
    match->channels = layer->outputChannels;
    return MatchResult::success(std::move(match));
  }

  void rewrite(Match& base, Rewriter& rewriter) const override {
    auto& match = static_cast<Relu6Match&>(base);
    const Node& clip = *match.clip;
    const std::string clipName = clip.name();
    const std::string input = clip.input(0)->name();
    Node* relu = rewriter.createNode(&clip, "Relu", {clip.input(0)}, {clip.output(0)->name()}, clipName + "_relu");
    // --verify compares where the rewrite's assumption holds: the layer's output (drawn, so the layer is in the
    // region) in [-6, 6), where Clip and Relu agree.
    rewriter.includeUnchanged(match.layer);
    const std::string statement = "CHANGES THE FUNCTION: equal only where '" + input + "' (the output of '" +
                                  match.layer->name() + "') stays at or below 6; above, Relu passes it unclipped";
    const auto channels = static_cast<std::size_t>(match.channels);
    rewriter.assume({input, match.channelAxis, std::vector<double>(channels, -kRelu6Max),
                     std::vector<double>(channels, -kRelu6Max), statement, 2 * kRelu6Max});
    rewriter.replaceValueKeepingName(clip.output(0), relu->output(0));
    rewriter.record("relu6_replaced", {{"node", clipName},
                                       {"op", "Clip"},
                                       {"replacement", relu->name()},
                                       {"layer", match.layer->name()},
                                       {"readers", match.readers},
                                       {"warning", statement}});
  }
};

}  // namespace

std::unique_ptr<Rule> makeReplaceRelu6WithRelu() { return std::make_unique<ReplaceRelu6WithRelu>(); }

}  // namespace bnfold::rules
