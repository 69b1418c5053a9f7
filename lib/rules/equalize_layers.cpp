// Before:     Y = L2(A(L1(X, W1, B1)), W2, B2)        A = Relu | LeakyRelu | PRelu | none, L = Conv | ConvTranspose
//             (and longer chains L1 -> A -> L2 -> A -> L3 ...)        | Gemm | MatMul with a constant 2-D weight
//             Between Conv/ConvTranspose layers, MaxPools and AveragePools (ceil_mode 0) before or after A too.
//             Junctions: Ya = La(A(L1(X))), Yb = Lb(A(L1(X))), ...                       (fan-out)
//                        Y = G(F(A(L1(X))))   F = Flatten | Reshape to [N, C*H*W], G = Gemm | MatMul    (flatten)
//                        Y = L(F?(P(A(L1(X)))))  P = GlobalAveragePool | GlobalMaxPool | spatial ReduceMean, L a
//                        Conv (P keeps dims) or Gemm | MatMul (through F, or P drops the spatial axes)    (pool)
//                        Ya = La(C), Yb = Lb(C), C = Concat(A1(L1(X1)), A2(L2(X2)), ...) on the channel axis
//                                                                                                    (concat)
//                        a residual stream: S = A(L1(X1) + A(L2(X2) + ...)), the values Adds join (with Relus,
//                        LeakyRelus and pools on them) written by layers L1, L2, ... and read by layers La, Lb, ...
//                                                                                                    (residual)
// After:      Y = L2(A(L1(X, W1', B1')), W2', B2): the same graph with new weights and biases
// Conditions: every layer readable as an affine layer (constant floating weight and bias, not kept); L1's output
//             read only by A (or L2), A's only by L2 as its data input, neither a graph output; the channels
//             on the same axis (Conv/ConvTranspose to Conv/ConvTranspose, Gemm/MatMul to Gemm (transA = 0) /
//             MatMul) and as many of them; weights and L1's bias read by no other node, not DequantizeLinear's;
//             the scales lower the chain's int8 weight noise referred to its output (else the link is left).
//             Fan-out: every reader of A's output such a layer. Flatten: L1 spatial, its dims after the channel
//             axis known (their product is the block of G's input features per channel, layout_path.h). Concat:
//             every input a layer's output (through its own activation) read only by the Concat, the axis the
//             layers' channel axis, the Concat read only by layers (one or several) as their data input.
//             Residual: every value of the stream produced by a layer (Conv/ConvTranspose, all of the same rank
//             and channels), an Add, its activations or a MaxPool/AveragePool (ceil_mode 0, no Indices), read
//             only by those or by layers as their data input (directly or through a spatial mean / Flatten), none
//             a graph output, opset >= 7; no layer both reads and writes it.
// Math:       A(s z) = s A(z) for s > 0 (per-channel slopes stay with their channel), so with
//             s_i = sqrt(r1_i / r2_i), r1_i = max|W1 feeding output channel i|, r2_i = max|W2 reading input
//             channel i|: W1'[i] = W1[i] / s_i, B1'[i] = B1[i] / s_i, W2'[:, i] = W2[:, i] * s_i. A chain's
//             scales are the sweep's or AIMET's one pass, each link's to a power in {0, 1/2, 1}, whichever
//             has the least int8 weight noise referred to the chain's output (kernels/equalize_math.h). A junction
//             takes one pass with r2_i the largest range of channel i over its readers (kernels/equalize_junction.h).
//
// Rooted at the first layer of a chain (a layer no link reaches), so one match sees the whole chain and its
// rewrite writes every new weight once; a fan-out or Flatten after the chain's last layer belongs to that match
// (the last layer's weights take both scales). A Concat junction is rooted at the Concat, which the driver visits
// after its producers' chains and before its reader's, each match reading the weights as the rewrites before it
// left them. A residual stream is rooted at its first Add (by node order), which reads the weights as the chains
// before it left them; the chains after it read them as the stream left them. The driver runs this rule after the
// fold rules' fixed point (Rule::runsAfterFixedPoint), so no
// BatchNormalization a fold would remove is left between two layers.

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <unordered_set>
#include <variant>

#include "affine_layer.h"
#include "analysis/op_forms.h"
#include "analysis/shape_ops.h"
#include "bnfold/rewrite/pre_activation_statistics.h"
#include "bnfold/rewrite/rewriter.h"
#include "kernels/equalize_junction.h"
#include "kernels/equalize_math.h"
#include "layout_path.h"
#include "rewrite/understood_ops.h"
#include "rules.h"
#include "scaled_weight.h"

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

bool sharedByOthers(const Value* value) { return value && value->uses().size() > 1; }

double largestLogScale(const std::vector<double>& scale) {
  double largest = 0.0;
  for (double s : scale) largest = std::max(largest, std::abs(std::log(s)));
  return largest;
}

struct Link {
  const Node* activation = nullptr;  // null: L2 reads L1's output directly
  std::vector<const Node*> pools;    // the MaxPools and AveragePools on the way, before or after the activation
  AffineLayer next;
};

// Why a layer has no link after it; `quiet` when that is no candidate worth a report entry.
struct LinkProblem {
  MatchFailure failure;
  bool quiet = false;
};

MatchFailure failure(ReasonCode code, std::string message) { return MatchFailure{code, std::move(message)}; }

// A MaxPool or AveragePool passes a positive scale of each channel: over a window of one channel, max(s x) =
// s max(x) (its padding is never chosen) and mean(s x) = s mean(x) (its padding counts as zeros or not at all).
bool isWindowPool(const Node& node) { return node.isOnnxOp("MaxPool") || node.isOnnxOp("AveragePool"); }

// Why a window pool that reads a scaled value is not passed through (ceil_mode, which --verify does not evaluate;
// MaxPool's Indices output), or nullopt when it is passed or is no window pool.
std::optional<std::string> poolProblem(const Node& node) {
  if (!isWindowPool(node)) return std::nullopt;
  if (node.attributeInt("ceil_mode", 0) != 0) return "it has ceil_mode 1, which --verify does not evaluate";
  if (node.outputs().size() != 1) return "its Indices output would change with the scales";
  return std::nullopt;
}

bool isChannelPool(const Node& node) { return isWindowPool(node) && !poolProblem(node); }

// Why the output of `value`'s readers cannot carry a per-channel scale to one layer.
MatchFailure readersProblem(const Value& value, const std::string& from) {
  if (value.isGraphOutput())
    return failure(reason::kLayerHasOtherConsumers, "'" + value.name() + "' after '" + from + "' is a graph output");
  for (const Use& use : value.uses()) {
    if (isResidualJoin(*use.node))
      return failure(reason::kResidualAdd, "'" + value.name() + "' after '" + from + "' is added by '" +
                                               use.node->name() + "' (" + use.node->opType() +
                                               ") to another path, which would need the same scales");
    if (isNonHomogeneousActivation(*use.node))
      return failure(reason::kNonHomogeneousActivation,
                     "'" + use.node->name() + "' (" + use.node->opType() + ") after '" + from +
                         "' is not positively homogeneous: a channel scale does not pass through it");
  }
  if (value.uses().size() > 1)
    return failure(reason::kLayerHasOtherConsumers, "'" + value.name() + "' after '" + from + "' is read by " +
                                                        std::to_string(value.uses().size()) + " nodes");
  if (value.uses().empty())
    return failure(reason::kReaderNotLayer, "'" + value.name() + "' after '" + from + "' is not read");
  const Node& reader = *value.uses().front().node;
  if (auto why = poolProblem(reader))
    return failure(reason::kReaderNotLayer, "'" + value.name() + "' after '" + from + "' is read by '" + reader.name() +
                                                "' (" + reader.opType() +
                                                "), which a channel scale does not pass: " + *why);
  return failure(reason::kReaderNotLayer, "'" + value.name() + "' after '" + from + "' is read by '" + reader.name() +
                                              "' (" + reader.opType() +
                                              "), not as the data input of a Conv, ConvTranspose, Gemm or MatMul");
}

// Layer `first`'s output after what alone reads it and passes a positive channel scale: at most one homogeneous
// activation and, after a Conv or ConvTranspose, pools (Conv -> BN -> LeakyRelu -> MaxPool -> Conv in YOLO-tiny
// and VGG-style nets), in either order.
struct Carried {
  const Node* activation = nullptr;
  std::vector<const Node*> pools;
  const Value* value = nullptr;

