// Before:     m = ReduceMean(X, axes);  d = Sub(X, m);  q = Pow(d, 2) | Mul(d, d);  v = ReduceMean(q, axes)
//             n = Div(d, Sqrt(Add(v, eps)))  |  Mul(d, Reciprocal(Sqrt(Add(v, eps))))  |  Mul(d, Div(1, Sqrt(...)))
//             Y = Add(Mul(n, gamma), beta)           (LayerNorm, PyTorch form; gamma and beta each optional)
//             the same without m and d (q squares X itself), Y = Mul(n, gamma)                       (RMSNorm)
//             optionally X = Cast(X16, to=float) before and n16 = Cast(n, to=X16's type) after (fp16 models)
//             Keras (tf2onnx): s = Mul(Reciprocal(Sqrt(Add(v, eps))), gamma);  Y = Add(Mul(X, s), Sub(beta, Mul(m, s)))
//             (no gamma: s = Reciprocal(...); no beta: Y = Add(Mul(X, s), Neg(Mul(m, s))) or Sub(Mul(X, s), Mul(m, s)))
//             Flax: v = Sub(ReduceMean(X^2), m^2), possibly Max(v, 0); n = (X - m) / Sqrt(v + eps) as above
//             every mean as ReduceMean(keepdims=1), ReduceSum(keepdims=1) times 1/n or divided by n, or
//             Reshape(GlobalAveragePool(Reshape(v, [P, Q, R...])), v's shape with the averaged dims 1)
//             GroupNorm: Y = Add(Mul(Reshape(InstanceNormalization(Reshape(X, [N, G, -1]), 1, 0), X's shape), gamma), beta)
//             or the same with a LayerNorm chain over the last axis (not Keras) for the InstanceNormalization
// After:      Y = LayerNormalization(X, gamma', beta', axis=-k, epsilon, stash_type=1)   (opset >= 17)
//             Y = RMSNormalization(X, gamma', axis=-k, epsilon, stash_type=1)            (opset >= 23)
//             Y = GroupNormalization(X, gamma', beta', num_groups=G, epsilon, stash_type=1) (opset >= 21)
// Conditions: both means reduce the same axes with keepdims=1 (a sum's n the count of elements summed; a pooled
//             view's R... exactly the trailing axes), and those are X's k trailing axes (X's rank and
//             the normalized dims known); the exponent is exactly 2; eps a constant scalar; gamma and beta
//             constants that broadcast only along the normalized axes (dims 1 or the normalized dim, no rank
//             beyond X's); every intermediate value read only inside the chain and not a graph output; X float,
//             or float16/bfloat16 with the statistics computed in float between the two Casts (stash_type
//             float); gamma and beta of X's type; the opset has the op. A Mul or Add after n whose other operand
//             is not constant (a gate, a residual) ends the chain before it: the fused op leaves it in place.
//             GroupNorm: X's shape known, the groups whole channels, the InstanceNormalization's scale all 1 and
//             bias all 0, the second Reshape back to X's shape, gamma and beta one value per channel (or one).
//             Its LayerNorm form where these fail (or below opset 21) is fused as the LayerNorm of the grouped view.
// Math:       LayerNormalization computes (X - E[X]) / sqrt(Var[X] + eps) * gamma' + beta' over axes -k..-1,
//             RMSNormalization X / sqrt(E[X^2] + eps) * gamma': the chain's own formula. gamma' and beta' are
//             gamma and beta broadcast to the normalized dims (gamma' = 1 when the chain has no gamma).

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>

#include "affine_layer.h"
#include "analysis/op_forms.h"
#include "analysis/value_shape.h"
#include "bnfold/dims_text.h"
#include "bnfold/rewrite/rewriter.h"
#include "opset_emit.h"
#include "rewrite/understood_ops.h"
#include "rules.h"

