#include "interpreter.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <unordered_map>

#include <Eigen/Core>

#include "analysis/op_forms.h"
#include "analysis/shape_ops.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace bnfold::verify {
namespace {

std::string describe(const RegionNode& node) { return node.opType + " '" + node.name + "'"; }

// ---- element conversion ----

template <typename Source>
void appendElements(const std::string& bytes, std::vector<double>& out) {
  const std::size_t count = bytes.size() / sizeof(Source);
  out.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    Source value;
    std::memcpy(&value, bytes.data() + i * sizeof(Source), sizeof(Source));
    out.push_back(static_cast<double>(value));
  }
}

std::vector<double> elementsAsDoubles(DataType type, const std::string& bytes) {
  std::vector<double> out;
  switch (type) {
    case DataType::Float: appendElements<float>(bytes, out); break;
    case DataType::Double: appendElements<double>(bytes, out); break;
    case DataType::Float16: appendElements<Eigen::half>(bytes, out); break;
    case DataType::BFloat16: appendElements<Eigen::bfloat16>(bytes, out); break;
    case DataType::Int8: appendElements<int8_t>(bytes, out); break;
    case DataType::Int16: appendElements<int16_t>(bytes, out); break;
    case DataType::Int32: appendElements<int32_t>(bytes, out); break;
    case DataType::Int64: appendElements<int64_t>(bytes, out); break;
    case DataType::UInt8: appendElements<uint8_t>(bytes, out); break;
    case DataType::UInt16: appendElements<uint16_t>(bytes, out); break;
    case DataType::UInt32: appendElements<uint32_t>(bytes, out); break;
    case DataType::UInt64: appendElements<uint64_t>(bytes, out); break;
    case DataType::Bool: appendElements<uint8_t>(bytes, out); break;
    default: throw EvaluationError("element type " + dataTypeName(type) + " is not evaluated");
  }
  return out;
}

int64_t integerFrom(DataType type, double v) {
  if (std::isnan(v)) return 0;
  const double truncated = std::trunc(v);
  if (type == DataType::Bool) return v != 0.0;
  if (truncated >= 9.2e18 || truncated <= -9.2e18) return 0;
  const auto wide = static_cast<int64_t>(truncated);
  switch (type) {
    case DataType::Int8: return static_cast<int8_t>(wide);
    case DataType::Int16: return static_cast<int16_t>(wide);
    case DataType::Int32: return static_cast<int32_t>(wide);
    case DataType::UInt8: return static_cast<uint8_t>(wide);
    case DataType::UInt16: return static_cast<uint16_t>(wide);
    case DataType::UInt32: return static_cast<uint32_t>(wide);
    default: return wide;
  }
}

template <typename T>
Operand<T> fromDoubles(DataType type, Dims dims, const std::vector<double>& values) {
  Operand<T> out;
  out.type = type;
  if (isFloatingPoint(type)) {
    out.real.dims = std::move(dims);
    out.real.data.assign(values.begin(), values.end());
  } else {
    out.integer.dims = std::move(dims);
    out.integer.data.reserve(values.size());
    for (double v : values) out.integer.data.push_back(integerFrom(type, v));
  }
  return out;
}

// Transparent huge pages for the whole 2 MiB pages inside [data, data + bytes), where the kernel offers them.
void adviseHugePages([[maybe_unused]] void* data, [[maybe_unused]] std::size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::uintptr_t kHugePage = std::uintptr_t{2} << 20;
  const auto begin = (reinterpret_cast<std::uintptr_t>(data) + kHugePage - 1) & ~(kHugePage - 1);
  const auto end = (reinterpret_cast<std::uintptr_t>(data) + bytes) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // advice only: errors are harmless
#endif
}

// ---- evaluation ----

template <typename T>
class Evaluator {
 public:
  Evaluator(const Region& region, std::map<std::string, Operand<T>>& values, const InterpreterOptions& options)
      : region_(region), values_(values), options_(options) {}

  void run() {
    for (const RegionNode& node : region_.nodes) {
      try {
        evaluate(node);
      } catch (const std::invalid_argument& e) {
        throw EvaluationError(describe(node) + ": " + e.what());
      }
      for (const SampledValue& sampled : options_.sampled)
        if (std::find(node.outputs.begin(), node.outputs.end(), sampled.name) != node.outputs.end()) draw(sampled);
    }
  }