  bool passesAnything() const { return activation || !pools.empty(); }
  // What `value` comes out of, for messages.
  const std::string& from(const AffineLayer& first) const {
    return passesAnything() ? value->producer()->name() : first.node->name();
  }
};

std::variant<Carried, LinkProblem> carriedOutput(const AffineLayer& first, const RuleContext& context) {
  const std::string& from = first.node->name();
  const Value* output = first.node->output(0);
  if (!output) return LinkProblem{failure(reason::kMissingOutput, "'" + from + "' has no output")};
  Carried carried{nullptr, {}, output};
  for (;;) {
    const Value* value = carried.value;
    if (value->isGraphOutput() || value->uses().size() != 1 || value->uses().front().slot != 0) break;
    const Node* next = value->uses().front().node;
    const bool activation = !carried.activation && isHomogeneousActivation(*next);
    if (!activation && !(first.isSpatial() && isChannelPool(*next))) break;
    if (context.isKept(*next))
      return LinkProblem{failure(reason::kKeptByUser, (activation ? std::string("activation") : next->opType()) + " '" +
                                                          next->name() + "' is kept by --keep or --keep-op")};
    carried.value = next->output(0);
    if (!carried.value) return LinkProblem{failure(reason::kMissingOutput, "'" + next->name() + "' has no output")};
    if (activation)
      carried.activation = next;
    else
      carried.pools.push_back(next);
  }
  return carried;
}

// The pools a link passes, by name, for the report.
nlohmann::json poolNames(const std::vector<const Node*>& pools) {
  nlohmann::json names = nlohmann::json::array();
  for (const Node* pool : pools) names.push_back(pool->name());
  return names;
}

// `node` read as an affine layer (a constant floating weight that is not DequantizeLinear's), or why it cannot be.
std::variant<AffineLayer, LinkProblem> layerOrProblem(const Node& node, const RuleContext& context) {
  if (isQuantized(node.input(1)))
    return LinkProblem{
        failure(reason::kQuantizedWeights, "the weight of '" + node.name() + "' comes from DequantizeLinear")};
  MatchFailure why;
  auto layer = readAffineLayer(node, context, &why);
  if (!layer) return LinkProblem{asLayerFailure(why)};
  return std::move(*layer);
}

// `second` read as the layer that takes the inverse of `first`'s output scales on its input channels, `block`
// consecutive input features per channel of `first` (more than 1 through a Flatten), or why it cannot. `features`:
// a spatial `first`'s channels reach `second` as the features of a 2-D input (through a Flatten or a spatial mean
// that drops the spatial axes).
std::variant<AffineLayer, LinkProblem> readerLayer(const Node& second, const AffineLayer& first, int64_t block,
                                                   bool features, const RuleContext& context) {
  const std::string& from = first.node->name();
  if (second.graph() != first.node->graph())
    return LinkProblem{
        failure(reason::kLayerInOtherGraph, "'" + second.name() + "' is in another graph than '" + from + "'")};
  auto read = layerOrProblem(second, context);
  if (auto* problem = std::get_if<LinkProblem>(&read)) return std::move(*problem);
  AffineLayer* next = &std::get<AffineLayer>(read);
  const bool sameAxis = features ? first.isSpatial() && !next->isSpatial() : first.isSpatial() == next->isSpatial();
  if (!sameAxis || (next->isGemm() && next->transA))
    return LinkProblem{failure(reason::kChannelAxisMismatch, "the output channels of '" + from + "' (" +
                                                                  first.node->opType() + ") are not on the axis '" +
                                                                  second.name() + "' (" + second.opType() +
                                                                  ") reads as its input channels")};
  if (checkedProduct(first.outputChannels, block) != next->inputChannels)
    return LinkProblem{failure(reason::kChannelAxisMismatch,
                                "'" + from + "' has " + std::to_string(first.outputChannels) + " output channels" +
                                    (block > 1 ? " of " + std::to_string(block) + " features each" : std::string()) +
                                    ", '" + second.name() + "' reads " + std::to_string(next->inputChannels))};
  return std::move(*next);
}

// Why the weights a rewrite would replace cannot be: read by another node too, or a Constant the user keeps.
std::optional<LinkProblem> weightsProblem(const std::vector<const Value*>& values, const RuleContext& context) {
  for (const Value* value : values)
    if (sharedByOthers(value))
      return LinkProblem{failure(reason::kSharedWeights, "'" + value->name() + "' is read by " +
                                                              std::to_string(value->uses().size()) + " nodes")};
  if (const Node* kept = keptConstantProducer(context, values))
    return LinkProblem{
        failure(reason::kLayerKeptByUser, "Constant node '" + kept->name() + "' is kept by --keep or --keep-op")};
  return std::nullopt;
}

// A Concat that a layer's output (after its activation) feeds is equalized as a junction rooted at the Concat,
// which says why when it cannot be.
bool feedsConcat(const Value& value) {
  return !value.isGraphOutput() && value.uses().size() == 1 && value.uses().front().node->isOnnxOp("Concat");
}

// The layer after `first`, through at most one homogeneous activation, or why there is none to equalize with.
std::variant<Link, LinkProblem> linkAfter(const AffineLayer& first, const RuleContext& context) {
  auto carriedOrProblem = carriedOutput(first, context);
  if (auto* problem = std::get_if<LinkProblem>(&carriedOrProblem)) return std::move(*problem);
  const Carried carried = std::get<Carried>(carriedOrProblem);
  Link link;
  link.activation = carried.activation;
  link.pools = carried.pools;
  const std::string& via = carried.from(first);
  // A layer read directly by a non-layer (a pool, a graph output) is no candidate worth a report entry; after an
  // activation or a pool it is.
  auto problem = [&] {
    LinkProblem why{readersProblem(*carried.value, via)};
    why.quiet = (!carried.passesAnything() &&
                 (why.failure.code == reason::kReaderNotLayer || carried.value->isGraphOutput())) ||
                feedsConcat(*carried.value);
    return why;
  };
  if (carried.value->isGraphOutput() || carried.value->uses().size() != 1) return problem();
  const Use& use = carried.value->uses().front();
  if (!isAffineLayerOp(*use.node) || use.slot != 0) return problem();
  auto next = readerLayer(*use.node, first, 1, false, context);
  if (auto* failure = std::get_if<LinkProblem>(&next)) return std::move(*failure);
  link.next = std::move(std::get<AffineLayer>(next));
  if (auto shared = weightsProblem({first.weightValue, first.biasValue, link.next.weightValue}, context))
    return std::move(*shared);
  return link;
}

// Whether a link reaches `node` from a layer before it, which makes `node` part of that layer's chain.
bool isReachedByLink(const Node& node, const RuleContext& context) {
  const Value* input = node.input(0);
  const Node* producer = input ? input->producer() : nullptr;
  // Back over what carriedOutput passes (linkAfter below checks that it does).
  while (producer && (isHomogeneousActivation(*producer) || isChannelPool(*producer)) && producer->input(0))
    producer = producer->input(0)->producer();
  if (!producer || !isAffineLayerOp(*producer) || isQuantized(producer->input(1))) return false;
  auto previous = readAffineLayer(*producer, context, nullptr);
  if (!previous) return false;
  auto link = linkAfter(*previous, context);
  const Link* found = std::get_if<Link>(&link);
  return found && found->next.node == &node;
}