namespace bnfold::rules {
namespace {

/// The first opsets with each fused op.
constexpr int64_t kLayerNormalizationOpset = 17;
constexpr int64_t kRmsNormalizationOpset = 23;
constexpr int64_t kGroupNormalizationOpset = 21;  // the per-channel form (GroupNormalization-18 is per group)

enum class NormKind { Layer, RootMeanSquare, Group };

const char* opOf(NormKind kind) {
  switch (kind) {
    case NormKind::Layer: return "LayerNormalization";
    case NormKind::RootMeanSquare: return "RMSNormalization";
    case NormKind::Group: return "GroupNormalization";
  }
  return "";
}
int64_t firstOpsetOf(NormKind kind) {
  switch (kind) {
    case NormKind::Layer: return kLayerNormalizationOpset;
    case NormKind::RootMeanSquare: return kRmsNormalizationOpset;
    case NormKind::Group: return kGroupNormalizationOpset;
  }
  return 0;
}

/// A constant gamma or beta and what the fused op reads instead when its dims are not the normalized dims.
struct AffineParam {
  const Value* value = nullptr;      // null: the chain has none
  std::vector<double> expanded;      // gamma/beta broadcast to the normalized dims, when `value` is not that already
  bool usedAsIs = false;
};

struct NormChain : Match {
  NormKind kind = NormKind::Layer;
  const Value* input = nullptr;  // what the fused op reads (before the leading Cast, when it is absorbed)
  bool castsAbsorbed = false;
  std::vector<const Node*> nodes;  // the chain, in graph order; the last one computes `output`
  const Node* root = nullptr;      // the Div or Mul computing the normalized value
  const Value* output = nullptr;
  const Value* statisticsInput = nullptr;  // the value the means read
  std::vector<int64_t> normalizedDims;
  int64_t rank = 0;
  double epsilon = 0;
  DataType type = DataType::Float;
  AffineParam gamma;
  AffineParam beta;
  int64_t groups = 0;  // GroupNorm only
};

/// The other input of a binary node, when `value` is one of its two inputs.
const Value* otherOperand(const Node& binary, const Value* value) {
  if (binary.inputs().size() != 2) return nullptr;
  if (binary.input(0) == value) return binary.input(1);
  if (binary.input(1) == value) return binary.input(0);
  return nullptr;
}

const Node* producerOp(const Value* value, std::string_view op) {
  if (!value || !value->producer() || !value->producer()->isOnnxOp(op)) return nullptr;
  return value->producer();
}

std::optional<double> constantScalar(const Value* value, const RuleContext& context) {
  if (!value) return std::nullopt;
  const Tensor* tensor = context.constantOf(value);
  if (!tensor || tensor->elementCount() != 1 || !isFloatingPoint(tensor->dataType())) return std::nullopt;
  return tensor->toDoubles()[0];
}

/// The sole node reading `value` (not a graph output), if it is `op`.
const Node* soleReaderOp(const Value* value, std::string_view op) {
  const Node* reader = soleConsumer(*value);
  return reader && reader->isOnnxOp(op) ? reader : nullptr;
}

/// A mean over some axes of `input` that keeps the reduced dims, as exporters write it: ReduceMean; ReduceSum times 1/n
/// or divided by n (JAX/Flax); GlobalAveragePool of a Reshape to [P, Q, R...], reshaped back (tf2onnx). Which axes,
/// and whether n is right, is checked later (meanAxes), once the input's shape is known.
struct Mean {
  const Value* input = nullptr;
  const Value* output = nullptr;
  std::vector<const Node*> nodes;  // in graph order; the last computes `output`
  const Node* reduce = nullptr;    // the ReduceMean, ReduceSum or GlobalAveragePool
  const Value* count = nullptr;    // ReduceSum: the constant it is multiplied by (1/n) or divided by (n)
  bool dividesByCount = false;
};

std::optional<Mean> meanOf(const Value* value, const RuleContext& context) {
  if (!value || !value->producer()) return std::nullopt;
  const Node* node = value->producer();
  Mean mean;
  mean.output = value;
  if (node->isOnnxOp("ReduceMean")) {
    mean.reduce = node;
    mean.input = node->input(0);
    mean.nodes = {node};
    return mean;
  }
  if ((node->isOnnxOp("Mul") || node->isOnnxOp("Div")) && node->inputs().size() == 2) {
    const std::size_t slots = node->isOnnxOp("Div") ? 1 : 2;  // Div(sum, n) only
    for (std::size_t slot = 0; slot < slots; ++slot) {
      const Node* sum = producerOp(node->input(slot), "ReduceSum");
      const Value* count = node->input(1 - slot);
      if (!sum || !constantScalar(count, context)) continue;
      mean.reduce = sum;
      mean.input = sum->input(0);
      mean.count = count;
      mean.dividesByCount = node->isOnnxOp("Div");
      mean.nodes = {sum, node};
      return mean;
    }
    return std::nullopt;
  }
  if (node->isOnnxOp("Reshape")) {
    const Node* pool = producerOp(node->input(0), "GlobalAveragePool");
    const Node* view = pool ? producerOp(pool->input(0), "Reshape") : nullptr;
    if (!view) return std::nullopt;
    mean.reduce = pool;
    mean.input = view->input(0);
    mean.nodes = {view, pool, node};
    return mean;
  }
  return std::nullopt;
}

// The Keras (tf2onnx) tail after s = gamma / sqrt(v + eps) (or s = 1 / sqrt(v + eps) without gamma):
// y = x * s + (beta - mean * s); without beta y = x * s + Neg(mean * s) or x * s - mean * s.
struct KerasTail {
  const Node* meanScaled = nullptr;   // Mul(mean, s)
  const Node* shift = nullptr;        // Sub(beta, mean * s) or Neg(mean * s); null when the sum subtracts
  const Node* inputScaled = nullptr;  // Mul(x, s)
  const Node* sum = nullptr;          // Add(x * s, shift) or Sub(x * s, mean * s)
  const Value* beta = nullptr;        // null without beta
};

class FuseNormalization final : public Rule {
 public:
  const char* name() const override { return "norm-fuse"; }
  const char* summary() const override {
    return "A LayerNorm, RMSNorm or GroupNorm written as primitive ops (ReduceMean, Sub, Pow, Sqrt, Div, ...) fused "
           "into LayerNormalization (opset 17+), RMSNormalization (opset 23+) or GroupNormalization (opset 21+)";
  }
  // Rooted where the normalized value is computed: the Div, or the Mul by a reciprocal.
  // GroupNorm's root is its InstanceNormalization. A GroupNormalization-18 is matched only to say why it stays.
  std::vector<std::string> rootOps() const override {
    return {"Div", "Mul", "InstanceNormalization", "GroupNormalization"};
  }
  std::vector<OpVersions> opVersions() const override {
    return {kReduceMean, kReduceSum, kGlobalAveragePool, kSub, kPow, kMul, kAdd, kDiv, kSqrt,
            kReciprocal, kCast, kConstant, kNeg, kMax, kReshape, kInstanceNormalization, kLayerNormalization, kRmsNormalization,
            kGroupNormalization};
  }
  const char* failureSection() const override { return "norms_not_fused"; }