 private:
  void draw(const SampledValue& sampled) {
    auto it = values_.find(sampled.name);
    if (it == values_.end() || it->second.isInteger())
      throw EvaluationError("'" + sampled.name + "' to be sampled is not a floating value of the region");
    Array<T>& array = it->second.real;
    const auto axis = static_cast<std::size_t>(sampled.channelAxis);
    if (sampled.channelAxis < 0 || axis >= array.dims.size() ||
        array.dims[axis] != static_cast<int64_t>(sampled.lowerBound.size()))
      throw EvaluationError("'" + sampled.name + "' does not have " + std::to_string(sampled.lowerBound.size()) +
                            " channels on axis " + std::to_string(sampled.channelAxis));
    int64_t inner = 1;
    for (std::size_t d = axis + 1; d < array.dims.size(); ++d) inner *= array.dims[d];
    const auto channels = static_cast<std::size_t>(array.dims[axis]);
    std::mt19937_64 generator(sampled.seed);
    std::uniform_real_distribution<double> distribution(0.0, sampled.width);
    for (std::size_t e = 0; e < array.data.size(); ++e) {
      const std::size_t channel = (e / static_cast<std::size_t>(inner)) % channels;
      array.data[e] = static_cast<T>(sampled.lowerBound[channel] + distribution(generator));
    }
  }

  const Operand<T>* optionalInput(const RegionNode& node, std::size_t slot) {
    if (slot >= node.inputs.size() || node.inputs[slot].empty()) return nullptr;
    auto it = values_.find(node.inputs[slot]);
    if (it == values_.end()) throw EvaluationError(describe(node) + ": input '" + node.inputs[slot] + "' has no value");
    return &it->second;
  }
  const Operand<T>& input(const RegionNode& node, std::size_t slot) {
    const Operand<T>* operand = optionalInput(node, slot);
    if (!operand) throw EvaluationError(describe(node) + ": input " + std::to_string(slot) + " is missing");
    return *operand;
  }
  const Array<T>& real(const RegionNode& node, std::size_t slot) {
    const Operand<T>& operand = input(node, slot);
    if (operand.isInteger()) throw EvaluationError(describe(node) + ": input " + std::to_string(slot) + " is not floating");
    return operand.real;
  }
  std::vector<int64_t> integers(const RegionNode& node, std::size_t slot) {
    const Operand<T>& operand = input(node, slot);
    if (!operand.isInteger()) throw EvaluationError(describe(node) + ": input " + std::to_string(slot) + " is not integer");
    return operand.integer.data;
  }
  void setOutput(const RegionNode& node, std::size_t slot, Operand<T> value) {
    if (slot < node.outputs.size() && !node.outputs[slot].empty()) values_[node.outputs[slot]] = std::move(value);
  }
  void setReal(const RegionNode& node, std::size_t slot, DataType type, Array<T> value) {
    Operand<T> out;
    out.type = type;
    out.real = std::move(value);
    setOutput(node, slot, std::move(out));
  }

  // Same-kind data movement on either representation.
  template <typename F>
  Operand<T> moveData(const Operand<T>& x, F&& f) {
    Operand<T> out;
    out.type = x.type;
    if (x.isInteger()) out.integer = f(x.integer);
    else out.real = f(x.real);
    return out;
  }

  // Legacy (opset < 7) broadcasting: with broadcast=1, B's dims line up with A's from `axis` (default: the end).
  template <typename A>
  A alignLegacy(const RegionNode& node, const A& a, A b) {
    if (region_.opset >= 7 || intAttribute(node, "broadcast", 0) == 0) return b;
    const auto rankA = static_cast<int64_t>(a.dims.size()), rankB = static_cast<int64_t>(b.dims.size());
    int64_t axis = intAttribute(node, "axis", rankA - rankB);
    if (axis < 0) axis += rankA;
    if (axis < 0 || axis + rankB > rankA) throw EvaluationError(describe(node) + ": broadcast axis out of range");
    Dims dims(static_cast<std::size_t>(axis), 1);
    dims.insert(dims.end(), b.dims.begin(), b.dims.end());
    dims.resize(a.dims.size(), 1);
    b.dims = dims;
    return b;
  }