// A junction (kernels/equalize_junction.h): one layer read by several layers (a fan-out), one Conv read through a
// Flatten by a Gemm/MatMul (features per channel), or several layers concatenated on the channel axis and read by
// one layer. Each producer may have its own homogeneous activation.
struct JunctionProducerLayer {
  AffineLayer layer;
  const Node* activation = nullptr;
  std::vector<const Node*> pools;  // pools after the layer (a junction after a chain's last layer)
};
struct JunctionReaderLayer {
  AffineLayer layer;
  const Node* pool = nullptr;     // the global pool or ReduceMean before the reader (or its Flatten), or null
  const Node* flatten = nullptr;  // the Flatten/Reshape before a Gemm/MatMul reader, or null
  int64_t block = 1;
};
struct Junction {
  const char* kind = "";  // fan-out | flatten | pool | concat | residual
  const Node* concat = nullptr;
  // A residual stream's Adds and the other nodes its rewrite must be checked with: the stream's activations and pools,
  // and the nodes on the paths from its readers to its producers (unchanged).
  std::vector<const Node*> adds, through;
  std::vector<JunctionProducerLayer> producers;
  std::vector<JunctionReaderLayer> readers;
  std::size_t channels = 0;
  // Filled by equalizeJunction (below), in match.
  std::vector<kernels::JunctionProducer> producerWeights;
  std::vector<kernels::JunctionReader> readerWeights;
  kernels::JunctionScales scales;
  std::vector<std::vector<double>> producersAfter, readersAfter;
  bool trivial = true;
  bool changed = false;
};

std::optional<LinkProblem> junctionWeightsProblem(const Junction& junction, const RuleContext& context) {
  std::vector<const Value*> values;
  for (const auto& producer : junction.producers) {
    values.push_back(producer.layer.weightValue);
    values.push_back(producer.layer.biasValue);
  }
  for (const auto& reader : junction.readers) values.push_back(reader.layer.weightValue);
  return weightsProblem(values, context);
}

// Whether `node` pools each channel of a rank-`rank` NC... input over all its spatial axes and nothing else:
// GlobalAveragePool, GlobalMaxPool, or ReduceMean over exactly axes 2 .. rank-1; `keepsDims` says whether they stay
// as 1s. A mean or a max is positively homogeneous and per channel, so a channel scale passes through it.
bool isSpatialMean(const Node& node, int64_t rank, const RuleContext& context, bool* keepsDims) {
  *keepsDims = true;
  if (node.isOnnxOp("GlobalAveragePool") || node.isOnnxOp("GlobalMaxPool")) return true;
  if (!node.isOnnxOp("ReduceMean") || rank < 3) return false;
  std::vector<int64_t> axes;
  if (context.opset() < kReduceMeanAxesInputOpset) {
    axes = node.attributeInts("axes");
  } else if (node.inputs().size() > 1 && node.input(1)) {
    std::optional<std::vector<int64_t>> given = context.integersOf(node.input(1));
    if (!given) return false;
    axes = std::move(*given);
  }
  for (int64_t& axis : axes)
    if (axis < 0) axis += rank;
  std::sort(axes.begin(), axes.end());
  std::vector<int64_t> spatial;
  for (int64_t axis = 2; axis < rank; ++axis) spatial.push_back(axis);
  *keepsDims = node.attributeInt("keepdims", 1) != 0;
  return axes == spatial;
}

// How a reader of `value` (`first`'s channels, after its activation) takes a scale per channel on its input: a
// layer reading it as its data input, directly, through a spatial mean, a Flatten/Reshape to features, or both.
struct ReaderThrough {
  std::optional<JunctionReaderLayer> reader;
  std::optional<LinkProblem> problem;     // it reaches a layer that cannot take the scales
  std::optional<LinkProblem> notReached;  // it reaches no layer (`via`: what `value` comes out of, for the message)
};

// `shapedAsFirst`: `value` has the shape of `first`'s output (no pool between), which tells its dims when its own
// shape is not known.
ReaderThrough readerThrough(const Use& use, const AffineLayer& first, const Value& value, bool shapedAsFirst,
                            const std::string& via, const RuleContext& context) {
  ReaderThrough through;
  const auto rank = static_cast<int64_t>(first.weight->dims().size());  // a spatial layer's output rank
  const Node* reader = use.node;
  JunctionReaderLayer read;
  int slot = use.slot;
  bool features = false;
  std::optional<std::vector<int64_t>> pooledShape;  // what a Flatten after a spatial mean reads
  bool keepsDims = true;
  if (slot == 0 && first.isSpatial() && isSpatialMean(*reader, rank, context, &keepsDims)) {
    read.pool = reader;
    features = !keepsDims;
    const auto shape = context.knownShape(*first.node->output(0));
    pooledShape =
        std::vector<int64_t>{shape && !shape->empty() ? shape->front() : analysis::kUnknownDim, first.outputChannels};
    if (keepsDims) pooledShape->resize(static_cast<std::size_t>(rank), 1);
    const Value* pooled = reader->output(0);
    reader = pooled ? soleConsumer(*pooled, &slot) : nullptr;
    if (!reader) {
      through.notReached =
          LinkProblem{pooled ? readersProblem(*pooled, read.pool->name())
                             : failure(reason::kMissingOutput, "'" + read.pool->name() + "' has no output")};
      return through;
    }
  }
  if (slot == 0 && (reader->isOnnxOp("Flatten") || reader->isOnnxOp("Reshape")) && first.isSpatial()) {
    const Value* flat = reader->output(0);
    int afterSlot = 0;
    const Node* after = flat ? soleConsumer(*flat, &afterSlot) : nullptr;
    if (after && afterSlot == 0 && (after->isOnnxOp("Gemm") || after->isOnnxOp("MatMul"))) {
      MatchFailure why;
      auto block = read.pool
                       ? featuresPerChannel(*first.node, pooledShape, *reader, context, &why)
                       : featuresPerChannel(*first.node, {&value, shapedAsFirst ? first.node->output(0) : nullptr},
                                            *reader, context, &why);
      if (!block) {
        through.problem = LinkProblem{why};
        return through;
      }
      read.flatten = reader;
      read.block = *block;
      features = true;
      reader = after;
    }
  }
  if (!isAffineLayerOp(*reader) || slot != 0) {
    through.notReached = LinkProblem{readersProblem(value, via)};
    return through;
  }
  auto layer = readerLayer(*reader, first, read.block, features, context);
  if (auto* problem = std::get_if<LinkProblem>(&layer)) {
    through.problem = std::move(*problem);
    return through;
  }
  read.layer = std::move(std::get<AffineLayer>(layer));
  through.reader = std::move(read);
  return through;
}

// The junction after `first` when its output (after its activation) is read by several layers, or through a
// Flatten/Reshape or a spatial mean (then maybe a Flatten/Reshape) by a layer; nullopt when it is no such junction
// (linkAfter's reason stands).
std::optional<std::variant<Junction, LinkProblem>> junctionAfter(const AffineLayer& first, const RuleContext& context) {
  auto carriedOrProblem = carriedOutput(first, context);
  if (std::holds_alternative<LinkProblem>(carriedOrProblem)) return std::nullopt;
  const Carried carried = std::get<Carried>(carriedOrProblem);
  const Value& value = *carried.value;
  if (value.isGraphOutput() || value.uses().empty()) return std::nullopt;
  const bool fanOut = value.uses().size() > 1;
  const std::string& via = carried.from(first);
  Junction junction;
  junction.kind = fanOut ? "fan-out" : "flatten";
  junction.producers.push_back({first, carried.activation, carried.pools});
  junction.channels = static_cast<std::size_t>(first.outputChannels);
  for (const Use& use : value.uses()) {
    ReaderThrough through = readerThrough(use, first, value, carried.pools.empty(), via, context);
    if (through.problem) return std::variant<Junction, LinkProblem>{std::move(*through.problem)};
    if (through.notReached) {
      if (!fanOut) return std::nullopt;
      return std::variant<Junction, LinkProblem>{std::move(*through.notReached)};
    }
    junction.readers.push_back(std::move(*through.reader));
  }
  const JunctionReaderLayer& sole = junction.readers.front();
  if (!fanOut && !sole.flatten && !sole.pool) return std::nullopt;  // a plain link
  if (!fanOut && sole.pool) junction.kind = "pool";
  if (auto problem = junctionWeightsProblem(junction, context)) return std::variant<Junction, LinkProblem>{*problem};
  return std::variant<Junction, LinkProblem>{std::move(junction)};
}

// Whether `value` comes from a layer, through at most one homogeneous activation: a Concat input worth a junction.
bool fromLayer(const Value* value) {
  const Node* producer = value ? value->producer() : nullptr;
  if (producer && isHomogeneousActivation(*producer) && producer->input(0)) producer = producer->input(0)->producer();
  return producer && isAffineLayerOp(*producer);
}

