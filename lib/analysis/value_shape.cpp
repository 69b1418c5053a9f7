#include "value_shape.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "bnfold/ir/model.h"
#include "bnfold/ir/tensor.h"
#include "op_forms.h"

namespace bnfold::analysis {
namespace {

using Shape = std::vector<int64_t>;

// Following producers is bounded so a long chain costs little; the answer is then just "unknown".
constexpr int kMaxDepth = 32;

/// What a query knows of a value's shape: the shape (nullopt when unknown), or that its sources contradict each
/// other, which makes it unknown and every shape inferred from it too.
struct Fact {
  std::optional<Shape> shape;
  bool contradicted = false;
};

// Where a query stands: how many producers deep, and the shapes it has worked out so far, by value and depth (the
// answer depends on both, as the depth bound cuts inference short). Each is worked out once per query: a residual chain
// reaches a block's input along two paths per block, and following every path cost 80 ms per query (`fold --verify`
// on a 250-block chain took 20 s).
struct KnownShape {
  const Value* value;
  int depth;
  Fact fact;
};
struct Step {
  int depth;
  std::vector<KnownShape>* shapes;  // null for element-type queries; few, so searched in order
  bool* inputContradicted;          // set when an input of the producer being inferred is contradicted
  Step next() const { return {depth + 1, shapes, inputContradicted}; }
};

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

Fact factOf(const Value* value, Step step);

/// The shape of `value` for inferring the shape of the node that reads it (`step` is the reader's).
std::optional<Shape> shapeOf(const Value* value, Step step) {
  Fact fact = factOf(value, step);
  if (fact.contradicted && step.inputContradicted) *step.inputContradicted = true;
  return fact.shape;
}

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

std::optional<DataType> typeOf(const Value* value, Step step);

// ---- per-op rules: the shape and element type of output 0 from the producer's inputs and attributes ----

std::optional<Shape> sameShapeAsInput(const Node& node, Step step) { return shapeOf(node.input(0), step.next()); }
std::optional<DataType> sameTypeAsInput(const Node& node, Step step) { return typeOf(node.input(0), step.next()); }
std::optional<DataType> castType(const Node& node, Step) { return static_cast<DataType>(node.attributeInt("to", 0)); }

/// Conv, ConvTranspose, Gemm, MatMul: input and weight share the element type T.
std::optional<DataType> layerType(const Node& node, Step step) {
  if (auto type = typeOf(node.input(1), step.next())) return type;
  return typeOf(node.input(0), step.next());
}

/// Conv and ConvTranspose: rank and channels from the weight, spatial dims by the window formulas (Conv only).
std::optional<Shape> convShape(const Node& node, Step step) {
  auto weight = shapeOf(node.input(1), step.next());
  if (!weight || weight->size() < 3) return std::nullopt;
  Shape out(weight->size(), kUnknownDim);
  auto input = shapeOf(node.input(0), step.next());
  if (input && !input->empty()) out[0] = (*input)[0];
  const int64_t group = node.attributeInt("group", 1);
  if (node.opType() == "Conv") out[1] = (*weight)[0];
  else if ((*weight)[1] != kUnknownDim && group > 0) out[1] = checkedProduct((*weight)[1], group).value_or(kUnknownDim);
  if (node.opType() == "Conv" && input && input->size() == out.size())
    windowOutputDims(node, *input, Shape(weight->begin() + 2, weight->end()), out);
  return out;
}

std::optional<Shape> gemmShape(const Node& node, Step step) {
  Shape out(2, kUnknownDim);
  auto a = shapeOf(node.input(0), step.next());
  auto b = shapeOf(node.input(1), step.next());
  if (a && a->size() == 2) out[0] = (*a)[node.attributeInt("transA", 0) ? 1 : 0];
  if (b && b->size() == 2) out[1] = (*b)[node.attributeInt("transB", 0) ? 0 : 1];
  return out;
}

/// MatMul by a 2-D weight (the layers rules fold into): the last dim becomes the weight's columns.
std::optional<Shape> matMulShape(const Node& node, Step step) {
  auto a = shapeOf(node.input(0), step.next());
  auto b = shapeOf(node.input(1), step.next());
  if (!a || !b || b->size() != 2 || a->empty()) return std::nullopt;
  if (a->size() == 1) return Shape{(*b)[1]};
  Shape out(*a);
  out.back() = (*b)[1];
  return out;
}

/// Pooling: batch and channels pass through; the spatial dims shrink (to 1 for the global pools).
std::optional<Shape> poolShape(const Node& node, Step step) {
  auto input = shapeOf(node.input(0), step.next());
  if (!input || input->size() < 3) return std::nullopt;
  const bool global = node.opType().rfind("Global", 0) == 0;
  Shape out(*input);
  for (std::size_t i = 2; i < out.size(); ++i) out[i] = global ? 1 : kUnknownDim;
  if (!global) windowOutputDims(node, *input, node.attributeInts("kernel_shape"), out);
  return out;
}

/// The integers of a layout op's operand: input `slot` from `inputOpset` of the model's ai.onnx opset, an attribute
/// before it. Nullopt when the input is not a constant (an initializer a caller may override is none).
std::optional<std::vector<int64_t>> intsOperand(const Node& node, std::size_t slot, const char* attribute,
                                                int64_t inputOpset) {
  const Graph* graph = node.graph();
  const int64_t opset = graph && graph->model() ? graph->model()->opsetVersion() : -1;
  if (opset < inputOpset) return node.attributeInts(attribute);
  const Value* input = node.input(slot);
  if (!input) return std::vector<int64_t>{};
  const Tensor* tensor = input->isGraphInput() ? nullptr : input->constantTensor();
  if (!tensor || (tensor->dataType() != DataType::Int64 && tensor->dataType() != DataType::Int32)) return std::nullopt;
  return tensor->toInt64s();
}

std::optional<Shape> shapeIfFormed(const OutputShape& out) {
  return out.ok() ? std::optional<Shape>(out.dims) : std::nullopt;
}

std::optional<Shape> reshapeOutput(const Node& node, Step step) {
  auto target = intsOperand(node, 1, "shape", kReshapeShapeInputOpset);
  if (!target) return std::nullopt;
  // The output's rank is the target's: with the input unknown, a 0 or -1 leaves its dim unknown, the others are known.
  auto input = shapeOf(node.input(0), step.next()).value_or(Shape(target->size(), kUnknownDim));
  return shapeIfFormed(reshapeShape(input, *target, node.attributeInt("allowzero", 0) != 0));
}

std::optional<Shape> transposeOutput(const Node& node, Step step) {
  auto input = shapeOf(node.input(0), step.next());
  if (!input) return std::nullopt;
  return shapeIfFormed(transposeShape(*input, node.attributeInts("perm")));
}

std::optional<Shape> squeezeOutput(const Node& node, Step step) {
  auto input = shapeOf(node.input(0), step.next());
  auto axes = intsOperand(node, 1, "axes", kSqueezeAxesInputOpset);
  if (!input || !axes) return std::nullopt;
  return shapeIfFormed(node.opType() == "Squeeze" ? squeezeShape(*input, *axes) : unsqueezeShape(*input, *axes));
}

std::optional<Shape> flattenOutput(const Node& node, Step step) {
  auto input = shapeOf(node.input(0), step.next());
  if (!input) return Shape{kUnknownDim, kUnknownDim};
  return shapeIfFormed(flattenShape(*input, node.attributeInt("axis", 1)));
}

/// Add, Sub, Mul, Div: numpy broadcast of both sides.
std::optional<Shape> broadcastShape(const Node& node, Step step) {
  auto a = shapeOf(node.input(0), step.next());
  auto b = shapeOf(node.input(1), step.next());
  if (!a || !b) return std::nullopt;
  return broadcastShapes(*a, *b);
}
std::optional<DataType> binaryType(const Node& node, Step step) {
  if (auto type = typeOf(node.input(0), step.next())) return type;
  return typeOf(node.input(1), step.next());
}

struct OpShapeRule {
  std::optional<Shape> (*shape)(const Node& producer, Step step);
  std::optional<DataType> (*type)(const Node& producer, Step step);
};

/// Every op whose output shape is inferred, keyed by op type: adding an op is one entry.
const std::unordered_map<std::string, OpShapeRule>& shapeRules() {
  static const std::unordered_map<std::string, OpShapeRule> rules = [] {
    std::unordered_map<std::string, OpShapeRule> table = {
        {"Cast", {sameShapeAsInput, castType}},
        {"Conv", {convShape, layerType}},
        {"ConvTranspose", {convShape, layerType}},
        {"Gemm", {gemmShape, layerType}},
        {"MatMul", {matMulShape, layerType}},
        {"Flatten", {flattenOutput, sameTypeAsInput}},
        {"Reshape", {reshapeOutput, sameTypeAsInput}},
        {"Transpose", {transposeOutput, sameTypeAsInput}},
        {"Squeeze", {squeezeOutput, sameTypeAsInput}},
        {"Unsqueeze", {squeezeOutput, sameTypeAsInput}},
    };
    // Output 0 has exactly the shape and element type of input 0.
    for (const char* op : {"Relu", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Clip", "Elu",
                           "Selu", "Celu", "Softplus", "Softsign", "Gelu", "Mish", "Identity", "Dropout", "Neg", "Abs",
                           "Exp", "Log", "Sqrt", "Erf", "Reciprocal", "Softmax", "LogSoftmax", "LRN",
                           "BatchNormalization", "InstanceNormalization", "ThresholdedRelu", "Shrink"})
      table.emplace(op, OpShapeRule{sameShapeAsInput, sameTypeAsInput});
    for (const char* op : {"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
      table.emplace(op, OpShapeRule{poolShape, sameTypeAsInput});
    for (const char* op : {"Add", "Sub", "Mul", "Div"}) table.emplace(op, OpShapeRule{broadcastShape, binaryType});
    return table;
  }();
  return rules;
}

/// The rule for the producer of output 0 of `value`, or null when there is none to follow.
const OpShapeRule* producerRule(const Value& value, Step step) {
  const Node* producer = value.producer();
  if (!producer || step.depth > kMaxDepth || value.producerOutputIndex() != 0) return nullptr;
  if (!producer->isOnnxDomain()) return nullptr;
  auto rule = shapeRules().find(producer->opType());
  return rule == shapeRules().end() ? nullptr : &rule->second;
}

/// The shape the producer's rule gives `value`; `inputContradicted` tells whether an input's shape was contradicted.
std::optional<Shape> inferredShape(const Value& value, Step step, bool* inputContradicted) {
  const OpShapeRule* rule = producerRule(value, step);
  if (!rule) return std::nullopt;
  step.inputContradicted = inputContradicted;
  return rule->shape(*value.producer(), step);
}

Fact workOutFact(const Value* value, Step step) {
  if (const Tensor* tensor = value->constantTensor()) return {tensor->dims()};
  auto declared = declaredShape(*value);
  bool inputContradicted = false;
  auto inferred = inferredShape(*value, step, &inputContradicted);
  if (inputContradicted) return {std::nullopt, true};
  if (!inferred) return {declared};
  if (!declared) return {inferred};
  if (inferred->size() != declared->size()) return {std::nullopt, true};
  // Inference wins; the declared shape fills the dims it leaves unknown.
  for (std::size_t i = 0; i < inferred->size(); ++i) {
    const int64_t said = (*declared)[i];
    if ((*inferred)[i] == kUnknownDim) (*inferred)[i] = said;
    else if (said != kUnknownDim && said != (*inferred)[i]) return {std::nullopt, true};
  }
  return {inferred};
}

Fact factOf(const Value* value, Step step) {
  if (!value) return {};
  // Paths meet again only at a value read more than once: only those are worth remembering.
  if (value->uses().size() < 2) return workOutFact(value, step);
  for (const KnownShape& known : *step.shapes)
    if (known.value == value && known.depth == step.depth) return known.fact;
  Fact fact = workOutFact(value, step);
  step.shapes->push_back({value, step.depth, fact});
  return fact;
}

std::optional<DataType> typeOf(const Value* value, Step step) {
  if (!value || step.depth > kMaxDepth) return std::nullopt;
  if (const Tensor* tensor = value->constantTensor()) return tensor->dataType();
  if (const onnx::TypeProto* declared = value->declaredType())
    if (declared->has_tensor_type() && declared->tensor_type().elem_type() != 0)
      return static_cast<DataType>(declared->tensor_type().elem_type());
  const OpShapeRule* rule = producerRule(*value, step);
  return rule ? rule->type(*value->producer(), step) : std::nullopt;
}

}  // namespace

std::optional<std::vector<int64_t>> knownShape(const Value& value) {
  std::vector<KnownShape> shapes;
  return factOf(&value, Step{0, &shapes, nullptr}).shape;
}

std::optional<DataType> knownElementType(const Value& value) { return typeOf(&value, Step{0, nullptr, nullptr}); }

}  // namespace bnfold::analysis