  void evaluateBinary(const RegionNode& node, BinaryOp op) {
    const Operand<T>& a = input(node, 0);
    // Max and Min take any number of inputs.
    Operand<T> result = a;
    for (std::size_t slot = 1; slot < node.inputs.size(); ++slot) {
      const Operand<T>& b = input(node, slot);
      if (result.isInteger() != b.isInteger()) {
        if (op != BinaryOp::Pow) throw EvaluationError(describe(node) + ": operands of different kinds");
        // Pow with a float base and an integer exponent (or the reverse): computed in the base's type.
        if (result.isInteger()) throw EvaluationError(describe(node) + ": integer base with a float exponent");
        Array<T> exponent{b.integer.dims, std::vector<T>(b.integer.data.begin(), b.integer.data.end())};
        result.real = binary(op, result.real, alignLegacy(node, result.real, exponent));
        continue;
      }
      if (result.isInteger()) result.integer = binary(op, result.integer, alignLegacy(node, result.integer, b.integer));
      else result.real = binary(op, result.real, alignLegacy(node, result.real, b.real));
    }
    if (node.inputs.size() == 1 && op != BinaryOp::Max && op != BinaryOp::Min)
      throw EvaluationError(describe(node) + ": needs two inputs");
    setOutput(node, 0, std::move(result));
  }

  void evaluateUnary(const RegionNode& node, UnaryOp op) {
    const Operand<T>& x = input(node, 0);
    if (x.isInteger()) {
      if (op == UnaryOp::Identity || op == UnaryOp::Neg) {
        Operand<T> out = x;
        if (op == UnaryOp::Neg)
          for (int64_t& v : out.integer.data) v = static_cast<int64_t>(0ULL - static_cast<uint64_t>(v));
        setOutput(node, 0, std::move(out));
        return;
      }
      throw EvaluationError(describe(node) + ": integer input");
    }
    setReal(node, 0, x.type, unary(op, x.real));
  }

  ConvAttributes convAttributes(const RegionNode& node) {
    ConvAttributes a;
    a.kernelShape = intsAttribute(node, "kernel_shape");
    a.strides = intsAttribute(node, "strides");
    a.dilations = intsAttribute(node, "dilations");
    a.pads = intsAttribute(node, "pads");
    a.outputPadding = intsAttribute(node, "output_padding");
    a.outputShape = intsAttribute(node, "output_shape");
    a.group = intAttribute(node, "group", 1);
    a.autoPad = stringAttribute(node, "auto_pad", "NOTSET");
    return a;
  }

  const Array<T>* optionalReal(const RegionNode& node, std::size_t slot) {
    const Operand<T>* operand = optionalInput(node, slot);
    if (!operand) return nullptr;
    if (operand->isInteger()) throw EvaluationError(describe(node) + ": input " + std::to_string(slot) + " is not floating");
    return &operand->real;
  }

  bool batchNormTraining(const RegionNode& node) {
    const auto emptyInput = [&](std::size_t slot) {
      const Operand<T>* operand = optionalInput(node, slot);
      return operand && !operand->isInteger() && operand->real.data.empty();
    };
    bool training;
    if (region_.opset < 7) {
      training = intAttribute(node, "is_test", 0) == 0;  // is_test defaults to 0
    } else if (region_.opset < 14) {
      training = false;
      for (std::size_t i = 1; i < node.outputs.size(); ++i) training = training || !node.outputs[i].empty();
    } else {
      training = intAttribute(node, "training_mode", 0) != 0;
    }
    return training || emptyInput(3) || emptyInput(4);
  }

  void evaluateBatchNorm(const RegionNode& node) {
    const Operand<T>& x = input(node, 0);
    if (region_.opset < 9 && intAttribute(node, "spatial", 1) == 0) return evaluatePerElementBatchNorm(node);
    const Array<T>& scale = real(node, 1);
    const Array<T>& bias = real(node, 2);
    const Array<T>& mean = real(node, 3);
    const Array<T>& var = real(node, 4);
    const double epsilon = floatAttribute(node, "epsilon", 1e-5);
    const double momentum = floatAttribute(node, "momentum", 0.9);
    if (x.isInteger()) throw EvaluationError(describe(node) + ": integer input");
    if (!batchNormTraining(node) || options_.batchNormAsInference) {
      setReal(node, 0, x.type, batchNormInference(x.real, scale, bias, mean, var, epsilon));
      // A frozen BN passes its running statistics through (train-bn-freeze writes Identity nodes for them).
      setReal(node, 1, input(node, 3).type, mean);
      setReal(node, 2, input(node, 4).type, var);
      return;
    }
    BatchNormTraining<T> result;
    if (mean.data.empty() || var.data.empty()) {
      // No running statistics (TensorFlow's FusedBatchNorm form): only the batch statistics matter.
      const Array<T> zeros{scale.dims, std::vector<T>(scale.data.size(), T(0))};
      result = verify::batchNormTraining(x.real, scale, bias, zeros, zeros, epsilon, momentum);
    } else {
      result = verify::batchNormTraining(x.real, scale, bias, mean, var, epsilon, momentum);
    }
    setReal(node, 0, x.type, std::move(result.y));
    setReal(node, 1, scale.dims.empty() ? x.type : input(node, 1).type, std::move(result.runningMean));
    setReal(node, 2, input(node, 1).type, std::move(result.runningVar));
    setReal(node, 3, input(node, 1).type, std::move(result.savedMean));
    setReal(node, 4, input(node, 1).type, std::move(result.savedInvStdDev));
  }