  MatchResult match(const Node& root, const RuleContext& context) const override {
    if (root.isOnnxOp("InstanceNormalization")) return matchGroupNorm(root, context);
    if (root.isOnnxOp("GroupNormalization")) return explainGroupNorm18(root, context);
    auto chain = std::make_unique<NormChain>();
    std::set<const Node*> members;
    auto take = [&](const Node* node) {
      chain->nodes.push_back(node);
      members.insert(node);
    };

    // n = d / s, or d * r with r = 1 / s; s = Sqrt(v + eps).
    const Value* numerator = nullptr;
    const Node* reciprocal = nullptr;
    const Node* sqrt = nullptr;
    // Div(1, s) is the reciprocal of a Mul form, whose Mul is the root.
    if (root.isOnnxOp("Div") && root.inputs().size() == 2) {
      sqrt = producerOp(root.input(1), "Sqrt");
      if (sqrt && constantScalar(root.input(0), context)) return notNorm();
      numerator = root.input(0);
    } else if (root.isOnnxOp("Mul") && root.inputs().size() == 2) {
      for (int slot = 0; slot < 2 && !sqrt; ++slot) {
        const Value* candidate = root.input(static_cast<std::size_t>(slot));
        if (const Node* node = producerOp(candidate, "Reciprocal")) {
          reciprocal = node;
        } else if (const Node* div = producerOp(candidate, "Div"); div && constantScalar(div->input(0), context) == 1.0) {
          reciprocal = div;
        } else {
          continue;
        }
        sqrt = producerOp(reciprocal->input(reciprocal->inputs().size() - 1), "Sqrt");
        numerator = root.input(static_cast<std::size_t>(1 - slot));
      }
    }
    if (!sqrt) return notNorm();
    const Node* addEpsilon = producerOp(sqrt->input(0), "Add");
    if (!addEpsilon || addEpsilon->inputs().size() != 2) return notNorm();
    std::optional<Mean> varianceMean = meanOf(addEpsilon->input(0), context);
    const Value* epsilonValue = addEpsilon->input(1);
    if (!varianceMean) {
      varianceMean = meanOf(addEpsilon->input(1), context);
      epsilonValue = addEpsilon->input(0);
    }
    // Flax: v = E[x^2] - E[x]^2, possibly clamped by Max(., 0).
    const Node* flaxDifference = nullptr;
    const Node* clamp = nullptr;
    for (std::size_t slot = 0; slot < 2 && !varianceMean; ++slot) {
      const Value* candidate = addEpsilon->input(slot);
      const Node* max = producerOp(candidate, "Max");
      if (max && max->inputs().size() == 2) {
        for (std::size_t side = 0; side < 2; ++side)
          if (constantScalar(max->input(1 - side), context) == 0.0) candidate = max->input(side);
        if (candidate == addEpsilon->input(slot)) max = nullptr;
      }
      const Node* difference = producerOp(candidate, "Sub");
      if (!difference || !meanOf(difference->input(0), context)) continue;
      flaxDifference = difference;
      clamp = max;
      varianceMean = meanOf(difference->input(0), context);
      epsilonValue = addEpsilon->input(1 - slot);
    }
    if (!varianceMean) return notNorm();

    // From here on the chain looks like a norm: every refusal is reported.
    const std::string where = describe(root);
    const Tensor* epsilonTensor = context.constantOf(epsilonValue);
    if (!epsilonTensor)
      return MatchResult::failure(reason::kOperandNotConstant,
                                  "the epsilon added to the variance before " + where + " is not a constant");
    if (epsilonTensor->elementCount() != 1 || !isFloatingPoint(epsilonTensor->dataType()))
      return MatchResult::failure(reason::kEpsilonNotScalar, "the epsilon added to the variance before " + where +
                                                                 " has dims " + formatDims(epsilonTensor->dims()) +
                                                                 ", not a single floating value");
    chain->epsilon = epsilonTensor->toDoubles()[0];

    MatchFailure why;
    const Node* square = varianceMean->input ? varianceMean->input->producer() : nullptr;
    const Value* squared = squareBase(square, where, context, &why);
    if (!squared) return MatchResult::failure(why.code, why.message);
    if (flaxDifference) return matchFlax(root, context, std::move(chain), numerator, reciprocal, sqrt, addEpsilon,
                                         *varianceMean, square, squared, flaxDifference, clamp);
    // LayerNorm when the squared value is X minus its mean, else RMSNorm of the squared value itself.
    const Node* centre = producerOp(squared, "Sub");
    std::optional<Mean> mean = centre ? meanOf(centre->input(1), context) : std::nullopt;
    if (mean && mean->input != centre->input(0)) mean.reset();
    // The Keras form scales by s = gamma / sqrt(v + eps): the root is that Mul, with a constant gamma. Without gamma
    // s is the reciprocal itself, and the root the Mul(x, s); the Mul(mean, s) beside it is no root of its own.
    const bool kerasWithGamma = reciprocal && mean && context.constantOf(numerator);
    const bool kerasWithoutGamma = reciprocal && mean && numerator == mean->input;
    if (reciprocal && mean && numerator == mean->output) return notNorm();
    const bool kerasForm = kerasWithGamma || kerasWithoutGamma;
    KerasTail keras;
    if (kerasForm) {
      if (!findKerasTail(kerasWithGamma ? root.output(0) : reciprocal->output(0), mean->input, mean->output, &keras))
        return MatchResult::failure(reason::kNotANormChain,
                                    where + " scales by gamma / sqrt(var + eps), but not into x * s + (beta - mean * s)");
    } else if (squared != numerator) {
      return MatchResult::failure(reason::kNotANormChain, where + " divides another value than the one whose "
                                                                  "square the variance averages");
    }
    if (mean) {
      chain->kind = NormKind::Layer;
      chain->statisticsInput = centre->input(0);
      for (const Node* node : mean->nodes) take(node);
      take(centre);
    } else {
      chain->kind = NormKind::RootMeanSquare;
      chain->statisticsInput = squared;
    }
    take(square);
    for (const Node* node : varianceMean->nodes) take(node);
    take(addEpsilon);
    take(sqrt);
    if (reciprocal) take(reciprocal);
    take(&root);
    chain->root = &root;
    if (kerasForm)
      for (const Node* node : {keras.meanScaled, keras.shift, keras.inputScaled, keras.sum})
        if (node && node != &root) take(node);

    // The reduced axes: the same in both means, X's trailing ones.
    return finishMatch(root, context, std::move(chain), std::move(members), *varianceMean, mean ? &*mean : nullptr,
                       kerasForm ? &keras : nullptr, kerasWithGamma ? numerator : nullptr);
  }

  // The Flax form from its statistics on: E[x]^2 subtracted from E[x^2], the numerator x - E[x].
  MatchResult matchFlax(const Node& root, const RuleContext& context, std::unique_ptr<NormChain> chain,
                        const Value* numerator, const Node* reciprocal, const Node* sqrt, const Node* addEpsilon,
                        const Mean& meanOfSquares, const Node* square, const Value* x, const Node* difference,
                        const Node* clamp) const {
    const std::string where = describe(root);
    MatchFailure why;
    const Node* squaredMean = difference->input(1) ? difference->input(1)->producer() : nullptr;
    const Value* meanValue = squareBase(squaredMean, where, context, &why);
    if (!meanValue) return MatchResult::failure(why.code, why.message);
    const std::optional<Mean> mean = meanOf(meanValue, context);
    const Node* centre = producerOp(numerator, "Sub");
    if (!mean || mean->input != x || !centre || centre->input(0) != x || centre->input(1) != meanValue)
      return MatchResult::failure(reason::kNotANormChain, where + " computes E[x^2] - E[x]^2, but not of the x it "
                                                                  "centres by its mean");
    chain->kind = NormKind::Layer;
    chain->statisticsInput = x;
    std::set<const Node*> members;
    std::vector<const Node*> nodes = mean->nodes;
    nodes.push_back(square);
    nodes.insert(nodes.end(), meanOfSquares.nodes.begin(), meanOfSquares.nodes.end());
    for (const Node* node : {squaredMean, difference, clamp, addEpsilon, sqrt, centre, reciprocal, &root})
      nodes.push_back(node);
    for (const Node* node : nodes) {
      if (!node) continue;
      chain->nodes.push_back(node);
      members.insert(node);
    }
    chain->root = &root;
    return finishMatch(root, context, std::move(chain), std::move(members), meanOfSquares, &*mean, nullptr, numerator);
  }

