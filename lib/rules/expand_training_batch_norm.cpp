// Before:     Y, running_mean?, running_var?, saved_mean?, saved_var? = BatchNormalization(X, scale, B, mean, var)
//             in training mode (opset 14/15 training_mode=1; 7/9 optional outputs; 1/6 is_test=0; empty mean/var)
// After:      batch_mean = ReduceMean(X)            over every axis but 1 (keepdims; for [N, C] input: axis 0)
//             centered   = Sub(X, batch_mean)
//             batch_var  = ReduceMean(Mul(centered, centered))
//             std        = Sqrt(Add(batch_var, epsilon))
//             Y          = Add(Mul(Div(centered, std), scale_c), B_c)          scale_c, B_c: [C, 1, ...]
//             running_mean = Add(Mul(mean, momentum), Mul(Squeeze(batch_mean), 1 - momentum))   likewise running_var
//             saved_mean = Squeeze(batch_mean), saved_var = Squeeze(Reciprocal(std))   (opsets 1-13, see docs)
// Conditions: training mode; spatial (every opset but 1/6/7 with spatial=0); X's rank and element type known
//             (float, double or float16); scale/B constant 1-D [C] or computed at run time; running outputs read
//             only when mean/var are not empty. Only the outputs something reads are emitted.
// Math:       ONNX training-mode BatchNormalization: population variance (divide by the count), statistics in the
//             input's type, running = input * momentum + current * (1 - momentum). Ops and constants are emitted
//             in the form valid at the model's opset: numpy broadcasting from opset 7, legacy `broadcast`/`axis`
//             attributes before; ReduceMean/Squeeze/Unsqueeze axes as attribute or input (opset_emit.h).

#include <optional>

#include "batch_norm.h"
#include "bnfold/rewrite/rewriter.h"
#include "opset_emit.h"
#include "rules.h"
#include "rewrite/understood_ops.h"
#include "analysis/value_shape.h"
#include "rewrite/op_versions.h"

namespace bnfold::rules {
namespace {

// BatchNormalization output slots.
enum BatchNormOutput { kY = 0, kRunningMean = 1, kRunningVar = 2, kSavedMean = 3, kSavedVar = 4, kOutputSlots = 5 };


DataType elementTypeOf(const Value* value) {
  return value ? analysis::knownElementType(*value).value_or(DataType::Undefined) : DataType::Undefined;
}

// X's element type: known for X or Y (declared, or from the layer computing X), or, up to opset 14 where every
// input shares T, any parameter's.
DataType inputElementType(const Node& bn, int64_t opset) {
  for (const Value* value : {bn.input(0), bn.output(kY)})
    if (const DataType type = elementTypeOf(value); type != DataType::Undefined) return type;
  if (opset < kBatchNormMixedTypesOpset) {
    for (std::size_t slot = 1; slot <= 4; ++slot)
      if (const DataType type = elementTypeOf(bn.input(slot)); type != DataType::Undefined) return type;
  }
  return DataType::Undefined;
}

// X's rank, known for X or Y (declared, or from the layer computing X).
std::optional<int64_t> inputRank(const Node& bn, const RuleContext& context) {
  for (const Value* value : {bn.input(0), bn.output(kY)})
    if (value)
      if (auto shape = context.knownShape(*value)) return static_cast<int64_t>(shape->size());
  return std::nullopt;
}

// The element type shared by two inputs (scale/B or mean/var), Undefined when unknown or when they differ.
DataType sharedElementType(const Node& bn, std::size_t first, std::size_t second) {
  const DataType a = elementTypeOf(bn.input(first));
  const DataType b = elementTypeOf(bn.input(second));
  return a == b ? a : DataType::Undefined;
}

bool isExpandableType(DataType type) {
  return type == DataType::Float || type == DataType::Double || type == DataType::Float16;
}

bool isRead(const Value* value) { return value && (value->hasUses() || value->isGraphOutput()); }

struct TrainingBatchNormMatch : Match {
  const Node* bn = nullptr;
  BatchNormForm form;
  int64_t rank = 0;
  DataType dataType = DataType::Undefined;        // T: X and Y
  DataType paramType = DataType::Undefined;       // T1: scale and B
  DataType statisticsType = DataType::Undefined;  // T2: mean, var and the running outputs
  const Tensor* constantScale = nullptr;          // null: scale is read at run time
  const Tensor* constantBias = nullptr;
  bool read[kOutputSlots] = {};
};

class ExpandTrainingBatchNorm : public Rule {
 public:
  const char* name() const override { return "train-bn-expand"; }
  const char* summary() const override {
    return "Expand training-mode BatchNormalization into ReduceMean/Sub/Mul/Sqrt/Div/Add (batch statistics)";
  }
  std::vector<std::string> rootOps() const override { return {"BatchNormalization"}; }
  std::vector<OpVersions> opVersions() const override {
    return {kBatchNormalization, kReduceMean, kSub, kMul, kAdd, kDiv, kSqrt,
            kReciprocal, kCast, kIdentity, kSqueeze, kUnsqueeze, kReshape};
  }