  // spatial=0 (opsets 1-8): one parameter per element of a sample, [C, D1, ...], which numpy broadcasting lines up
  // with the input's trailing dims. Inference mode only.
  void evaluatePerElementBatchNorm(const RegionNode& node) {
    if (batchNormTraining(node) && !options_.batchNormAsInference)
      throw EvaluationError(describe(node) + ": spatial=0 in training mode is not evaluated");
    const Operand<T>& x = input(node, 0);
    const Array<T> epsilon{{}, {static_cast<T>(floatAttribute(node, "epsilon", 1e-5))}};
    const Array<T> deviation = unary(UnaryOp::Sqrt, binary(BinaryOp::Add, real(node, 4), epsilon));
    const Array<T> normalized = binary(BinaryOp::Div, binary(BinaryOp::Sub, x.real, real(node, 3)), deviation);
    setReal(node, 0, x.type, binary(BinaryOp::Add, binary(BinaryOp::Mul, normalized, real(node, 1)), real(node, 2)));
    setReal(node, 1, input(node, 3).type, real(node, 3));
    setReal(node, 2, input(node, 4).type, real(node, 4));
  }

  std::vector<int64_t> axesOf(const RegionNode& node, int64_t inputSinceOpset, std::size_t slot) {
    if (region_.opset >= inputSinceOpset) return optionalInput(node, slot) ? integers(node, slot) : std::vector<int64_t>{};
    return intsAttribute(node, "axes");
  }

  void evaluateReshape(const RegionNode& node) {
    const std::vector<int64_t> shape =
        region_.opset >= kReshapeShapeInputOpset ? integers(node, 1) : intsAttribute(node, "shape");
    reshaped(node, input(node, 0), analysis::reshapeShape(input(node, 0).dims(), shape,
                                                          intAttribute(node, "allowzero", 0) != 0));
  }

  /// Input 0 with the dims of `shape` (the ops that only change dims).
  void reshaped(const RegionNode& node, const Operand<T>& x, const analysis::OutputShape& shape) {
    if (!shape.ok()) throw EvaluationError(describe(node) + " " + shape.message);
    if (elementCount(shape.dims) != elementCount(x.dims())) throw EvaluationError(describe(node) + ": element count changes");
    Operand<T> out = x;
    (out.isInteger() ? out.integer.dims : out.real.dims) = shape.dims;
    setOutput(node, 0, std::move(out));
  }

  void evaluateSqueeze(const RegionNode& node, bool unsqueeze) {
    const Operand<T>& x = input(node, 0);
    const std::vector<int64_t> axes = axesOf(node, kSqueezeAxesInputOpset, 1);
    reshaped(node, x, unsqueeze ? analysis::unsqueezeShape(x.dims(), axes) : analysis::squeezeShape(x.dims(), axes));
  }

  void evaluateCast(const RegionNode& node) {
    const Operand<T>& x = input(node, 0);
    const auto to = static_cast<DataType>(intAttribute(node, "to", 0));
    if (!isFloatingPoint(to) && to != DataType::Bool && elementSize(to) == 0)
      throw EvaluationError(describe(node) + ": cast to " + dataTypeName(to));
    std::vector<double> values;
    if (x.isInteger()) values.assign(x.integer.data.begin(), x.integer.data.end());
    else values.assign(x.real.data.begin(), x.real.data.end());
    if (isFloatingPoint(to))
      for (double& v : values) v = roundedTo(to, v);
    setOutput(node, 0, fromDoubles<T>(to, x.dims(), values));
  }

  void evaluateConstantOfShape(const RegionNode& node) {
    const std::vector<int64_t> shape = integers(node, 0);
    DataType type = DataType::Float;
    double fill = 0.0;
    auto it = node.tensorAttributes.find("value");
    if (it != node.tensorAttributes.end()) {
      const Operand<T> value = readConstant<T>(it->second, nullptr);
      type = value.type;
      if (elementCount(value.dims()) != 1) throw EvaluationError(describe(node) + ": value must hold one element");
      fill = value.isInteger() ? static_cast<double>(value.integer.data[0]) : static_cast<double>(value.real.data[0]);
    }
    const int64_t count = elementCount(shape);
    if (count > (int64_t{1} << 26)) throw EvaluationError(describe(node) + ": result too large to evaluate");
    setOutput(node, 0, fromDoubles<T>(type, shape, std::vector<double>(static_cast<std::size_t>(count), fill)));
  }