  // What every form checks once its nodes are known: axes, types, the optional Casts, gamma and beta, other readers,
  // the opset.
  MatchResult finishMatch(const Node& root, const RuleContext& context, std::unique_ptr<NormChain> chain,
                          std::set<const Node*> members, const Mean& varianceMean, const Mean* mean,
                          const KerasTail* keras, const Value* kerasGamma) const {
    const std::string where = describe(root);
    const bool kerasForm = keras != nullptr;
    auto take = [&](const Node* node) {
      chain->nodes.push_back(node);
      members.insert(node);
    };
    std::optional<std::vector<int64_t>> shape = context.knownShape(*chain->statisticsInput);
    if (!shape)
      return MatchResult::failure(reason::kRankUnknown, "the rank of the value " + where + " normalizes is not known");
    chain->rank = static_cast<int64_t>(shape->size());
    MatchFailure why;
    std::optional<std::vector<int64_t>> axes = averagedAxes(varianceMean, *shape, context, &why);
    if (!axes) return MatchResult::failure(why.code, why.message);
    if (mean) {
      std::optional<std::vector<int64_t>> meanAxes = averagedAxes(*mean, *shape, context, &why);
      if (!meanAxes) return MatchResult::failure(why.code, why.message);
      if (*meanAxes != *axes)
        return MatchResult::failure(reason::kAxesDiffer, "the mean of " + where + " reduces axes " +
                                                             formatDims(*meanAxes) + ", its variance axes " +
                                                             formatDims(*axes));
    }
    const int64_t k = static_cast<int64_t>(axes->size());
    for (int64_t i = 0; i < k; ++i)
      if ((*axes)[static_cast<std::size_t>(i)] != chain->rank - k + i)
        return MatchResult::failure(reason::kAxesNotTrailing,
                                    where + " normalizes over axes " + formatDims(*axes) + " of a rank-" +
                                        std::to_string(chain->rank) + " value, not its trailing axes");
    chain->normalizedDims.assign(shape->end() - k, shape->end());
    if (std::find(chain->normalizedDims.begin(), chain->normalizedDims.end(), analysis::kUnknownDim) !=
        chain->normalizedDims.end())
      return MatchResult::failure(reason::kRankUnknown, "the normalized dims " + formatDims(chain->normalizedDims) +
                                                            " of " + where + " are not all known");

    if (kerasForm) {
      // gamma and beta (each optional) are part of the form; their shapes are checked like the others'.
      if (keras->beta && !context.constantOf(keras->beta))
        return MatchResult::failure(reason::kOperandNotConstant, "the bias '" + keras->beta->name() +
                                                                     "' of the norm at " + where + " is not a constant");
      if ((kerasGamma && !readParam(kerasGamma, *chain, "scale", where, context, &chain->gamma, &why)) ||
          (keras->beta && !readParam(keras->beta, *chain, "bias", where, context, &chain->beta, &why)))
        return MatchResult::failure(why.code, why.message);
    }

    // Types: float statistics; float16/bfloat16 models compute them in float between two Casts.
    const Value* normalized = root.output(0);
    chain->input = chain->statisticsInput;
    std::optional<DataType> statisticsType = analysis::knownElementType(*chain->statisticsInput);
    if (statisticsType != DataType::Float)
      return MatchResult::failure(reason::kUnsupportedType,
                                  where + " computes its statistics in " +
                                      (statisticsType ? dataTypeName(*statisticsType) : std::string("an unknown type")) +
                                      ", not float (the fused op's stash_type)");
    chain->type = DataType::Float;
    const Node* castIn = kerasForm ? nullptr : producerOp(chain->statisticsInput, "Cast");
    const Node* castOut = kerasForm ? nullptr : soleReaderOp(normalized, "Cast");
    if (castIn && castOut) {
      std::optional<DataType> outerType = analysis::knownElementType(*castIn->input(0));
      if (outerType && (*outerType == DataType::Float16 || *outerType == DataType::BFloat16) &&
          castOut->attributeInt("to", 0) == static_cast<int64_t>(*outerType)) {
        chain->castsAbsorbed = true;
        chain->input = castIn->input(0);
        chain->type = *outerType;
        chain->nodes.insert(chain->nodes.begin(), castIn);
        members.insert(castIn);
        take(castOut);
        normalized = castOut->output(0);
      }
    }

    // GroupNorm written out on a grouped view (ReduceMean form), where the opset has GroupNormalization-21.
    if (chain->kind == NormKind::Layer && !kerasForm && !chain->castsAbsorbed &&
        context.opset() >= kGroupNormalizationOpset && takeGroupView(normalized, *axes, context, where, *chain, members))
      return finishChecks(root, context, std::move(chain), members);

    // gamma: Mul(n, gamma) or Mul(gamma, n) with a constant gamma; beta: Add likewise (LayerNorm only).
    const Value* tail = kerasForm ? keras->sum->output(0) : normalized;
    if (const Node* mul = kerasForm ? nullptr : soleReaderOp(tail, "Mul")) {
      if (const Value* gamma = otherOperand(*mul, tail); gamma && context.constantOf(gamma)) {
        if (!readParam(gamma, *chain, "scale", where, context, &chain->gamma, &why))
          return MatchResult::failure(why.code, why.message);
        take(mul);
        tail = mul->output(0);
      }
    }
    if (chain->kind == NormKind::Layer && !kerasForm) {
      if (const Node* add = soleReaderOp(tail, "Add")) {
        if (const Value* beta = otherOperand(*add, tail); beta && context.constantOf(beta)) {
          if (!readParam(beta, *chain, "bias", where, context, &chain->beta, &why))
            return MatchResult::failure(why.code, why.message);
          take(add);
          tail = add->output(0);
        }
      }
    }
    chain->output = tail;

    return finishChecks(root, context, std::move(chain), members);
  }

  // Every form: no node kept by the user, no intermediate read outside the chain, the op in the opset.
  MatchResult finishChecks(const Node& root, const RuleContext& context, std::unique_ptr<NormChain> chain,
                           const std::set<const Node*>& members) const {
    const std::string where = describe(root);
    // Every value the chain computes before its output is read only inside it.
    for (const Node* node : chain->nodes) {
      if (context.isKept(*node))
        return MatchResult::failure(reason::kKeptByUser, describe(*node) + " of the norm at " + where +
                                                             " is kept by the user");
      if (node->graph() != root.graph())
        return MatchResult::failure(reason::kNotANormChain, "the norm at " + where + " spans more than one graph");
      for (const Value* output : node->outputs()) {
        if (!output || output == chain->output) continue;
        bool inside = !output->isGraphOutput();
        for (const Use& use : output->uses()) inside = inside && members.count(use.node) > 0;
        if (!inside)
          return MatchResult::failure(reason::kIntermediateHasOtherReaders,
                                      "'" + output->name() + "' of " + describe(*node) + " in the norm at " + where +
                                          " is also read outside it (or is a graph output)");
      }
    }
    // An absent scale is written as 1s, an absent GroupNorm bias as 0s (present ones readParam checked).
    MatchFailure why;
    const bool writesBias = chain->kind == NormKind::Group && !chain->beta.value;
    if ((!chain->gamma.value && !paramConstantFits(*chain, "scale", where, context, &why)) ||
        (writesBias && !paramConstantFits(*chain, "bias", where, context, &why)))
      return MatchResult::failure(why.code, why.message);

    if (context.opset() < firstOpsetOf(chain->kind))
      return MatchResult::failure(reason::kNormOpNotInOpset,
                                  where + " belongs to a decomposed norm, but the model's opset " + std::to_string(context.opset()) + " has no " +
                                      opOf(chain->kind) + " (from opset " + std::to_string(firstOpsetOf(chain->kind)) +
                                      "; bnfold never emits ONNX Runtime's contrib ops)");
    return MatchResult::success(std::move(chain));
  }

