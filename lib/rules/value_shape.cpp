#include "value_shape.h"

#include <algorithm>
#include <string>

#include "bnfold/ir/tensor.h"

namespace bnfold::rules {
namespace {

using Shape = std::vector<int64_t>;

// Following producers is bounded so a long chain costs little; the answer is then just "unknown".
constexpr int kMaxDepth = 32;

// Ops whose output 0 has exactly the shape (and, except Cast, the element type) of input 0.
bool preservesShape(const std::string& op) {
  static const char* const kOps[] = {
      "Relu",      "LeakyRelu", "PRelu",       "Sigmoid",  "HardSigmoid", "HardSwish",  "Tanh",    "Clip",
      "Elu",       "Selu",      "Celu",        "Softplus", "Softsign",    "Gelu",       "Mish",    "Identity",
      "Dropout",   "Neg",       "Abs",         "Exp",      "Log",         "Sqrt",       "Erf",     "Reciprocal",
      "Softmax",   "LogSoftmax", "LRN",        "Cast",     "BatchNormalization", "InstanceNormalization",
      "ThresholdedRelu", "Shrink"};
  return std::any_of(std::begin(kOps), std::end(kOps), [&](const char* name) { return op == name; });
}

bool isBroadcastingBinary(const std::string& op) { return op == "Add" || op == "Sub" || op == "Mul" || op == "Div"; }

std::optional<Shape> declaredShape(const Value& value) {
  const onnx::TypeProto* type = value.declaredType();
  if (!type || !type->has_tensor_type() || !type->tensor_type().has_shape()) return std::nullopt;
  Shape dims;
  for (const auto& dim : type->tensor_type().shape().dim())
    dims.push_back(dim.has_dim_value() && dim.dim_value() >= 0 ? dim.dim_value() : kUnknownDim);
  return dims;
}

/// numpy broadcast of two known-rank shapes; a dim stays unknown only when neither side pins it down.
Shape broadcastShapes(const Shape& a, const Shape& b) {
  const std::size_t rank = std::max(a.size(), b.size());
  Shape out(rank, kUnknownDim);
  for (std::size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da == db) out[i] = da;
    else if (da == 1) out[i] = db;
    else if (db == 1) out[i] = da;
    else if (da == kUnknownDim) out[i] = db;  // a valid model has da == db or da == 1; either way db > 1 wins
    else if (db == kUnknownDim) out[i] = da;
  }
  return out;
}

std::optional<Shape> shapeOf(const Value* value, int depth);

/// Spatial output dims of a Conv or pooling window over `input` (dims 2.. of an N,C,... tensor), per the ONNX
/// formulas: explicit pads with floor (or ceil_mode) rounding, auto_pad SAME_* (ceil(in / stride)) and VALID. A dim
/// stays unknown when its input dim or the kernel is not known.
void windowOutputDims(const Node& node, const Shape& input, const std::vector<int64_t>& kernel, Shape& out) {
  const std::size_t spatial = input.size() - 2;
  if (kernel.size() != spatial) return;
  const std::string autoPad = node.attributeString("auto_pad", "NOTSET");
  std::vector<int64_t> strides = node.attributeInts("strides"), dilations = node.attributeInts("dilations"),
                       pads = node.attributeInts("pads");
  strides.resize(spatial, 1);
  dilations.resize(spatial, 1);
  pads.resize(2 * spatial, 0);
  const bool ceilMode = node.attributeInt("ceil_mode", 0) != 0;
  for (std::size_t i = 0; i < spatial; ++i) {
    const int64_t in = input[i + 2], k = kernel[i], s = strides[i], d = dilations[i];
    if (in < 0 || k <= 0 || s <= 0 || d <= 0) continue;  // unknown, or an invalid attribute: leave the dim unknown
    // Dims, pads and dilations come from the file: any of these sums may overflow, and then the dim stays unknown.
    int64_t extent = 0, span = 0;
    if (__builtin_mul_overflow(d, k - 1, &extent) || __builtin_add_overflow(extent, 1, &extent)) continue;
    if (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER") {
      out[i + 2] = in / s + (in % s != 0);
    } else if (autoPad == "VALID") {
      if (in >= extent) out[i + 2] = (in - extent) / s + 1;
    } else {
      if (__builtin_add_overflow(in, pads[i], &span) || __builtin_add_overflow(span, pads[i + spatial], &span) ||
          __builtin_sub_overflow(span, extent, &span))
        continue;
      if (span >= 0) out[i + 2] = (ceilMode ? span / s + (span % s != 0) : span / s) + 1;
    }
  }
}

std::optional<Shape> inferredShape(const Value& value, int depth) {
  const Node* producer = value.producer();
  if (!producer || depth > kMaxDepth || !(producer->domain().empty() || producer->domain() == "ai.onnx"))
    return std::nullopt;
  const std::string& op = producer->opType();
  if (value.producerOutputIndex() != 0) return std::nullopt;
  if (preservesShape(op)) return shapeOf(producer->input(0), depth + 1);
  if (op == "Conv" || op == "ConvTranspose") {
    auto weight = shapeOf(producer->input(1), depth + 1);
    if (!weight || weight->size() < 3) return std::nullopt;
    Shape out(weight->size(), kUnknownDim);
    if (auto input = shapeOf(producer->input(0), depth + 1); input && !input->empty()) out[0] = (*input)[0];
    const int64_t group = producer->attributeInt("group", 1);
    if (op == "Conv") out[1] = (*weight)[0];
    else if ((*weight)[1] != kUnknownDim && group > 0) out[1] = checkedProduct((*weight)[1], group).value_or(kUnknownDim);
    if (auto input = shapeOf(producer->input(0), depth + 1); op == "Conv" && input && input->size() == out.size())
      windowOutputDims(*producer, *input, Shape(weight->begin() + 2, weight->end()), out);
    return out;
  }
  if (op == "Gemm") {
    Shape out(2, kUnknownDim);
    auto a = shapeOf(producer->input(0), depth + 1);
    auto b = shapeOf(producer->input(1), depth + 1);
    if (a && a->size() == 2) out[0] = (*a)[producer->attributeInt("transA", 0) ? 1 : 0];
    if (b && b->size() == 2) out[1] = (*b)[producer->attributeInt("transB", 0) ? 0 : 1];
    return out;
  }
  if (op == "MatMul") {
    auto a = shapeOf(producer->input(0), depth + 1);
    auto b = shapeOf(producer->input(1), depth + 1);
    if (!a || !b || b->size() != 2 || a->empty()) return std::nullopt;
    Shape out(*a);
    if (a->size() == 1) return Shape{(*b)[1]};
    out.back() = (*b)[1];
    return out;
  }
  if (op == "MaxPool" || op == "AveragePool" || op == "LpPool" || op == "GlobalAveragePool" ||
      op == "GlobalMaxPool" || op == "GlobalLpPool") {
    // Batch and channels pass through; the spatial dims shrink (to 1 for the global pools).
    auto input = shapeOf(producer->input(0), depth + 1);
    if (!input || input->size() < 3) return std::nullopt;
    const bool global = op.rfind("Global", 0) == 0;
    Shape out(*input);
    for (std::size_t i = 2; i < out.size(); ++i) out[i] = global ? 1 : kUnknownDim;
    if (!global) windowOutputDims(*producer, *input, producer->attributeInts("kernel_shape"), out);
    return out;
  }
  if (op == "Flatten") return Shape{kUnknownDim, kUnknownDim};
  if (isBroadcastingBinary(op)) {
    auto a = shapeOf(producer->input(0), depth + 1);
    auto b = shapeOf(producer->input(1), depth + 1);
    if (!a || !b) return std::nullopt;
    return broadcastShapes(*a, *b);
  }
  return std::nullopt;
}

std::optional<Shape> shapeOf(const Value* value, int depth) {
  if (!value) return std::nullopt;
  if (const Tensor* tensor = value->constantTensor()) return tensor->dims();
  auto declared = declaredShape(*value);
  if (declared && std::none_of(declared->begin(), declared->end(), [](int64_t d) { return d == kUnknownDim; }))
    return declared;
  auto inferred = inferredShape(*value, depth);
  if (!declared) return inferred;
  // Fill the declared shape's unknown dims from inference when both agree on the rank.
  if (inferred && inferred->size() == declared->size())
    for (std::size_t i = 0; i < declared->size(); ++i)
      if ((*declared)[i] == kUnknownDim) (*declared)[i] = (*inferred)[i];
  return declared;
}

std::optional<DataType> typeOf(const Value* value, int depth) {
  if (!value || depth > kMaxDepth) return std::nullopt;
  if (const Tensor* tensor = value->constantTensor()) return tensor->dataType();
  if (const onnx::TypeProto* declared = value->declaredType())
    if (declared->has_tensor_type() && declared->tensor_type().elem_type() != 0)
      return static_cast<DataType>(declared->tensor_type().elem_type());
  const Node* producer = value->producer();
  if (!producer || value->producerOutputIndex() != 0) return std::nullopt;
  if (!(producer->domain().empty() || producer->domain() == "ai.onnx")) return std::nullopt;
  const std::string& op = producer->opType();
  if (op == "Cast") return static_cast<DataType>(producer->attributeInt("to", 0));
  if (op == "Conv" || op == "ConvTranspose" || op == "Gemm" || op == "MatMul") {
    // Input and weight share the element type T.
    if (auto type = typeOf(producer->input(1), depth + 1)) return type;
    return typeOf(producer->input(0), depth + 1);
  }
  if (preservesShape(op) || op == "Flatten" || op.find("Pool") != std::string::npos)
    return typeOf(producer->input(0), depth + 1);
  if (isBroadcastingBinary(op)) {
    if (auto type = typeOf(producer->input(0), depth + 1)) return type;
    return typeOf(producer->input(1), depth + 1);
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::vector<int64_t>> knownShape(const Value& value) { return shapeOf(&value, 0); }

std::optional<DataType> knownElementType(const Value& value) { return typeOf(&value, 0); }

}  // namespace bnfold::rules