  void evaluateSlice(const RegionNode& node) {
    const Operand<T>& x = input(node, 0);
    std::vector<int64_t> starts, ends, axes, steps;
    if (region_.opset < 10) {
      starts = intsAttribute(node, "starts");
      ends = intsAttribute(node, "ends");
      axes = intsAttribute(node, "axes");
    } else {
      starts = integers(node, 1);
      ends = integers(node, 2);
      if (optionalInput(node, 3)) axes = integers(node, 3);
      if (optionalInput(node, 4)) steps = integers(node, 4);
    }
    setOutput(node, 0, moveData(x, [&](const auto& a) { return slice(a, starts, ends, axes, steps); }));
  }

  // stash_type (the type the statistics are computed in): float by default; double keeps our double arithmetic.
  StashRounding stashRounding(const RegionNode& node) {
    switch (static_cast<DataType>(intAttribute(node, "stash_type", static_cast<int64_t>(DataType::Float)))) {
      case DataType::Float: return [](double v) { return roundedTo(DataType::Float, v); };
      case DataType::Float16: return [](double v) { return roundedTo(DataType::Float16, v); };
      case DataType::BFloat16: return [](double v) { return roundedTo(DataType::BFloat16, v); };
      case DataType::Double: return nullptr;
      default: throw EvaluationError(describe(node) + ": stash_type is not a floating type");
    }
  }

  // Clip: bounds as attributes before opset 11, optional scalar inputs from 11.
  void evaluateClip(const RegionNode& node) {
    const Operand<T>& x = input(node, 0);
    double low = -std::numeric_limits<double>::infinity(), high = std::numeric_limits<double>::infinity();
    if (region_.opset < 11) {
      low = floatAttribute(node, "min", -std::numeric_limits<float>::max());
      high = floatAttribute(node, "max", std::numeric_limits<float>::max());
    } else {
      for (std::size_t slot : {std::size_t{1}, std::size_t{2}})
        if (const Operand<T>* bound = optionalInput(node, slot)) {
          if (bound->isInteger() || bound->real.data.size() != 1)
            throw EvaluationError(describe(node) + ": a bound is not one floating value");
          (slot == 1 ? low : high) = static_cast<double>(bound->real.data[0]);
        }
    }
    Array<T> y = x.real;
    for (T& v : y.data) v = static_cast<T>(std::min(std::max(static_cast<double>(v), low), high));
    setReal(node, 0, x.type, std::move(y));
  }

  void evaluateNormalization(const RegionNode& node) {
    const Operand<T>& x = input(node, 0);
    const double epsilon = floatAttribute(node, "epsilon", 1e-5);
    const std::string& op = node.opType;
    if (op == "LayerNormalization") {
      auto result = layerNormalization(real(node, 0), real(node, 1), optionalReal(node, 2), intAttribute(node, "axis", -1),
                                       epsilon, stashRounding(node));
      const auto stashType = static_cast<DataType>(intAttribute(node, "stash_type", static_cast<int64_t>(DataType::Float)));
      setReal(node, 0, x.type, std::move(result.y));
      setReal(node, 1, stashType, std::move(result.mean));
      setReal(node, 2, stashType, std::move(result.invStdDev));
    } else if (op == "RMSNormalization") {
      setReal(node, 0, x.type,
              rmsNormalization(real(node, 0), real(node, 1), intAttribute(node, "axis", -1), epsilon, stashRounding(node)));
    } else if (op == "GroupNormalization") {
      // GroupNormalization-18's scale and bias are per group, -21's per channel (and only -21 has stash_type).
      const bool perChannel = region_.opset >= kGroupNormPerChannelOpset;
      setReal(node, 0, x.type,
              groupNormalization(real(node, 0), real(node, 1), real(node, 2), intAttribute(node, "num_groups", 0), epsilon,
                                 perChannel ? GroupAffine::PerChannel : GroupAffine::PerGroup,
                                 perChannel ? stashRounding(node) : nullptr));
    } else {
      setReal(node, 0, x.type, instanceNormalization(real(node, 0), real(node, 1), real(node, 2), epsilon));
    }
  }