  void rewrite(Match& base, Rewriter& rewriter) const override {
    auto& chain = static_cast<NormChain&>(base);
    const Node* last = chain.nodes.back();
    const std::string nameHint = chain.root->name() + "/" + opOf(chain.kind);
    const int64_t k = static_cast<int64_t>(chain.normalizedDims.size());

    auto paramValue = [&](const AffineParam& param, const char* suffix, double fill) -> const Value* {
      if (param.usedAsIs) return param.value;
      std::vector<double> values = param.value ? param.expanded : std::vector<double>();
      if (!param.value) values.assign(static_cast<std::size_t>(checkedElementCount(chain.normalizedDims).value_or(0)), fill);
      return addTensor(rewriter, *last, chain.type, chain.normalizedDims, values, nameHint + suffix);
    };
    const Value* scale = paramValue(chain.gamma, "_scale", 1.0);
    std::vector<const Value*> inputs = {chain.input, scale};
    // GroupNormalization's bias is required; LayerNormalization's optional; RMSNormalization has none.
    if ((chain.kind == NormKind::Layer && chain.beta.value) || chain.kind == NormKind::Group)
      inputs.push_back(paramValue(chain.beta, "_bias", 0.0));
    std::vector<onnx::AttributeProto> attributes = {
        floatAttribute("epsilon", static_cast<float>(chain.epsilon)),
        intAttribute("stash_type", static_cast<int64_t>(DataType::Float))};
    attributes.push_back(chain.kind == NormKind::Group ? intAttribute("num_groups", chain.groups)
                                                       : intAttribute("axis", -k));
    Node* fused = rewriter.createNode(last, opOf(chain.kind), inputs, {chain.output->name() + "_normalized"}, nameHint,
                                      std::move(attributes));

    nlohmann::json replaced = nlohmann::json::array();
    nlohmann::json ops = nlohmann::json::array();
    for (const Node* node : chain.nodes) {
      replaced.push_back(node->name());
      ops.push_back(node->opType());
    }
    // "node"/"op" name the node that normalized (removed), "into"/"into_op" the fused one, as findings expect.
    nlohmann::json entry = {{"node", chain.root->name()},
                            {"op", chain.root->opType()},
                            {"into", fused->name()},
                            {"into_op", opOf(chain.kind)},
                            {"input", chain.input->name()},
                            {"output", chain.output->name()},
                            {"replaced_nodes", replaced},
                            {"replaced_ops", ops},
                            {"scale", chain.gamma.value ? nlohmann::json(chain.gamma.value->name()) : nlohmann::json(nullptr)},
                            {"bias", chain.beta.value ? nlohmann::json(chain.beta.value->name()) : nlohmann::json(nullptr)},
                            {"epsilon", chain.epsilon},
                            {"axis", chain.kind == NormKind::Group ? int64_t{1} : -k},
                            {"normalized_dims", chain.normalizedDims},
                            {"casts_absorbed", chain.castsAbsorbed}};
    if (chain.kind == NormKind::Group) entry["num_groups"] = chain.groups;
    rewriter.replaceValueKeepingName(chain.output, fused->output(0));
    for (auto it = chain.nodes.rbegin(); it != chain.nodes.rend(); ++it) rewriter.eraseNode(*it);
    rewriter.record("norms_fused", std::move(entry));
  }

 private:
  // GroupNormalization-18 (deprecated: scale and bias per group) would become -21 (per channel), but a model whose
  // opset has -21 cannot hold a -18; raising the opset is --target-opset's job, which this build's libonnx version
  // converter (opsets up to 17) cannot do. So the node stays, and the report says why and what else there is.
  static MatchResult explainGroupNorm18(const Node& node, const RuleContext& context) {
    if (context.opset() >= kGroupNormPerChannelOpset)
      return MatchResult::quietFailure(reason::kNotANormChain, describe(node) + " is already GroupNormalization-21");
    return MatchResult::failure(
        reason::kNormOpNotInOpset,
        describe(node) + " is the deprecated GroupNormalization-18 (scale and bias per group); its per-channel "
                         "form GroupNormalization-21 needs opset 21 and the model's is " +
            std::to_string(context.opset()) + " (--rules +norm-decompose writes it as primitive ops)");
  }

  // Reshape(X, [N, G, -1]) -> InstanceNormalization(scale 1, bias 0) -> Reshape back -> Mul(gamma)? -> Add(beta)?
  MatchResult matchGroupNorm(const Node& instanceNorm, const RuleContext& context) const {
    const Node* grouping = producerOp(instanceNorm.input(0), "Reshape");
    const Node* ungrouping = soleReaderOp(instanceNorm.output(0), "Reshape");
    if (!grouping || !ungrouping || instanceNorm.inputs().size() != 3)
      return MatchResult::quietFailure(reason::kNotANormChain,
                                       describe(instanceNorm) + " is not between a Reshape to groups and one back");
    const std::string where = describe(instanceNorm);
    auto chain = std::make_unique<NormChain>();
    chain->kind = NormKind::Group;
    chain->root = &instanceNorm;
    const Value* x = grouping->input(0);
    chain->input = chain->statisticsInput = x;
    const int64_t groups = wholeChannelGroups(*x, *instanceNorm.input(0), *ungrouping->output(0), context);
    if (groups < 0)
      return MatchResult::failure(reason::kRankUnknown, "the shapes around " + where + " are not all known");
    const std::vector<int64_t> shape = *context.knownShape(*x);
    if (groups == 0)
      return MatchResult::failure(reason::kNotANormChain,
                                  where + " normalizes " + formatDims(*context.knownShape(*instanceNorm.input(0))) +
                                      ", which is not " + formatDims(shape) + " in groups of whole channels reshaped back");
    const Tensor* unitScale = context.constantOf(instanceNorm.input(1));
    const Tensor* zeroBias = context.constantOf(instanceNorm.input(2));
    auto all = [](const Tensor* tensor, double value) {
      if (!tensor) return false;
      const std::vector<double> values = tensor->toDoubles();
      return std::all_of(values.begin(), values.end(), [&](double v) { return v == value; });
    };
    if (!all(unitScale, 1.0) || !all(zeroBias, 0.0))
      return MatchResult::failure(reason::kNotANormChain,
                                  where + " has a scale other than 1 or a bias other than 0 per group");
    chain->groups = groups;
    chain->rank = static_cast<int64_t>(shape.size());
    chain->normalizedDims = {shape[1]};
    chain->epsilon = instanceNorm.attributeFloat("epsilon", 1e-5f);
    std::optional<DataType> type = analysis::knownElementType(*x);
    if (type != DataType::Float)
      return MatchResult::failure(reason::kUnsupportedType,
                                  where + " normalizes " + (type ? dataTypeName(*type) : std::string("an unknown type")) +
                                      ", not float");
    std::set<const Node*> members;
    for (const Node* node : {grouping, &instanceNorm, ungrouping}) {
      chain->nodes.push_back(node);
      members.insert(node);
    }
    MatchFailure why;
    if (!takeChannelAffine(ungrouping->output(0), where, context, *chain, &members, &why))
      return MatchResult::failure(why.code, why.message);
    return finishChecks(instanceNorm, context, std::move(chain), members);
  }