// The layers a channel-axis Concat joins and the one layer that reads it, or why they cannot be equalized.
std::variant<Junction, LinkProblem> concatJunction(const Node& concat, const RuleContext& context) {
  Junction junction;
  junction.kind = "concat";
  junction.concat = &concat;
  const std::string& name = concat.name();
  const Value* output = concat.output(0);
  if (!output) return LinkProblem{failure(reason::kMissingOutput, "'" + name + "' has no output")};
  // One reader or several (a Concat that fans out), each a layer reading it as its data input.
  const bool readByLayers = !output->uses().empty() && std::all_of(output->uses().begin(), output->uses().end(),
                                                                   [](const Use& use) {
                                                                     return isAffineLayerOp(*use.node) && use.slot == 0;
                                                                   });
  if (output->isGraphOutput() || !readByLayers) return LinkProblem{readersProblem(*output, name)};
  for (std::size_t i = 0; i < concat.inputs().size(); ++i) {
    const Value* input = concat.input(i);
    const std::string which = "input " + std::to_string(i) + " of '" + name + "'";
    const Node* activation = input ? input->producer() : nullptr;
    if (activation && isNonHomogeneousActivation(*activation) && fromLayer(activation->input(0)))
      return LinkProblem{failure(reason::kNonHomogeneousActivation,
                                  "'" + activation->name() + "' (" + activation->opType() + ") before '" + name +
                                      "' is not positively homogeneous: a channel scale does not pass through it")};
    if (!fromLayer(input))
      return LinkProblem{failure(reason::kNoFoldableProducer,
                                  which + " does not come from a Conv, ConvTranspose, Gemm or MatMul (through at most "
                                          "one Relu, LeakyRelu or PRelu)")};
    if (input->isGraphOutput() || input->uses().size() != 1)
      return LinkProblem{
          failure(reason::kLayerHasOtherConsumers, which + " is a graph output or read by other nodes too")};
    JunctionProducerLayer producer;
    const Node* node = input->producer();
    if (node && isHomogeneousActivation(*node) && node->input(0)) {
      producer.activation = node;
      if (context.isKept(*node))
        return LinkProblem{
            failure(reason::kKeptByUser, "activation '" + node->name() + "' is kept by --keep or --keep-op")};
      const Value* layerOutput = node->input(0);
      if (layerOutput->isGraphOutput() || layerOutput->uses().size() != 1)
        return LinkProblem{failure(reason::kLayerHasOtherConsumers,
                                    "'" + layerOutput->name() + "' before '" + name + "' is read by other nodes too")};
      node = layerOutput->producer();
    }
    if (node->graph() != concat.graph())
      return LinkProblem{
          failure(reason::kLayerInOtherGraph, "'" + node->name() + "' is in another graph than '" + name + "'")};
    auto read = layerOrProblem(*node, context);
    if (auto* problem = std::get_if<LinkProblem>(&read)) return std::move(*problem);
    AffineLayer* layer = &std::get<AffineLayer>(read);
    const int64_t rank = layer->isSpatial() ? static_cast<int64_t>(layer->weight->dims().size())
                                           : (layer->isGemm() ? 2 : layer->outputRank);
    if (rank < 1)
      return LinkProblem{failure(reason::kRankUnknown, "the rank of the output of '" + node->name() +
                                                            "' is not known, so the axis of '" + name +
                                                            "' cannot be matched with its channels")};
    int64_t axis = concat.attributeInt("axis", 1);
    if (axis < 0) axis += rank;
    if (axis != layer->outputChannelAxis())
      return LinkProblem{failure(reason::kChannelAxisMismatch, "'" + name + "' joins axis " + std::to_string(axis) +
                                                                    ", not the channel axis of '" + node->name() +
                                                                    "' (" + node->opType() + ")")};
    if (!junction.producers.empty() && layer->isSpatial() != junction.producers.front().layer.isSpatial())
      return LinkProblem{failure(reason::kChannelAxisMismatch,
                                  "'" + name + "' joins the outputs of spatial and non-spatial layers")};
    producer.layer = std::move(*layer);
    junction.channels += static_cast<std::size_t>(producer.layer.outputChannels);
    junction.producers.push_back(std::move(producer));
  }
  if (junction.producers.empty())
    return LinkProblem{failure(reason::kNoFoldableProducer, "'" + name + "' has no inputs")};
  // The reader sees the Concat as one layer with all the producers' channels.
  AffineLayer joined = junction.producers.front().layer;
  joined.outputChannels = static_cast<int64_t>(junction.channels);
  for (const Use& use : output->uses()) {
    auto reader = readerLayer(*use.node, joined, 1, false, context);
    if (auto* problem = std::get_if<LinkProblem>(&reader)) return *problem;
    junction.readers.push_back({std::move(std::get<AffineLayer>(reader)), nullptr, nullptr, 1});
  }
  if (auto problem = junctionWeightsProblem(junction, context)) return *problem;
  return junction;
}

// The junction's scales and weights after, from the producers' weights as given (a chain may have rescaled them).
void equalizeJunction(Junction& junction, std::vector<std::vector<double>> producerWeights) {
  std::size_t first = 0;
  for (std::size_t p = 0; p < junction.producers.size(); ++p) {
    const AffineLayer& layer = junction.producers[p].layer;
    junction.producerWeights.push_back({{layer.layout, std::move(producerWeights[p]), layer.weight->dims()}, first});
    if (junction.adds.empty()) first += static_cast<std::size_t>(layer.outputChannels);  // a residual stream sums
  }
  for (const JunctionReaderLayer& reader : junction.readers)
    junction.readerWeights.push_back(
        {{reader.layer.layout, reader.layer.weight->toDoubles(), reader.layer.weight->dims()}, reader.block});
  junction.scales = kernels::equalizeJunction(junction.producerWeights, junction.readerWeights, junction.channels);
  junction.trivial = largestLogScale(junction.scales.scales) < kTrivialLogScale;
  junction.changed = junction.scales.improves && !junction.trivial;
  if (!junction.changed) return;
  for (const auto& producer : junction.producerWeights)
    junction.producersAfter.push_back(kernels::scaledProducerWeights(producer, junction.scales.scales));
  for (const auto& reader : junction.readerWeights)
    junction.readersAfter.push_back(kernels::scaledReaderWeights(reader, junction.scales.scales));
}

nlohmann::json jsonNumbers(const std::vector<double>& values) {
  nlohmann::json out = nlohmann::json::array();
  for (double v : values) out.push_back(v);
  return out;
}

std::vector<double> inverseOf(const std::vector<double>& scales) {
  std::vector<double> inverse(scales.size());
  for (std::size_t i = 0; i < inverse.size(); ++i) inverse[i] = 1.0 / scales[i];
  return inverse;
}

// Writes the readers' new weights (and the producers', unless a chain writes them), and says what was done.
// Divides `layer`'s output channel i by scales[i] where it lives besides the weight: the bias (the weight is written
// by the caller), and the pre-activation statistics high-bias absorption reads.
void divideOutputChannels(Rewriter& rewriter, const AffineLayer& layer, const std::vector<double>& scales) {
  if (layer.biasSlot >= 0) {
    const std::vector<double> inverse = inverseOf(scales);
    if (auto bias = foldedBias(layer, {inverse, std::vector<double>(inverse.size(), 0.0)}))
      writeBias(rewriter, layer, *bias);
  }
  rewriter.statistics().divideChannels(*layer.node, scales);
}

// `layer`'s weight with its channels on one side multiplied by `factor`, computed when its bytes are read.
Value* addScaledWeight(Rewriter& rewriter, const AffineLayer& layer, bool outputSide,
                       const std::vector<double>& factor) {
  const auto dims = layer.weight->dims();
  // readAffineLayer checked that the dims fit the layout.
  const auto indexing = outputSide ? *kernels::outputChannelIndexing(layer.layout, dims)
                                   : *kernels::inputChannelIndexing(layer.layout, dims);
  return rewriter.addInitializer(
      *layer.node->graph(),
      Tensor::deferred("", layer.type(), dims,
                       scaledChannelBytes(layer.weight->byteSource(), layer.type(), indexing, factor)),
      scaledWeightNameHint(layer, "_equalized"));
}