  void evaluate(const RegionNode& node) {
    const std::string& op = node.opType;
    static const std::unordered_map<std::string, BinaryOp> binaryOps = {
        {"Add", BinaryOp::Add}, {"Sub", BinaryOp::Sub}, {"Mul", BinaryOp::Mul}, {"Div", BinaryOp::Div},
        {"Pow", BinaryOp::Pow}, {"Max", BinaryOp::Max}, {"Min", BinaryOp::Min}};
    static const std::unordered_map<std::string, UnaryOp> unaryOps = {
        {"Identity", UnaryOp::Identity}, {"Sqrt", UnaryOp::Sqrt}, {"Reciprocal", UnaryOp::Reciprocal},
        {"Neg", UnaryOp::Neg}, {"Relu", UnaryOp::Relu}};
    if (auto it = binaryOps.find(op); it != binaryOps.end()) return evaluateBinary(node, it->second);
    if (auto it = unaryOps.find(op); it != unaryOps.end()) return evaluateUnary(node, it->second);
    if (op == "Conv" || op == "ConvTranspose") {
      const Operand<T>& x = input(node, 0);
      const Array<T>& w = real(node, 1);
      const Array<T>* b = optionalReal(node, 2);
      if (x.isInteger()) throw EvaluationError(describe(node) + ": integer input");
      const ConvAttributes attributes = convAttributes(node);
      setReal(node, 0, x.type,
              op == "Conv" ? conv(x.real, w, b, attributes) : convTranspose(x.real, w, b, attributes));
      return;
    }
    if (op == "MaxPool" || op == "AveragePool") {
      const Operand<T>& x = input(node, 0);
      if (x.isInteger()) throw EvaluationError(describe(node) + ": integer input");
      if (node.outputs.size() > 1 && !node.outputs[1].empty())
        throw EvaluationError(describe(node) + ": its Indices output is not evaluated");
      if (intAttribute(node, "ceil_mode", 0) != 0)
        throw EvaluationError(describe(node) + ": ceil_mode is not evaluated");
      const ConvAttributes attributes = convAttributes(node);
      setReal(node, 0, x.type,
              op == "MaxPool" ? maxPool(x.real, attributes)
                              : averagePool(x.real, attributes, intAttribute(node, "count_include_pad", 0) != 0));
      return;
    }
    if (op == "GlobalMaxPool") {
      // MaxPool with one window over all the spatial axes.
      const Operand<T>& x = input(node, 0);
      if (x.isInteger()) throw EvaluationError(describe(node) + ": integer input");
      if (x.dims().size() < 3) throw EvaluationError(describe(node) + ": X has no spatial axis");
      ConvAttributes whole;
      whole.kernelShape.assign(x.dims().begin() + 2, x.dims().end());
      setReal(node, 0, x.type, maxPool(x.real, whole));
      return;
    }
    if (op == "Gemm") {
      const Operand<T>& a = input(node, 0);
      // Gemm-1..6 declare C required; an absent C means zero from Gemm-11 on.
      setReal(node, 0, a.type,
              gemm(real(node, 0), real(node, 1), optionalReal(node, 2), floatAttribute(node, "alpha", 1.0),
                   floatAttribute(node, "beta", 1.0), intAttribute(node, "transA", 0) != 0,
                   intAttribute(node, "transB", 0) != 0));
      return;
    }
    if (op == "MatMul") {
      setReal(node, 0, input(node, 0).type, matMul(real(node, 0), real(node, 1)));
      return;
    }
    if (op == "BatchNormalization") return evaluateBatchNorm(node);
    if (op == "LayerNormalization" || op == "RMSNormalization" || op == "GroupNormalization" ||
        op == "InstanceNormalization")
      return evaluateNormalization(node);
    if (op == "Clip") return evaluateClip(node);
    if (op == "LeakyRelu") {
      setReal(node, 0, input(node, 0).type, leakyRelu(real(node, 0), floatAttribute(node, "alpha", 0.01)));
      return;
    }
    if (op == "PRelu") {
      setReal(node, 0, input(node, 0).type, prelu(real(node, 0), real(node, 1)));
      return;
    }
    if (op == "ReduceMean") {
      const Operand<T>& x = input(node, 0);
      std::vector<int64_t> axes = axesOf(node, kReduceMeanAxesInputOpset, 1);
      if (axes.empty() && region_.opset >= kReduceMeanAxesInputOpset && intAttribute(node, "noop_with_empty_axes", 0) != 0) {
        setOutput(node, 0, x);
        return;
      }
      setReal(node, 0, x.type, reduceMean(real(node, 0), axes, intAttribute(node, "keepdims", 1) != 0));
      return;
    }
    if (op == "ReduceSum") {
      const Operand<T>& x = input(node, 0);
      std::vector<int64_t> axes = axesOf(node, kReduceSumAxesInputOpset, 1);
      if (axes.empty() && region_.opset >= kReduceSumAxesInputOpset && intAttribute(node, "noop_with_empty_axes", 0) != 0) {
        setOutput(node, 0, x);
        return;
      }
      setReal(node, 0, x.type, reduceSum(real(node, 0), axes, intAttribute(node, "keepdims", 1) != 0));
      return;
    }
    if (op == "GlobalAveragePool") {
      const Operand<T>& x = input(node, 0);
      std::vector<int64_t> spatial;
      for (int64_t axis = 2; axis < static_cast<int64_t>(x.dims().size()); ++axis) spatial.push_back(axis);
      if (spatial.empty()) {  // no spatial axis: each value its own mean (reduceMean would take every axis)
        setOutput(node, 0, x);
        return;
      }
      setReal(node, 0, x.type, reduceMean(real(node, 0), spatial, true));
      return;
    }
    if (op == "Reshape") return evaluateReshape(node);
    if (op == "Flatten") {
      const Operand<T>& x = input(node, 0);
      reshaped(node, x, analysis::flattenShape(x.dims(), intAttribute(node, "axis", 1)));
      return;
    }
    if (op == "Squeeze" || op == "Unsqueeze") return evaluateSqueeze(node, op == "Unsqueeze");
    if (op == "Transpose") {
      const std::vector<int64_t> perm = intsAttribute(node, "perm");
      setOutput(node, 0, moveData(input(node, 0), [&](const auto& a) { return transpose(a, perm); }));
      return;
    }
    if (op == "Cast") return evaluateCast(node);
    if (op == "Concat") {
      const Operand<T>& first = input(node, 0);
      Operand<T> out;
      out.type = first.type;
      const int64_t axis = intAttribute(node, "axis", 1);
      if (first.isInteger()) {
        std::vector<const Array<int64_t>*> parts;
        for (std::size_t slot = 0; slot < node.inputs.size(); ++slot) parts.push_back(&input(node, slot).integer);
        out.integer = concat(parts, axis);
      } else {
        std::vector<const Array<T>*> parts;
        for (std::size_t slot = 0; slot < node.inputs.size(); ++slot) parts.push_back(&real(node, slot));
        out.real = concat(parts, axis);
      }
      setOutput(node, 0, std::move(out));
      return;
    }
    if (op == "Slice") return evaluateSlice(node);
    if (op == "Gather") {
      const Operand<T>& indices = input(node, 1);
      if (!indices.isInteger()) throw EvaluationError(describe(node) + ": indices are not integers");
      const int64_t axis = intAttribute(node, "axis", 0);
      setOutput(node, 0, moveData(input(node, 0), [&](const auto& a) { return gather(a, indices.integer, axis); }));
      return;
    }
    if (op == "Expand") {
      const std::vector<int64_t> shape = integers(node, 1);
      setOutput(node, 0, moveData(input(node, 0), [&](const auto& a) { return expand(a, shape); }));
      return;
    }
    if (op == "ConstantOfShape") return evaluateConstantOfShape(node);
    throw EvaluationError(describe(node) + ": the verifier has no reference implementation of " + op);
  }