  MatchResult match(const Node& bn, const RuleContext& context) const override {
    auto found = std::make_unique<TrainingBatchNormMatch>();
    TrainingBatchNormMatch& m = *found;
    m.bn = &bn;
    const int64_t opset = context.opset();
    m.form = readBatchNormForm(bn, opset);
    if (!m.form.training)
      return MatchResult::failure(reason::kNotTrainingMode, "inference-mode BatchNormalization: nothing to expand");
    if (!m.form.spatial)
      return MatchResult::failure(reason::kNonSpatialTraining,
                                  "spatial=0 in training mode (statistics per element, not per channel) is not "
                                  "supported");
    for (std::size_t slot = 0; slot < 3; ++slot)
      if (!bn.input(slot))
        return MatchResult::failure(reason::kMissingInput, "input " + std::to_string(slot) + " is omitted");
    const std::size_t outputSlots = opset < kBatchNormTrainingModeOpset ? kOutputSlots : 3;
    for (std::size_t slot = 0; slot < kOutputSlots; ++slot) {
      if (!isRead(bn.output(slot))) continue;
      if (slot >= outputSlots)
        return MatchResult::failure(reason::kUnexpectedOutput, "output " + std::to_string(slot) +
                                                             " does not exist at opset " + std::to_string(opset));
      m.read[slot] = true;
    }
    const bool runningRead = m.read[kRunningMean] || m.read[kRunningVar];
    if (runningRead && (!bn.input(3) || !bn.input(4)))
      return MatchResult::failure(reason::kMissingInput, "running statistics are read but mean or var is omitted");
    if (runningRead && m.form.emptyStatistics)
      return MatchResult::failure(reason::kRunningStatsUndefined,
                                  "mean/var are empty, so the running statistics it outputs are undefined, yet they "
                                  "are read");

    const std::optional<int64_t> rank = inputRank(bn, context);
    if (!rank)
      return MatchResult::failure(reason::kRankUnknown, "the rank of input '" + bn.input(0)->name() +
                                                      "' is not known (not declared, and no Conv/Gemm computing it "
                                                      "implies it), so the reduction axes are unknown");
    if (*rank < 2)
      return MatchResult::failure(reason::kRankTooLow, "input '" + bn.input(0)->name() + "' has rank " + std::to_string(*rank) +
                                                  "; BatchNormalization needs [N, C, ...]");
    m.rank = *rank;

    m.dataType = inputElementType(bn, opset);
    if (m.dataType == DataType::Undefined)
      return MatchResult::failure(reason::kTypeUnknown,
                                  "the element type of input '" + bn.input(0)->name() + "' is not known");
    // scale/B are read only for Y, mean/var only for the running statistics.
    m.paramType = m.dataType;
    if (opset >= kBatchNormMixedTypesOpset && m.read[kY]) {
      m.paramType = sharedElementType(bn, 1, 2);
      if (m.paramType == DataType::Undefined)
        return MatchResult::failure(reason::kTypeUnknown, "the element type of scale and B is not known (or differs)");
    }
    m.statisticsType = m.dataType;
    if (opset >= kBatchNormMixedTypesOpset && runningRead) {
      m.statisticsType = sharedElementType(bn, 3, 4);
      if (m.statisticsType == DataType::Undefined)
        return MatchResult::failure(reason::kTypeUnknown, "the element type of mean and var is not known (or differs)");
    }
    for (DataType type : {m.dataType, m.paramType, m.statisticsType})
      if (!isExpandableType(type))
        return MatchResult::failure(reason::kUnsupportedType, dataTypeName(type) +
                                                            " BatchNormalization is not expanded (float, double and "
                                                            "float16 are)");

    // Constant 1-D scale/B become [C, 1, ...] initializers; anything else is reshaped at run time.
    m.constantScale = context.constantOf(bn.input(1));
    m.constantBias = context.constantOf(bn.input(2));
    for (const Tensor* param : {m.constantScale, m.constantBias})
      if (param && param->rank() != 1)
        return MatchResult::failure(reason::kParamShapeMismatch, "constant '" + param->name() + "' has rank " +
                                                           std::to_string(param->rank()) + "; scale and B are [C]");
    if (m.constantScale && m.constantBias && m.constantScale->elementCount() != m.constantBias->elementCount())
      return MatchResult::failure(reason::kParamShapeMismatch, "scale and B have different lengths");
    return MatchResult::success(std::move(found));
  }