void rewriteJunction(const Junction& junction, bool writeProducers, Rewriter& rewriter) {
  const auto& s = junction.scales.scales;
  // A residual stream's weights are written as they are read (equalizeResidual holds none of them whole).
  const bool deferred = !junction.adds.empty();
  if (writeProducers)
    for (std::size_t p = 0; p < junction.producers.size(); ++p) {
      const AffineLayer& layer = junction.producers[p].layer;
      Value* weight = deferred ? addScaledWeight(rewriter, layer, true, inverseOf(s))
                               : addTensor(rewriter, *layer.node, layer.type(), layer.weight->dims(),
                                           junction.producersAfter[p], scaledWeightNameHint(layer, "_equalized"));
      rewriter.setInput(layer.node, 1, weight);
      const auto first = s.begin() + static_cast<std::ptrdiff_t>(deferred ? 0 : junction.producerWeights[p].first);
      divideOutputChannels(rewriter, layer, std::vector<double>(first, first + layer.outputChannels));
    }
  for (std::size_t r = 0; r < junction.readers.size(); ++r) {
    const AffineLayer& layer = junction.readers[r].layer;
    Value* weight = deferred
                        ? addScaledWeight(rewriter, layer, false, kernels::blockExpanded(s, junction.readers[r].block))
                        : addTensor(rewriter, *layer.node, layer.type(), layer.weight->dims(), junction.readersAfter[r],
                                    scaledWeightNameHint(layer, "_equalized"));
    rewriter.setInput(layer.node, 1, weight);
    rewriter.statistics().outputUnchanged(*layer.node);
    if (junction.readers[r].pool) rewriter.includeUnchanged(junction.readers[r].pool);
    if (junction.readers[r].flatten) rewriter.includeUnchanged(junction.readers[r].flatten);
  }
  for (const auto& producer : junction.producers) {
    if (producer.activation) rewriter.includeUnchanged(producer.activation);
    for (const Node* pool : producer.pools) rewriter.includeUnchanged(pool);
  }
  if (junction.concat) rewriter.includeUnchanged(junction.concat);
  for (const Node* node : junction.adds) rewriter.includeUnchanged(node);
  for (const Node* node : junction.through) {
    rewriter.includeUnchanged(node);
    rewriter.statistics().outputUnchanged(*node);
  }

  nlohmann::json producers = nlohmann::json::array(), readers = nlohmann::json::array();
  for (const auto& producer : junction.producers) {
    producers.push_back({{"layer", producer.layer.node->name()},
                         {"activation", producer.activation ? nlohmann::json(producer.activation->opType())
                                                            : nlohmann::json(nullptr)},
                         {"channels", producer.layer.outputChannels}});
    if (!producer.pools.empty()) producers.back()["pools"] = poolNames(producer.pools);
  }
  for (const auto& reader : junction.readers) {
    nlohmann::json throughOps = nlohmann::json::array();
    for (const Node* node : {reader.pool, reader.flatten})
      if (node) throughOps.push_back({{"node", node->name()}, {"op", node->opType()}});
    readers.push_back({{"layer", reader.layer.node->name()},
                       {"through", reader.flatten ? nlohmann::json(reader.flatten->name()) : nlohmann::json(nullptr)},
                       {"through_ops", throughOps},
                       {"features_per_channel", reader.block}});
  }
  const auto& numbers = junction.scales;
  const double before = numbers.producerErrorBefore + numbers.readerErrorBefore;
  const AffineLayer& first = junction.producers.front().layer;
  nlohmann::json adds = nlohmann::json::array();
  for (const Node* add : junction.adds) adds.push_back(add->name());
  nlohmann::json entry = {
      {"node", first.node->name()},
      {"op", first.node->opType()},
      {"layer1", first.node->name()},
      {"layer2", junction.readers.front().layer.node->name()},
      {"activation", producers[0]["activation"]},
      {"link", junction.kind},
      {"producers", producers},
      {"readers", readers},
      {"scales", jsonNumbers(s)},
      {"ranges_before",
       {{"layer1_output", jsonNumbers(numbers.producerRanges)}, {"layer2_input", jsonNumbers(numbers.readerRanges)}}},
      {"ranges_after",
       {{"layer1_output", jsonNumbers(numbers.producerRangesAfter)},
        {"layer2_input", jsonNumbers(numbers.readerRangesAfter)}}},
      {"quant_error_before",
       {{"layer1", numbers.producerErrorBefore}, {"layer2", numbers.readerErrorBefore}, {"sum", before}}},
      {"quant_error_after",
       {{"layer1", numbers.producerErrorAfter},
        {"layer2", numbers.readerErrorAfter},
        {"sum", numbers.producerErrorAfter + numbers.readerErrorAfter}}},
      {"quant_error_without_link", before},
      {"chain_layers", junction.producers.size() + junction.readers.size()},
      {"sweeps", 1},
      {"converged", true}};
  if (!junction.adds.empty()) {
    entry["residual_adds"] = adds;
    entry["scale_power"] = numbers.power;
  }
  rewriter.record("equalized", std::move(entry));
}

struct EqualizeMatch : Match {
  std::vector<AffineLayer> layers;
  std::vector<const Node*> activations;         // per link
  std::vector<std::vector<const Node*>> pools;  // per link: the pools it passes
  std::vector<kernels::ChainLayer> weights;
  std::unique_ptr<kernels::ChainNoise> noise;  // of `weights`
  kernels::ChainScales scales;
  std::vector<bool> changed;       // per link: kept and not trivial
  std::optional<LinkProblem> end;  // why the chain stops after its last layer
  std::optional<Junction> after;   // a fan-out or Flatten after the last layer
  std::optional<Junction> concat;  // a match rooted at a Concat (or an Add: its residual stream): this junction alone
  // The chain's output-referred int8 noise per layer (kernels::estimatedChainInt8Noise), as given and as written,
  // and per changed link its two layers' noise with every other link as written but this one left alone: what the
  // link had to beat. Empty for a match that is only a junction after one layer.
  std::vector<double> noiseBefore, noiseAfter, noiseWithoutLink;
};

// The chain's scales as written: 1 on every link left alone.
std::vector<std::vector<double>> appliedScales(const EqualizeMatch& match) {
  std::vector<std::vector<double>> applied = match.scales.scales;
  for (std::size_t k = 0; k < applied.size(); ++k)
    if (!match.changed[k]) std::fill(applied[k].begin(), applied[k].end(), 1.0);
  return applied;
}

std::vector<std::vector<double>> identityScales(const std::vector<std::vector<double>>& scales) {
  std::vector<std::vector<double>> identity;
  for (const auto& scale : scales) identity.emplace_back(scale.size(), 1.0);
  return identity;
}

// Layer k of the chain as written, computed when its bytes are read (as kernels::equalizedWeights computes it):
// output channels divided by the link after it, input channels multiplied by the link before.
std::shared_ptr<const DeferredBytes> equalizedBytes(const AffineLayer& layer,
                                                    const std::vector<std::vector<double>>& applied, std::size_t k) {
  const auto dims = layer.weight->dims();
  // readAffineLayer checked that the dims fit the layout.
  const auto outputIndexing = *kernels::outputChannelIndexing(layer.layout, dims);
  const auto inputIndexing = *kernels::inputChannelIndexing(layer.layout, dims);
  const bool last = k == applied.size();
  if (k == 0)
    return scaledChannelBytes(layer.weight->byteSource(), layer.type(), outputIndexing, inverseOf(applied[k]));
  if (last) return scaledChannelBytes(layer.weight->byteSource(), layer.type(), inputIndexing, applied[k - 1]);
  return scaledBothSidesBytes(layer.weight->byteSource(), layer.type(), outputIndexing, inverseOf(applied[k]),
                              inputIndexing, applied[k - 1]);
}

// A residual stream: values that Adds join, with the Relus, LeakyRelus and pools on them (each passes a positive
// scale of its channels), written by layers (each output channel divided by s_i) and read by layers (each input
// channel multiplied by s_i); the Adds then sum scaled values and the function is unchanged. One scale per channel
// for the whole stream: every Add of it, the identity shortcuts included. (A pool with ceil_mode is left to read
// the stream, as --verify does not evaluate it.)
bool isStreamOp(const Node& node) {
  return node.isOnnxOp("Add") || node.isOnnxOp("Relu") || node.isOnnxOp("LeakyRelu") ||
         (isWindowPool(node) && node.attributeInt("ceil_mode", 0) == 0);
}