  const Region& region_;
  std::map<std::string, Operand<T>>& values_;
  const InterpreterOptions& options_;
};

}  // namespace

double roundedTo(DataType type, double v) {
  switch (type) {
    case DataType::Float: return static_cast<float>(v);
    case DataType::Float16: return static_cast<double>(Eigen::half(static_cast<float>(v)));
    case DataType::BFloat16: return static_cast<double>(Eigen::bfloat16(static_cast<float>(v)));
    default: return v;
  }
}

bool isEvaluableOp(const std::string& op) {
  static const char* const ops[] = {"Add",
                                    "Sub",
                                    "Mul",
                                    "Div",
                                    "Pow",
                                    "Max",
                                    "Min",
                                    "Identity",
                                    "Sqrt",
                                    "Reciprocal",
                                    "Neg",
                                    "Relu",
                                    "LeakyRelu",
                                    "PRelu",
                                    "Clip",
                                    "Conv",
                                    "ConvTranspose",
                                    "MaxPool",
                                    "AveragePool",
                                    "GlobalMaxPool",
                                    "Gemm",
                                    "MatMul",
                                    "BatchNormalization",
                                    "LayerNormalization",
                                    "RMSNormalization",
                                    "GroupNormalization",
                                    "InstanceNormalization",
                                    "ReduceMean",
                                    "ReduceSum",
                                    "GlobalAveragePool",
                                    "Reshape",
                                    "Flatten",
                                    "Squeeze",
                                    "Unsqueeze",
                                    "Transpose",
                                    "Cast",
                                    "Concat",
                                    "Slice",
                                    "Gather",
                                    "Expand",
                                    "ConstantOfShape",
                                    "Constant"};
  return std::find(std::begin(ops), std::end(ops), op) != std::end(ops);
}