  void rewrite(Match& base, Rewriter& rewriter) const override;
};

// Emits the expansion of one BatchNormalization and remembers the names of the nodes it creates.
class Expansion {
 public:
  Expansion(Rewriter& rewriter, const TrainingBatchNormMatch& m)
      : rewriter_(rewriter),
        m_(m),
        bn_(*m.bn),
        opset_(modelOpset(rewriter)),
        legacyBroadcast_(opset_ < kNumpyBroadcastOpset),
        names_{bn_.name(), bn_.output(kY) ? bn_.output(kY)->name() : bn_.name()} {
    reducedAxes_.push_back(0);
    for (int64_t axis = 2; axis < m_.rank; ++axis) reducedAxes_.push_back(axis);
  }

  void run();

 private:
  Value* note(Value* value) {
    emitted_.push_back(value->producer()->name());
    return value;
  }
  // A binary op. With legacy broadcasting the right operand has the left one's shape, is a scalar, or is a [C]
  // vector aligned with axis 1 (Channel); numpy broadcasting needs no attributes.
  enum class RightShape { SameShape, Scalar, Channel };
  Value* binary(const std::string& op, const Value* left, const Value* right, RightShape shape,
                const std::string& step) {
    std::vector<onnx::AttributeProto> attributes;
    if (shape != RightShape::SameShape)
      attributes = broadcastAttributes(opset_, shape == RightShape::Channel ? std::optional<int64_t>(1) : std::nullopt);
    return note(
        rewriter_.createNode(&bn_, op, {left, right}, {names_.value(step)}, names_.node(step), std::move(attributes))
            ->output(0));
  }
  Value* unary(const std::string& op, const Value* input, const std::string& step,
               std::vector<onnx::AttributeProto> attributes = {}) {
    return note(rewriter_.createNode(&bn_, op, {input}, {names_.value(step)}, names_.node(step), std::move(attributes))
                    ->output(0));
  }
  Value* scalar(double value, DataType type, const std::string& step) {
    return rewriter_.addInitializer(*bn_.graph(), Tensor::fromDoubles("", type, {}, {value}), names_.value(step));
  }
  Value* castTo(Value* value, DataType from, DataType to, const std::string& step) {
    if (from == to) return value;
    return unary("Cast", value, step, {intAttribute("to", static_cast<int64_t>(to))});
  }
  // Per-channel [C] statistics from a reduced tensor: kept dims are squeezed at numpy-broadcast opsets; before,
  // the reduction already gave [C].
  Value* perChannel(Value* reduced, const std::string& step) {
    if (legacyBroadcast_) return reduced;
    return note(emitSqueeze(rewriter_, &bn_, reduced, reducedAxes_, names_, step));
  }
  Value* channelOperand(std::size_t slot, const Tensor* constant, const std::string& step);
  Value* runningUpdate(std::size_t inputSlot, Value* current, const std::string& step);