  // G when `grouped` is x [N, C, ...] reshaped to [N, G, C/G * spatial] (groups of whole channels) and `back` has x's
  // shape again; 0 when not; -1 when a shape is not known.
  static int64_t wholeChannelGroups(const Value& x, const Value& grouped, const Value& back, const RuleContext& context) {
    const std::optional<std::vector<int64_t>> shape = context.knownShape(x);
    const std::optional<std::vector<int64_t>> groupedShape = context.knownShape(grouped);
    const std::optional<std::vector<int64_t>> backShape = context.knownShape(back);
    auto known = [](const std::optional<std::vector<int64_t>>& dims) {
      return dims && std::find(dims->begin(), dims->end(), analysis::kUnknownDim) == dims->end();
    };
    if (!known(shape) || !known(groupedShape) || !known(backShape) || shape->size() < 3) return -1;
    const int64_t channels = (*shape)[1];
    const int64_t spatial = checkedElementCount(std::vector<int64_t>(shape->begin() + 2, shape->end())).value_or(-1);
    const int64_t groups = groupedShape->size() == 3 ? (*groupedShape)[1] : 0;
    if (groups <= 0 || channels % groups != 0 || (*groupedShape)[0] != (*shape)[0] ||
        (*groupedShape)[2] != channels / groups * spatial || *backShape != *shape)
      return 0;
    return groups;
  }

  // A GroupNorm's Mul(gamma)? and Add(beta)? after `tail` (either operand order), taken into `chain` up to its output;
  // false with `why` when a constant one is not one value per channel.
  static bool takeChannelAffine(const Value* tail, const std::string& where, const RuleContext& context,
                                NormChain& chain, std::set<const Node*>* members, MatchFailure* why) {
    for (const char* op : {"Mul", "Add"}) {
      const Node* affine = soleReaderOp(tail, op);
      const Value* param = affine ? otherOperand(*affine, tail) : nullptr;
      if (!param || !context.constantOf(param)) continue;
      const bool scale = op == std::string("Mul");
      if (!readChannelParam(param, chain, scale ? "scale" : "bias", where, context, scale ? &chain.gamma : &chain.beta,
                            why))
        return false;
      chain.nodes.push_back(affine);
      members->insert(affine);
      tail = affine->output(0);
    }
    chain.output = tail;
    return true;
  }

  // A LayerNorm chain over the last axis of Reshape(X, [N, G, -1]) whose normalized value is reshaped back to X's shape
  // becomes a GroupNorm of X, when every further condition holds: the groups whole channels, the grouped value and
  // the Reshapes used only by the chain, gamma and beta after it per channel. Otherwise the chain stays the (exact)
  // LayerNorm of the grouped view, so nothing is refused here.
  static bool takeGroupView(const Value* normalized, const std::vector<int64_t>& axes, const RuleContext& context,
                            const std::string& where, NormChain& chain, std::set<const Node*>& members) {
    const Node* grouping = producerOp(chain.statisticsInput, "Reshape");
    const Node* ungrouping = soleReaderOp(normalized, "Reshape");
    if (!grouping || !ungrouping || chain.rank != 3 || axes != std::vector<int64_t>{2} || context.isKept(*grouping) ||
        context.isKept(*ungrouping))
      return false;
    const Value* x = grouping->input(0);
    const int64_t groups = wholeChannelGroups(*x, *chain.statisticsInput, *ungrouping->output(0), context);
    if (groups <= 0 || chain.statisticsInput->isGraphOutput()) return false;
    for (const Use& use : chain.statisticsInput->uses())
      if (!members.count(use.node)) return false;
    NormChain group;
    group.kind = NormKind::Group;
    group.type = chain.type;
    group.rank = static_cast<int64_t>(context.knownShape(*x)->size());
    group.normalizedDims = {(*context.knownShape(*x))[1]};
    std::set<const Node*> groupMembers = members;
    MatchFailure why;
    if (!takeChannelAffine(ungrouping->output(0), where, context, group, &groupMembers, &why)) return false;
    chain.kind = NormKind::Group;
    chain.input = chain.statisticsInput = x;
    chain.rank = group.rank;
    chain.normalizedDims = group.normalizedDims;
    chain.groups = groups;
    chain.gamma = group.gamma;
    chain.beta = group.beta;
    chain.output = group.output;
    chain.nodes.insert(chain.nodes.begin(), grouping);
    chain.nodes.push_back(ungrouping);
    chain.nodes.insert(chain.nodes.end(), group.nodes.begin(), group.nodes.end());
    members = std::move(groupMembers);
    members.insert(grouping);
    members.insert(ungrouping);
    return true;
  }

  // A GroupNorm's gamma or beta: one value per channel (axis 1), or one for all; expanded to [C].
  static bool readChannelParam(const Value* value, const NormChain& chain, const std::string& role,
                               const std::string& where, const RuleContext& context, AffineParam* param,
                               MatchFailure* why) {
    const Tensor* tensor = context.constantOf(value);
    const std::vector<int64_t> dims = tensor->dims();
    const auto rank = static_cast<int64_t>(dims.size());
    const int64_t channels = chain.normalizedDims[0];
    bool fits = tensor->dataType() == chain.type && rank <= chain.rank;
    int64_t perChannel = 1;
    for (int64_t i = 0; i < rank && fits; ++i) {
      const int64_t axis = chain.rank - rank + i;  // aligned from the last axis
      const int64_t dim = dims[static_cast<std::size_t>(i)];
      if (axis == 1 && dim == channels) perChannel = channels;
      else fits = dim == 1;
    }
    if (!fits) {
      *why = {reason::kParamShapeMismatch, "the " + role + " '" + value->name() + "' after " + where + " (" +
                                               dataTypeName(tensor->dataType()) + formatDims(dims) +
                                               ") is not one float value per channel"};
      return false;
    }
    param->value = value;
    param->usedAsIs = dims == chain.normalizedDims && chain.rank == 2;
    if (perChannel == channels) {
      param->expanded = tensor->toDoubles();
      return true;
    }
    if (!paramConstantFits(chain, role, where, context, why)) return false;
    param->expanded.assign(static_cast<std::size_t>(channels), tensor->toDoubles().at(0));
    return true;
  }