struct ResidualStream {
  std::vector<const Node*> adds, ops;               // its Adds, and its activations and pools
  std::vector<const Node*> producers;               // the layers that write it
  std::vector<std::pair<const Value*, Use>> reads;  // uses of its values by nodes that are not stream ops
  const Value* graphOutput = nullptr;               // a value of it that is a graph output
};

// Whether an Add feeds `add` through at most Relus and LeakyRelus: `add` is then not where its stream starts.
bool followsAnotherAdd(const Node& add) {
  for (const Value* input : add.inputs()) {
    const Node* producer = input ? input->producer() : nullptr;
    while (producer && (producer->isOnnxOp("Relu") || producer->isOnnxOp("LeakyRelu")) && producer->input(0))
      producer = producer->input(0)->producer();
    if (producer && producer->isOnnxOp("Add")) return true;
  }
  return false;
}

// The stream `add` belongs to, or why it is no residual stream of layers.
std::variant<ResidualStream, LinkProblem> residualStream(const Node& add, const RuleContext& context) {
  ResidualStream stream;
  std::unordered_set<const Node*> seenNodes{&add};
  std::unordered_set<const Value*> seenValues;
  std::vector<const Node*> pending{&add};
  std::vector<const Value*> values;
  std::optional<LinkProblem> problem;
  auto visitValue = [&](const Value* value, const Node& from) {
    if (problem) return;
    if (!value) {
      problem = LinkProblem{failure(reason::kMissingInput, "'" + from.name() + "' has an omitted input or output")};
      return;
    }
    if (seenValues.insert(value).second) values.push_back(value);
  };
  while (!pending.empty() || !values.empty()) {
    if (!pending.empty()) {
      const Node* node = pending.back();
      pending.pop_back();
      if (node->graph() != add.graph())
        return LinkProblem{failure(reason::kLayerInOtherGraph, "'" + node->name() + "' reads the residual stream of '" +
                                                                   add.name() + "' from another graph")};
      if (context.isKept(*node))
        return LinkProblem{failure(reason::kKeptByUser, "'" + node->name() + "' is kept by --keep or --keep-op")};
      const bool isAdd = node->isOnnxOp("Add");
      if (isAdd && node->inputs().size() != 2)
        return LinkProblem{failure(reason::kMissingInput, "'" + node->name() + "' does not have two inputs")};
      if (node->outputs().size() != 1)
        return LinkProblem{failure(reason::kReaderNotLayer,
                                   "'" + node->name() + "' (" + node->opType() + ") has more than one output")};
      (isAdd ? stream.adds : stream.ops).push_back(node);
      for (std::size_t i = 0; i < (isAdd ? 2 : 1); ++i)
        visitValue(node->inputs().size() > i ? node->input(i) : nullptr, *node);
      visitValue(node->output(0), *node);
      if (problem) return *problem;
      continue;
    }
    const Value* value = values.back();
    values.pop_back();
    if (value->isGraphOutput() && !stream.graphOutput) stream.graphOutput = value;
    const Node* producer = value->producer();
    if (producer && isStreamOp(*producer)) {
      if (seenNodes.insert(producer).second) pending.push_back(producer);
    } else if (producer && isAffineLayerOp(*producer) && producer->output(0) == value) {
      if (seenNodes.insert(producer).second) stream.producers.push_back(producer);
    } else {
      return LinkProblem{failure(reason::kNoFoldableProducer,
                                 "'" + value->name() + "' of the residual stream of '" + add.name() + "' " +
                                     (producer ? "comes from '" + producer->name() + "' (" + producer->opType() +
                                                     "), not from a layer, Add, Relu, LeakyRelu, MaxPool or AveragePool"
                                               : std::string("is a graph input or a constant")))};
    }
    for (const Use& use : value->uses()) {
      if (isStreamOp(*use.node)) {
        if (seenNodes.insert(use.node).second) pending.push_back(use.node);
      } else {
        stream.reads.emplace_back(value, use);
      }
    }
  }
  return stream;
}

// Why a stream value's reader does not take the stream's scales.
LinkProblem streamReaderProblem(const Value& value, const Node& reader, const Node& add) {
  if (isNonHomogeneousActivation(reader))
    return LinkProblem{failure(reason::kNonHomogeneousActivation,
                               "'" + reader.name() + "' (" + reader.opType() + ") reads '" + value.name() +
                                   "' of the residual stream of '" + add.name() +
                                   "' and is not positively homogeneous: a channel scale does not pass through it")};
  return LinkProblem{
      failure(reason::kReaderNotLayer, "'" + value.name() + "' of the residual stream of '" + add.name() +
                                           "' is read by '" + reader.name() + "' (" + reader.opType() +
                                           "), not as the data input of a Conv, ConvTranspose, Gemm or MatMul")};
}

// The nodes on a path from a reader's output to a producer's data input: unchanged, but inside what the rewrite
// must be checked on (a bottleneck's middle layers, the activations between).
std::vector<const Node*> nodesBetween(const Junction& junction, const ResidualStream& stream) {
  std::unordered_set<const Node*> stop(stream.adds.begin(), stream.adds.end());
  stop.insert(stream.ops.begin(), stream.ops.end());
  for (const auto& producer : junction.producers) stop.insert(producer.layer.node);
  for (const auto& reader : junction.readers)
    for (const Node* node : {reader.layer.node, reader.pool, reader.flatten})
      if (node) stop.insert(node);
  // Nodes are in topological order: none after the last producer leads to one.
  std::uint32_t lastProducer = 0;
  for (const auto& producer : junction.producers) lastProducer = std::max(lastProducer, producer.layer.node->order());
  std::unordered_set<const Node*> downstream;
  std::vector<const Node*> work;
  for (const auto& reader : junction.readers) work.push_back(reader.layer.node);
  while (!work.empty()) {
    const Node* node = work.back();
    work.pop_back();
    for (const Value* output : node->outputs())
      if (output)
        for (const Use& use : output->uses())
          if (use.node->order() < lastProducer && !stop.count(use.node) && downstream.insert(use.node).second)
            work.push_back(use.node);
  }
  std::vector<const Node*> between;
  std::unordered_set<const Node*> seen;
  for (const auto& producer : junction.producers) work.push_back(producer.layer.node);
  while (!work.empty()) {
    const Node* node = work.back();
    work.pop_back();
    for (const Value* input : node->inputs()) {
      const Node* before = input ? input->producer() : nullptr;
      if (before && downstream.count(before) && seen.insert(before).second) {
        between.push_back(before);
        work.push_back(before);
      }
    }
  }
  return between;
}

// A residual stream's scales, from its layers' weights read a piece at a time.
void equalizeResidual(Junction& junction, bool concurrent) {
  std::vector<kernels::ChainLayer> producers;
  for (const auto& producer : junction.producers) {
    const AffineLayer& layer = producer.layer;
    producers.push_back({layer.layout, {}, layer.weight->dims(), weightReader(*layer.weight)});
  }
  std::vector<kernels::JunctionReader> readers;
  for (const JunctionReaderLayer& reader : junction.readers) {
    const AffineLayer& layer = reader.layer;
    readers.push_back({{layer.layout, {}, layer.weight->dims(), weightReader(*layer.weight)}, reader.block});
  }
  junction.scales = kernels::equalizeSummedJunction(producers, readers, junction.channels, concurrent);
  junction.trivial = largestLogScale(junction.scales.scales) < kTrivialLogScale;
  junction.changed = junction.scales.improves && !junction.trivial;
}