  Rewriter& rewriter_;
  const TrainingBatchNormMatch& m_;
  const Node& bn_;
  const int64_t opset_;
  const bool legacyBroadcast_;
  const EmitNames names_;
  std::vector<int64_t> reducedAxes_;
  std::vector<std::string> emitted_;
};

// scale or B in a shape that broadcasts over axis 1 of X, in X's type.
Value* Expansion::channelOperand(std::size_t slot, const Tensor* constant, const std::string& step) {
  Value* param = bn_.input(slot);
  // Legacy broadcasting aligns the [C] vector at axis=1; numpy broadcasting does so for [N, C] input.
  const bool vectorBroadcasts = legacyBroadcast_ || m_.rank == 2;
  if (vectorBroadcasts && m_.paramType == m_.dataType) return param;
  std::vector<int64_t> channelDims{-1};
  for (int64_t axis = 2; axis < m_.rank; ++axis) channelDims.push_back(1);
  if (constant) {
    channelDims[0] = constant->elementCount();
    // A new initializer: the original may be read elsewhere and must not change.
    return rewriter_.addInitializer(*bn_.graph(),
                                    Tensor::fromDoubles("", m_.dataType, channelDims, constant->toDoubles()),
                                    param->name() + "_channels");
  }
  Value* typed = castTo(param, m_.paramType, m_.dataType, step + "_cast");
  if (vectorBroadcasts) return typed;
  std::vector<int64_t> newAxes;
  for (int64_t axis = 1; axis + 1 < m_.rank; ++axis) newAxes.push_back(axis);
  return note(emitUnsqueeze(rewriter_, &bn_, typed, newAxes, names_, step));
}

// input * momentum + current * (1 - momentum), in the statistics' type like the original op's output.
Value* Expansion::runningUpdate(std::size_t inputSlot, Value* current, const std::string& step) {
  const DataType type = m_.statisticsType;
  const double momentum = m_.form.momentum;
  Value* typedCurrent = castTo(current, m_.dataType, type, step + "_cast");
  Value* kept = binary("Mul", bn_.input(inputSlot), scalar(momentum, type, step + "_momentum"), RightShape::Scalar,
                       step + "_kept");
  Value* added =
      binary("Mul", typedCurrent, scalar(1.0 - momentum, type, step + "_rate"), RightShape::Scalar, step + "_added");
  return binary("Add", kept, added, RightShape::SameShape, step);
}

void Expansion::run() {
  const bool* read = m_.read;
  const bool needVariance = read[kY] || read[kRunningVar] || read[kSavedVar];
  const bool needStd = read[kY] || read[kSavedVar];
  const bool keepDims = !legacyBroadcast_;
  Value* x = bn_.input(0);
  Value* outputs[kOutputSlots] = {};

  if (read[kY] || read[kRunningMean] || read[kRunningVar] || read[kSavedMean] || read[kSavedVar]) {
    Value* mean = note(emitReduceMean(rewriter_, &bn_, x, reducedAxes_, keepDims, names_, "batch_mean"));
    Value* centered = nullptr;
    Value* variance = nullptr;
    Value* stdDev = nullptr;
    if (needVariance) {
      centered = binary("Sub", x, mean, RightShape::Channel, "centered");
      Value* squared = binary("Mul", centered, centered, RightShape::SameShape, "squared");
      variance = note(emitReduceMean(rewriter_, &bn_, squared, reducedAxes_, keepDims, names_, "batch_var"));
    }
    if (needStd) {
      Value* shifted =
          binary("Add", variance, scalar(m_.form.epsilon, m_.dataType, "epsilon"), RightShape::Scalar, "var_eps");
      stdDev = unary("Sqrt", shifted, "std");
    }
    if (read[kY]) {
      Value* normalized = binary("Div", centered, stdDev, RightShape::Channel, "normalized");
      Value* scaled =
          binary("Mul", normalized, channelOperand(1, m_.constantScale, "scale"), RightShape::Channel, "scaled");
      outputs[kY] = binary("Add", scaled, channelOperand(2, m_.constantBias, "bias"), RightShape::Channel, "output");
    }
    if (read[kRunningMean]) outputs[kRunningMean] = runningUpdate(3, perChannel(mean, "current_mean"), "running_mean");
    if (read[kRunningVar]) outputs[kRunningVar] = runningUpdate(4, perChannel(variance, "current_var"), "running_var");
    // An output takes over a BN output's name, so it must be a value of its own (the legacy mean is read by Sub).
    if (read[kSavedMean])
      outputs[kSavedMean] = legacyBroadcast_ ? unary("Identity", mean, "saved_mean") : perChannel(mean, "saved_mean");
    if (read[kSavedVar]) outputs[kSavedVar] = perChannel(unary("Reciprocal", stdDev, "inv_std"), "saved_var");
  }

  nlohmann::json produced = nlohmann::json::array(), dropped = nlohmann::json::array();
  for (std::size_t slot = 0; slot < kOutputSlots; ++slot) {
    const Value* original = bn_.output(slot);
    if (!original) continue;
    (outputs[slot] ? produced : dropped).push_back(original->name());
  }
  nlohmann::json entry = {{"node", bn_.name()},          {"form", m_.form.formName}, {"cause", m_.form.trainingCause},
                          {"emitted", emitted_},         {"outputs", produced},      {"dropped_outputs", dropped},
                          {"graph", bn_.graph()->name()}};
  // Readers and graph outputs move to the new values under the old names; the BN goes with its last read output.
  bool replacedAny = false;
  for (std::size_t slot = 0; slot < kOutputSlots; ++slot) {
    if (!outputs[slot]) continue;
    rewriter_.replaceValueKeepingName(bn_.output(slot), outputs[slot]);
    replacedAny = true;
  }
  // Nothing read its outputs: the node computed nothing anyone sees.
  if (!replacedAny) rewriter_.eraseNode(&bn_);
  rewriter_.record("expanded", std::move(entry));
}

void ExpandTrainingBatchNorm::rewrite(Match& base, Rewriter& rewriter) const {
  Expansion(rewriter, static_cast<TrainingBatchNormMatch&>(base)).run();
}

}  // namespace

std::unique_ptr<Rule> makeExpandTrainingBatchNorm() { return std::make_unique<ExpandTrainingBatchNorm>(); }

}  // namespace bnfold::rules