  // The value `square` squares: Pow(d, 2) or Mul(d, d); else null with `why`.
  static const Value* squareBase(const Node* square, const std::string& where, const RuleContext& context,
                                 MatchFailure* why) {
    if (square && square->isOnnxOp("Pow") && square->inputs().size() == 2) {
      const std::optional<double> exponent = constantScalar(square->input(1), context);
      if (exponent == 2.0) return square->input(0);
      *why = {reason::kExponentNotTwo, "the statistics of " + where + " raise to " +
                                           (exponent ? "the power " + std::to_string(*exponent) : "a non-constant power") +
                                           ", not exactly 2"};
      return nullptr;
    }
    if (square && square->isOnnxOp("Mul") && square->inputs().size() == 2) {
      if (square->input(0) == square->input(1)) return square->input(0);
      *why = {reason::kExponentNotTwo, "the statistics of " + where + " multiply two different values, not a square"};
      return nullptr;
    }
    *why = {reason::kExponentNotTwo, "the statistics of " + where + " average no square (Pow(d, 2) or Mul(d, d))"};
    return nullptr;
  }


  static bool findKerasTail(const Value* s, const Value* x, const Value* meanValue, KerasTail* tail) {
    if (s->uses().size() != 2 || s->isGraphOutput()) return false;
    for (const Use& use : s->uses()) {
      if (!use.node->isOnnxOp("Mul")) return false;
      const Value* other = otherOperand(*use.node, s);
      if (other == meanValue) tail->meanScaled = use.node;
      else if (other == x) tail->inputScaled = use.node;
    }
    if (!tail->meanScaled || !tail->inputScaled) return false;
    const Value* meanScaled = tail->meanScaled->output(0);
    const Value* inputScaled = tail->inputScaled->output(0);
    const Node* reader = soleConsumer(*meanScaled);
    if (!reader) return false;
    if (reader->isOnnxOp("Sub") && reader->input(0) == inputScaled && reader->input(1) == meanScaled) {
      tail->sum = reader;
      return true;
    }
    if (reader->isOnnxOp("Sub") && reader->input(1) == meanScaled) tail->beta = reader->input(0);
    else if (!reader->isOnnxOp("Neg")) return false;
    tail->shift = reader;
    // Found among x * s's readers, so that another reader is reported as one (finishChecks).
    for (const Use& use : inputScaled->uses())
      if (use.node->isOnnxOp("Add") && otherOperand(*use.node, inputScaled) == tail->shift->output(0)) tail->sum = use.node;
    return tail->sum != nullptr;
  }

  // Most Div and Mul roots of a model end here: the quiet message names no node, which would cost a string per root.
  static MatchResult notNorm() {
    return MatchResult::quietFailure(reason::kNotANormChain, "no division by a square root of a mean");
  }

  // The axes `mean` averages over an input of `shape` (sorted, non-negative); a sum's n checked against the summed dims.
  static std::optional<std::vector<int64_t>> averagedAxes(const Mean& mean, const std::vector<int64_t>& shape,
                                                          const RuleContext& context, MatchFailure* why) {
    const auto rank = static_cast<int64_t>(shape.size());
    if (mean.reduce->isOnnxOp("GlobalAveragePool")) return viewAxes(mean, shape, context, why);
    std::optional<std::vector<int64_t>> axes = reducedAxes(*mean.reduce, rank, context, why);
    if (!axes || !mean.count) return axes;
    int64_t n = 1;
    for (int64_t axis : *axes) {
      const int64_t dim = shape[static_cast<std::size_t>(axis)];
      if (dim == analysis::kUnknownDim) {
        *why = {reason::kRankUnknown, "the dims " + describe(*mean.reduce) + " sums are not all known"};
        return std::nullopt;
      }
      n *= dim;
    }
    // 1/n rounded to the count's type: a relative error far below 1e-6.
    const double count = *constantScalar(mean.count, context);
    const double expected = mean.dividesByCount ? static_cast<double>(n) : 1.0 / static_cast<double>(n);
    if (n == 0 || std::abs(count - expected) > 1e-6 * expected) {
      *why = {reason::kMeanCountMismatch, describe(*mean.reduce) + " sums " + std::to_string(n) + " elements, then " +
                                              (mean.dividesByCount ? "divides by " : "multiplies by ") +
                                              std::to_string(count) + ", not their mean"};
      return std::nullopt;
    }
    return axes;
  }

  // The axes a GlobalAveragePool of a Reshape to [P, Q, R...] reshaped back averages: X's last k axes, when R... holds
  // exactly them (the view is row-major) and the result has X's shape with those dims 1.
  static std::optional<std::vector<int64_t>> viewAxes(const Mean& mean, const std::vector<int64_t>& shape,
                                                      const RuleContext& context, MatchFailure* why) {
    const std::optional<std::vector<int64_t>> view = context.knownShape(*mean.nodes.front()->output(0));
    const std::optional<std::vector<int64_t>> back = context.knownShape(*mean.output);
    auto known = [](const std::vector<int64_t>& dims) {
      return std::find(dims.begin(), dims.end(), analysis::kUnknownDim) == dims.end();
    };
    if (!view || !back || !known(*view) || !known(*back) || !known(shape)) {
      *why = {reason::kRankUnknown, "the shapes around " + describe(*mean.reduce) + " are not all known"};
      return std::nullopt;
    }
    if (view->size() >= 3) {
      const int64_t pooled = checkedElementCount(std::vector<int64_t>(view->begin() + 2, view->end())).value_or(-1);
      int64_t trailing = 1;
      for (std::size_t k = 1; k <= shape.size(); ++k) {
        trailing *= shape[shape.size() - k];
        if (trailing != pooled) continue;
        std::vector<int64_t> expected(shape.begin(), shape.end() - static_cast<std::ptrdiff_t>(k));
        expected.resize(shape.size(), 1);
        if (*back != expected) continue;
        std::vector<int64_t> axes;
        for (std::size_t axis = shape.size() - k; axis < shape.size(); ++axis) axes.push_back(static_cast<int64_t>(axis));
        return axes;
      }
    }
    *why = {reason::kNotANormChain, describe(*mean.reduce) + " averages " + formatDims(*view) + ", a view of " +
                                        formatDims(shape) + " whose pooled dims are not its trailing axes reshaped back"};
    return std::nullopt;
  }