// The residual stream `add` belongs to as a junction: its producers all write all its channels.
std::variant<Junction, LinkProblem> residualJunction(const Node& add, const ResidualStream& stream,
                                                     const RuleContext& context) {
  if (stream.graphOutput)
    return LinkProblem{failure(
        reason::kLayerHasOtherConsumers,
        "'" + stream.graphOutput->name() + "' of the residual stream of '" + add.name() + "' is a graph output")};
  Junction junction;
  junction.kind = "residual";
  junction.adds = stream.adds;
  for (const Node* node : stream.producers) {
    auto read = layerOrProblem(*node, context);
    if (auto* problem = std::get_if<LinkProblem>(&read)) return std::move(*problem);
    AffineLayer* layer = &std::get<AffineLayer>(read);
    const AffineLayer* first = junction.producers.empty() ? nullptr : &junction.producers.front().layer;
    if (!layer->isSpatial() || (first && (layer->outputChannels != first->outputChannels ||
                                          layer->weight->dims().size() != first->weight->dims().size())))
      return LinkProblem{failure(reason::kChannelAxisMismatch,
                                 "the layers that write the residual stream of '" + add.name() +
                                     "' are not all Conv or ConvTranspose of the same rank and channels")};
    junction.producers.push_back({std::move(*layer), nullptr, {}});
  }
  const AffineLayer& first = junction.producers.front().layer;
  junction.channels = static_cast<std::size_t>(first.outputChannels);
  const bool streamPools =
      std::any_of(stream.ops.begin(), stream.ops.end(), [](const Node* node) { return isWindowPool(*node); });
  for (const auto& [value, use] : stream.reads) {
    if (std::find(stream.producers.begin(), stream.producers.end(), use.node) != stream.producers.end())
      return LinkProblem{
          failure(reason::kReaderNotLayer,
                  "'" + use.node->name() + "' both reads and writes the residual stream of '" + add.name() + "'")};
    ReaderThrough through = readerThrough(use, first, *value, !streamPools, add.name(), context);
    if (through.problem) return std::move(*through.problem);
    if (through.notReached) return streamReaderProblem(*value, *use.node, add);
    junction.readers.push_back(std::move(*through.reader));
  }
  if (junction.readers.empty())
    return LinkProblem{failure(reason::kReaderNotLayer, "no layer reads the residual stream of '" + add.name() + "'")};
  if (auto problem = junctionWeightsProblem(junction, context)) return *problem;
  junction.through = stream.ops;
  for (const Node* node : nodesBetween(junction, stream)) junction.through.push_back(node);
  return junction;
}

class EqualizeLayers final : public Rule {
 public:
  const char* name() const override { return "equalize"; }
  const char* summary() const override {
    return "Cross-layer equalization: rescale the channels between two layers joined by Relu/LeakyRelu/PRelu "
           "(or nothing), a layer and the layers it fans out to, layers a channel-axis Concat joins, Conv -> "
           "Flatten -> Gemm, Conv -> GlobalAveragePool/GlobalMaxPool/ReduceMean -> Gemm, or the layers that write and "
           "read a "
           "residual stream, so their per-tensor int8 weights lose less (off by default; fold --equalize)";
  }
  std::vector<std::string> rootOps() const override {
    return {"Conv", "ConvTranspose", "Gemm", "MatMul", "Concat", "Add"};
  }
  std::vector<OpVersions> opVersions() const override {
    return joinOps(layerOps(), {kRelu, kLeakyRelu, kPRelu, kConcat, kFlatten, kReshape, kGlobalAveragePool, kReduceMean,
                                kAdd, kMaxPool, kAveragePool, kGlobalMaxPool});
  }
  bool enabledByDefault() const override { return false; }
  bool runsAfterFixedPoint() const override { return true; }
  const char* failureSection() const override { return "not_equalized"; }

  MatchResult match(const Node& root, const RuleContext& context) const override {
    if (root.isOnnxOp("Concat")) return matchConcat(root, context);
    if (root.isOnnxOp("Add")) return matchResidual(root, context);
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
      match->pools.push_back(std::move(found.pools));
      match->layers.push_back(std::move(found.next));
    }
    if (auto junction = junctionAfter(match->layers.back(), context)) {
      if (auto* problem = std::get_if<LinkProblem>(&*junction)) {
        match->end = std::move(*problem);
      } else {
        match->after = std::move(std::get<Junction>(*junction));
        match->end.reset();
      }
    }
    if (match->layers.size() == 1 && !match->after)
      return match->end->quiet ? MatchResult::quietFailure(match->end->failure.code, match->end->failure.message)
                               : MatchResult::failure(match->end->failure.code, match->end->failure.message);