template <typename T>
std::vector<T> BufferPool<T>::take(std::size_t size) {
  // The smallest free buffer that is large enough, else the largest (it grows).
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if (it->capacity() >= size && (best == free_.end() || it->capacity() < best->capacity())) best = it;
  if (best == free_.end())
    best = std::max_element(free_.begin(), free_.end(),
                            [](const auto& a, const auto& b) { return a.capacity() < b.capacity(); });
  std::vector<T> buffer;
  if (best != free_.end()) {
    buffer = std::move(*best);
    free_.erase(best);
  }
  if (buffer.capacity() < size) {
    // New memory: ask for huge pages before the first touch. Faulting in weight-sized buffers 4 KiB at a time was
    // most of the verify time (measured on the DCGAN decoder: rules phase 0.37 s -> 0.12 s).
    std::vector<T> fresh;
    fresh.reserve(size);
    adviseHugePages(fresh.data(), size * sizeof(T));
    buffer = std::move(fresh);
  }
  // A buffer keeps its size when given back, so shrinking it here writes nothing.
  buffer.resize(size);
  return buffer;
}

template <typename T>
void BufferPool<T>::give(std::vector<T>&& buffer) {
  constexpr std::size_t kKept = 16;
  if (buffer.capacity() < kPooledElements) return;
  free_.push_back(std::move(buffer));
  if (free_.size() > kKept)
    free_.erase(std::min_element(free_.begin(), free_.end(),
                                 [](const auto& a, const auto& b) { return a.capacity() < b.capacity(); }));
}

template <typename T>
Operand<T> readConstant(const ConstantOperand& constant, BufferPool<T>* pool) {
  const int64_t count = saturatingElementCount(constant.dims);
  const std::size_t size = elementSize(constant.type);
  if (count == INT64_MAX || size == 0) throw EvaluationError("constant of type " + dataTypeName(constant.type) + " cannot be read");
  const auto byteCount = static_cast<std::size_t>(count) * size;
  if (!constant.bytes || constant.bytes->size() != static_cast<int64_t>(byteCount))
    throw EvaluationError("constant bytes do not match its dims");
  if (constant.type == dataTypeOf<T>()) {
    // The common case, a weight of the compute type: read straight into the operand's buffer.
    Operand<T> out;
    out.type = constant.type;
    out.real.dims = constant.dims;
    const auto elements = static_cast<std::size_t>(count);
    out.real.data = pool && elements >= kPooledElements ? pool->take(elements) : std::vector<T>(elements);
    if (byteCount > 0) constant.bytes->read(0, static_cast<int64_t>(byteCount), reinterpret_cast<char*>(out.real.data.data()));
    return out;
  }
  std::string bytes(byteCount, '\0');
  if (byteCount > 0) constant.bytes->read(0, static_cast<int64_t>(byteCount), bytes.data());
  return fromDoubles<T>(constant.type, constant.dims, elementsAsDoubles(constant.type, bytes));
}

template <typename T>
std::map<std::string, Operand<T>> evaluateRegion(const Region& region, std::map<std::string, Operand<T>> values,
                                                 const InterpreterOptions& options, BufferPool<T>* pool) {
  for (const auto& [name, constant] : region.constants) values.emplace(name, readConstant<T>(constant, pool));
  Evaluator<T>(region, values, options).run();
  return values;
}

template class BufferPool<float>;
template class BufferPool<double>;
template Operand<float> readConstant<float>(const ConstantOperand&, BufferPool<float>*);
template Operand<double> readConstant<double>(const ConstantOperand&, BufferPool<double>*);
template std::map<std::string, Operand<float>> evaluateRegion<float>(const Region&, std::map<std::string, Operand<float>>,
                                                                     const InterpreterOptions&, BufferPool<float>*);
template std::map<std::string, Operand<double>> evaluateRegion<double>(const Region&,
                                                                       std::map<std::string, Operand<double>>,
                                                                       const InterpreterOptions&, BufferPool<double>*);

}  // namespace bnfold::verify