  // The axes a keepdims ReduceMean reduces, non-negative and sorted; all axes when it names none.
  static std::optional<std::vector<int64_t>> reducedAxes(const Node& mean, int64_t rank, const RuleContext& context,
                                                         MatchFailure* why) {
    if (mean.attributeInt("keepdims", 1) != 1) {
      *why = {reason::kNotANormChain, describe(mean) + " drops the reduced axes (keepdims=0)"};
      return std::nullopt;
    }
    std::vector<int64_t> axes;
    const int64_t axesInputOpset = mean.isOnnxOp("ReduceSum") ? kReduceSumAxesInputOpset : kReduceMeanAxesInputOpset;
    if (context.opset() < axesInputOpset) {
      axes = mean.attributeInts("axes");
    } else if (const Value* axesInput = mean.input(1)) {
      MatchFailure notIntegers;
      std::optional<std::vector<int64_t>> given = context.integersOf(axesInput, &notIntegers);
      if (!given) {
        *why = notIntegers.code == reason::kUnsupportedType
                   ? notIntegers
                   : MatchFailure{reason::kOperandNotConstant, "the axes of " + describe(mean) + " are not constant"};
        return std::nullopt;
      }
      axes = std::move(*given);
    }
    if (axes.empty()) {
      if (context.opset() >= axesInputOpset && mean.attributeInt("noop_with_empty_axes", 0) != 0) {
        *why = {reason::kNotANormChain, describe(mean) + " reduces nothing (noop_with_empty_axes)"};
        return std::nullopt;
      }
      for (int64_t axis = 0; axis < rank; ++axis) axes.push_back(axis);
    }
    for (int64_t& axis : axes) {
      if (axis < -rank || axis >= rank) {
        *why = {reason::kNotANormChain, describe(mean) + " reduces axis " + std::to_string(axis) +
                                            ", outside a rank-" + std::to_string(rank) + " value"};
        return std::nullopt;
      }
      if (axis < 0) axis += rank;
    }
    std::sort(axes.begin(), axes.end());
    axes.erase(std::unique(axes.begin(), axes.end()), axes.end());
    return axes;
  }

  // gamma or beta: X's type, broadcasting only along the normalized axes; expanded to the normalized dims unless it
  // has them already.
  static bool readParam(const Value* value, const NormChain& chain, const std::string& role, const std::string& where,
                        const RuleContext& context, AffineParam* param, MatchFailure* why) {
    const Tensor* tensor = context.constantOf(value);
    if (tensor->dataType() != chain.type) {
      *why = {reason::kUnsupportedType, "the " + role + " '" + value->name() + "' of the norm at " + where + " is " +
                                            dataTypeName(tensor->dataType()) + ", its input " +
                                            dataTypeName(chain.type)};
      return false;
    }
    const std::vector<int64_t> dims = tensor->dims();
    const auto k = static_cast<int64_t>(chain.normalizedDims.size());
    const auto rank = static_cast<int64_t>(dims.size());
    bool fits = rank <= chain.rank;
    std::vector<int64_t> aligned(static_cast<std::size_t>(k), 1);  // the param's dims over the normalized axes
    for (int64_t i = 0; i < rank && fits; ++i) {
      const int64_t dim = dims[static_cast<std::size_t>(rank - 1 - i)];
      if (i >= k) {
        fits = dim == 1;
      } else {
        const int64_t normalized = chain.normalizedDims[static_cast<std::size_t>(k - 1 - i)];
        fits = dim == 1 || dim == normalized;
        aligned[static_cast<std::size_t>(k - 1 - i)] = dim;
      }
    }
    if (!fits) {
      *why = {reason::kParamShapeMismatch, "the " + role + " '" + value->name() + "' of the norm at " + where +
                                               " has dims " + formatDims(dims) + ", which do not broadcast only along "
                                               "the normalized dims " + formatDims(chain.normalizedDims)};
      return false;
    }
    param->value = value;
    param->usedAsIs = dims == chain.normalizedDims;
    if (param->usedAsIs) return true;
    if (!paramConstantFits(chain, role, where, context, why)) return false;
    param->expanded = broadcastTo(tensor->toDoubles(), aligned, chain.normalizedDims);
    return true;
  }

  // A scale or bias the fused op cannot read as it is gets written as a new constant of the normalized dims. Those
  // come from shapes, which a file may declare without any data behind them: the constant stays within
  // --max-constant-size, as constant evaluation does.
  static bool paramConstantFits(const NormChain& chain, const std::string& role, const std::string& where,
                                const RuleContext& context, MatchFailure* why) {
    const std::optional<int64_t> bytes = checkedByteSize(chain.type, chain.normalizedDims);
    if (bytes && *bytes <= context.options().maxConstantBytes) return true;
    *why = {reason::kConstantTooLarge, "the " + role + " of the norm at " + where +
                                           " would be written as a constant of dims " +
                                           formatDims(chain.normalizedDims) + ", more than --max-constant-size (" +
                                           std::to_string(context.options().maxConstantBytes) + " bytes)"};
    return false;
  }

  // `values` of dims `from` (the same rank as `to`, each dim 1 or to's) repeated along its size-1 dims.
  static std::vector<double> broadcastTo(const std::vector<double>& values, const std::vector<int64_t>& from,
                                         const std::vector<int64_t>& to) {
    const std::size_t rank = to.size();
    std::vector<int64_t> strides(rank, 0);
    int64_t stride = 1;
    for (std::size_t i = rank; i-- > 0;) {
      strides[i] = from[i] == 1 ? 0 : stride;
      stride *= from[i];
    }
    std::vector<double> out(static_cast<std::size_t>(checkedElementCount(to).value_or(0)));
    std::vector<int64_t> index(rank, 0);
    for (double& element : out) {
      int64_t source = 0;
      for (std::size_t i = 0; i < rank; ++i) source += index[i] * strides[i];
      element = values[static_cast<std::size_t>(source)];
      for (std::size_t i = rank; i-- > 0;) {
        if (++index[i] < to[i]) break;
        index[i] = 0;
      }
    }
    return out;
  }
};

}  // namespace

std::unique_ptr<Rule> makeFuseNormalization() { return std::make_unique<FuseNormalization>(); }

}  // namespace bnfold::rules