    const std::size_t links = match->activations.size();
    std::string refused;
    std::unique_ptr<kernels::ChainNoise>& noise = match->noise;
    if (links > 0) {
      for (const AffineLayer& layer : match->layers)
        match->weights.push_back({layer.layout, {}, layer.weight->dims(), weightReader(*layer.weight)});
      const bool concurrent = context.options().concurrent;
      noise = std::make_unique<kernels::ChainNoise>(match->weights, kernels::NoiseMeasure::Estimated, concurrent);
      kernels::EqualizeSettings settings;
      settings.concurrent = concurrent;
      match->scales = kernels::equalizeChain(*noise, std::vector<bool>(links, true), settings);
      match->changed.assign(links, false);
      for (std::size_t k = 0; k < links; ++k) {
        const bool trivial = largestLogScale(match->scales.proposed[k]) < kTrivialLogScale;
        match->changed[k] = match->scales.kept[k] && largestLogScale(match->scales.scales[k]) >= kTrivialLogScale;
        if (!match->scales.kept[k] && !trivial)
          refused += (refused.empty() ? "" : ", ") + std::string("'") + match->layers[k].node->name() + "' -> '" +
                     match->layers[k + 1].node->name() + "'";
      }
    }
    if (match->after) {
      // The junction takes the last layer as the chain leaves it.
      const AffineLayer& last = match->layers.back();
      equalizeJunction(*match->after,
                       {links > 0 ? kernels::equalizedWeights(match->weights, appliedScales(*match), links)
                                  : last.weight->toDoubles()});
      if (!match->after->changed && !match->after->trivial)
        refused += (refused.empty() ? "" : ", ") + std::string("'") + last.node->name() + "' -> its " +
                   match->after->kind + " readers";
    }
    const bool junctionChanged = match->after && match->after->changed;
    if (!junctionChanged && std::find(match->changed.begin(), match->changed.end(), true) == match->changed.end()) {
      if (!refused.empty())
        return MatchResult::failure(reason::kNotImproving, "equalizing " + refused +
                                                               " would not lower the chain's "
                                                               "int8 weight noise enough");
      return MatchResult::quietFailure(reason::kNotImproving,
                                       "the chain from '" + root.name() + "' is equalized already");
    }
    if (noise) {
      // The report's numbers, mostly remembered by `noise` from choosing the scales.
      const std::vector<std::vector<double>> applied = appliedScales(*match);
      match->noiseBefore = noise->perLayer(identityScales(applied));
      match->noiseAfter = noise->perLayer(applied);
      match->noiseWithoutLink.assign(links, 0.0);
      for (std::size_t k = 0; k < links; ++k) {
        if (!match->changed[k]) continue;
        std::vector<std::vector<double>> withoutLink = applied;
        std::fill(withoutLink[k].begin(), withoutLink[k].end(), 1.0);
        match->noiseWithoutLink[k] = noise->layer(k, withoutLink) + noise->layer(k + 1, withoutLink);
      }
    }
    return MatchResult::success(std::move(match));
  }

  void rewrite(Match& base, Rewriter& rewriter) const override {
    auto& match = static_cast<EqualizeMatch&>(base);
    if (match.concat) {
      rewriteJunction(*match.concat, true, rewriter);
      return;
    }
    const std::size_t links = match.activations.size();
    const std::vector<std::vector<double>> applied = appliedScales(match);
    const bool junctionChanged = match.after && match.after->changed;
    for (std::size_t k = 0; k < match.layers.size(); ++k) {
      const bool scalesOutput = k < links && match.changed[k];
      const bool scalesInput = k > 0 && match.changed[k - 1];
      // The last layer's output channels take the junction's scales on top of the chain's.
      const bool junctionOutput = k == links && junctionChanged;
      if (!scalesOutput && !scalesInput && !junctionOutput) continue;
      const AffineLayer& layer = match.layers[k];
      Value* weight = junctionOutput ? addTensor(rewriter, *layer.node, layer.type(), layer.weight->dims(),
                                                 match.after->producersAfter.front(),
                                                 scaledWeightNameHint(layer, "_equalized"))
                                     : rewriter.addInitializer(*layer.node->graph(),
                                                               Tensor::deferred("", layer.type(), layer.weight->dims(),
                                                                                equalizedBytes(layer, applied, k)),
                                                               scaledWeightNameHint(layer, "_equalized"));
      rewriter.setInput(layer.node, 1, weight);
      if (scalesOutput || junctionOutput)
        divideOutputChannels(rewriter, layer, junctionOutput ? match.after->scales.scales : applied[k]);
      else
        rewriter.statistics().outputUnchanged(*layer.node);
    }
    // The activations are unchanged, but the layers around them are exact only together with them.
    for (const Node* activation : match.activations)
      if (activation) rewriter.includeUnchanged(activation);
    for (const auto& pools : match.pools)
      for (const Node* pool : pools) rewriter.includeUnchanged(pool);

    const auto& noiseBefore = match.noiseBefore;
    const auto& noiseAfter = match.noiseAfter;

    for (std::size_t k = 0; k < links; ++k) {
      const AffineLayer& first = match.layers[k];
      const AffineLayer& second = match.layers[k + 1];
      if (!match.changed[k]) {
        if (largestLogScale(match.scales.proposed[k]) < kTrivialLogScale) continue;
        rewriter.record("not_equalized", {{"node", first.node->name()},
                                          {"op", first.node->opType()},
                                          {"next", second.node->name()},
                                          {"reason", reason::kNotImproving.str()},
                                          {"message",
                                           "no power of the scales would lower the chain's output-referred int8 "
                                           "weight noise enough"},
                                          {"scales", jsonNumbers(match.scales.proposed[k])}});
        continue;
      }
      const kernels::ChainNoise& noise = *match.noise;
      const std::vector<std::vector<double>> identity = identityScales(applied);
      const nlohmann::json activation =
          match.activations[k] ? nlohmann::json(match.activations[k]->opType()) : nlohmann::json(nullptr);
      nlohmann::json entry = {
          {"node", first.node->name()},
          {"op", first.node->opType()},
          {"layer1", first.node->name()},
          {"layer2", second.node->name()},
          {"activation", activation},
          {"scales", jsonNumbers(applied[k])},
          {"ranges_before",
           {{"layer1_output", jsonNumbers(noise.outputRanges(k, identity))},
            {"layer2_input", jsonNumbers(noise.inputRanges(k + 1, identity))}}},
          {"ranges_after",
           {{"layer1_output", jsonNumbers(noise.outputRanges(k, applied))},
            {"layer2_input", jsonNumbers(noise.inputRanges(k + 1, applied))}}},
          {"scale_method", match.scales.method == kernels::ScaleMethod::Sweep ? "sweep" : "aimet-one-pass"},
          {"scale_power", match.scales.power[k]},
          {"quant_error_before",
           {{"layer1", noiseBefore[k]}, {"layer2", noiseBefore[k + 1]}, {"sum", noiseBefore[k] + noiseBefore[k + 1]}}},
          {"quant_error_after",
           {{"layer1", noiseAfter[k]}, {"layer2", noiseAfter[k + 1]}, {"sum", noiseAfter[k] + noiseAfter[k + 1]}}},
          {"quant_error_without_link", match.noiseWithoutLink[k]},
          {"chain_layers", match.layers.size()},
          {"sweeps", match.scales.sweeps},
          {"converged", match.scales.converged}};
      if (!match.pools[k].empty()) entry["pools"] = poolNames(match.pools[k]);
      rewriter.record("equalized", std::move(entry));
    }
    if (junctionChanged) rewriteJunction(*match.after, false, rewriter);
    if (match.after && !match.after->changed && !match.after->trivial)
      rewriter.record("not_equalized", {{"node", match.layers.back().node->name()},
                                        {"op", match.layers.back().node->opType()},
                                        {"next", match.after->readers.front().layer.node->name()},
                                        {"reason", reason::kNotImproving.str()},
                                        {"message", std::string("the scales of the ") + match.after->kind +
                                                        " would not lower the per-tensor int8 weight error"},
                                        {"scales", jsonNumbers(match.after->scales.scales)}});
    if (match.end && !match.end->quiet)
      rewriter.record("not_equalized", {{"node", match.layers.back().node->name()},
                                        {"op", match.layers.back().node->opType()},
                                        {"reason", match.end->failure.code.str()},
                                        {"message", match.end->failure.message}});
  }

 private:
  static MatchResult matchResidual(const Node& add, const RuleContext& context) {
    // Add-1 and Add-6 broadcast by attributes; a stream's values all have a layer's shape, but these are not read.
    if (context.opset() < kNumpyBroadcastOpset)
      return MatchResult::quietFailure(reason::kUnsupportedOpset, "residual streams are equalized from opset 7");
    // One match per stream, at its first Add: an Add after another is passed by without walking its stream (a
    // stream of n blocks would be walked n times).
    if (followsAnotherAdd(add))
      return MatchResult::quietFailure(
          reason::kNotImproving, "'" + add.name() + "' is equalized with the residual stream of an Add before it");
    auto found = residualStream(add, context);
    if (auto* problem = std::get_if<LinkProblem>(&found)) {
      // Most Adds that are no stream of layers (a constant bias, a graph input) say so quietly; a node the user
      // keeps, or a stream that leaves the graph, is a stream left whole worth its entry.
      const bool worthAnEntry =
          problem->failure.code == reason::kKeptByUser || problem->failure.code == reason::kLayerInOtherGraph;
      return worthAnEntry ? MatchResult::failure(problem->failure.code, problem->failure.message)
                          : MatchResult::quietFailure(problem->failure.code, problem->failure.message);
    }
    const ResidualStream& stream = std::get<ResidualStream>(found);
    // Two Adds can each start a branch of one stream: the first in node order matches it.
    const Node* firstAdd = *std::min_element(stream.adds.begin(), stream.adds.end(),
                                             [](const Node* a, const Node* b) { return a->order() < b->order(); });
    if (firstAdd != &add)
      return MatchResult::quietFailure(
          reason::kNotImproving,
          "'" + add.name() + "' is equalized with the residual stream of '" + firstAdd->name() + "'");
    if (stream.producers.empty())
      return MatchResult::quietFailure(reason::kNoFoldableProducer,
                                       "no layer writes the residual stream of '" + add.name() + "'");
    auto junction = residualJunction(add, stream, context);
    if (auto* problem = std::get_if<LinkProblem>(&junction))
      return MatchResult::failure(problem->failure.code, problem->failure.message);
    auto match = std::make_unique<EqualizeMatch>();
    match->concat = std::move(std::get<Junction>(junction));
    Junction& residual = *match->concat;
    equalizeResidual(residual, context.options().concurrent);
    if (residual.trivial)
      return MatchResult::quietFailure(reason::kNotImproving,
                                       "the residual stream of '" + add.name() + "' is equalized already");
    if (!residual.changed)
      return MatchResult::failure(reason::kNotImproving, "equalizing the residual stream of '" + add.name() +
                                                             "' would not lower the per-tensor int8 weight error");
    return MatchResult::success(std::move(match));
  }

  static MatchResult matchConcat(const Node& concat, const RuleContext& context) {
    if (!std::any_of(concat.inputs().begin(), concat.inputs().end(), fromLayer))
      return MatchResult::quietFailure(reason::kNoFoldableProducer, "no input of '" + concat.name() +
                                                                        "' comes from a layer");
    auto junction = concatJunction(concat, context);
    if (auto* problem = std::get_if<LinkProblem>(&junction))
      return MatchResult::failure(problem->failure.code, problem->failure.message);
    auto match = std::make_unique<EqualizeMatch>();
    match->concat = std::move(std::get<Junction>(junction));
    Junction& found = *match->concat;
    std::vector<std::vector<double>> producerWeights;
    for (const auto& producer : found.producers) producerWeights.push_back(producer.layer.weight->toDoubles());
    equalizeJunction(found, std::move(producerWeights));
    if (found.trivial)
      return MatchResult::quietFailure(reason::kNotImproving, "the layers '" + concat.name() +
                                                                  "' joins are equalized already");
    if (!found.changed)
      return MatchResult::failure(reason::kNotImproving, "equalizing the layers '" + concat.name() + "' joins with '" +
                                                             found.readers.front().layer.node->name() +
                                                             "' would not lower the per-tensor int8 weight error");
    return MatchResult::success(std::move(match));
  }
};

}  // namespace

std::unique_ptr<Rule> makeEqualizeLayers() { return std::make_unique<EqualizeLayers>(); }

}  // namespace bnfold::rules
