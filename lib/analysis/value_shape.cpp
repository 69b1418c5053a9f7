#include "value_shape.h"

#include <algorithm>
#include <deque>
#include <iterator>
#include <memory_resource>
#include <stdexcept>
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
// Steps left at the asked value: a producer is followed while at least one is left.
constexpr int kStepsAtQuery = kMaxDepth + 1;
static_assert(kStepsAtQuery < 64, "the steps at which a fact may change are bits of a uint64_t");

/// What is known of a value's shape with a given number of steps left: the shape (nullopt when unknown), or that its
/// sources contradict each other, which makes it unknown and every shape inferred from it too.
struct Fact {
  std::optional<Shape> shape;
  bool contradicted = false;
  bool operator==(const Fact& other) const { return shape == other.shape && contradicted == other.contradicted; }
};

/// A value's facts for 0..stepsKnown steps left, as runs of equal facts: runs[i] holds from runs[i].fromSteps up to
/// the next run. Few runs: a fact changes only where one of the producer's inputs' facts does, one step further.
struct FactRun {
  int fromSteps;
  Fact fact;
};
struct Facts {
  int stepsKnown = -1;
  std::vector<FactRun> runs;
  const Fact& at(int stepsLeft) const {
    auto run = std::upper_bound(runs.begin(), runs.end(), stepsLeft,
                                [](int steps, const FactRun& r) { return steps < r.fromSteps; });
    return std::prev(run)->fact;
  }
};

class ShapeStore;

/// What a per-op shape rule reads: the shapes of its node's inputs with one step fewer left than its output.
class InputShapes {
 public:
  InputShapes(const ShapeStore& store, const Node& node, std::size_t readable, int stepsLeft)
      : store_(store), node_(node), readable_(readable), stepsLeft_(stepsLeft) {}
  const std::optional<Shape>& operator()(std::size_t slot) const;
  /// Whether the rule may read input `slot` here (OpShapeRule::readsInputs).
  bool reads(std::size_t slot) const { return slot < readable_; }
  /// Whether an input read so far was contradicted.
  bool contradicted() const { return contradicted_; }

 private:
  const ShapeStore& store_;
  const Node& node_;
  std::size_t readable_;
  int stepsLeft_;
  mutable bool contradicted_ = false;
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

std::optional<DataType> typeOf(const Value* value, int depth);

// ---- per-op rules: the shape and element type of output 0 from the producer's inputs and attributes ----
// A type rule reads its inputs' types at `depth + 1`; a shape rule reads its inputs' shapes through `in`.

std::optional<Shape> sameShapeAsInput(const Node&, const InputShapes& in) { return in(0); }
std::optional<DataType> sameTypeAsInput(const Node& node, int depth) { return typeOf(node.input(0), depth + 1); }
std::optional<DataType> castType(const Node& node, int) { return static_cast<DataType>(node.attributeInt("to", 0)); }

/// Conv, ConvTranspose, Gemm, MatMul: input and weight share the element type T.
std::optional<DataType> layerType(const Node& node, int depth) {
  if (auto type = typeOf(node.input(1), depth + 1)) return type;
  return typeOf(node.input(0), depth + 1);
}

/// Conv and ConvTranspose: rank and channels from the weight, spatial dims by the window formulas (Conv only).
std::optional<Shape> convShape(const Node& node, const InputShapes& in) {
  const auto& weight = in(1);
  if (!weight || weight->size() < 3) return std::nullopt;
  Shape out(weight->size(), kUnknownDim);
  const auto& input = in(0);
  if (input && !input->empty()) out[0] = (*input)[0];
  const int64_t group = node.attributeInt("group", 1);
  if (node.opType() == "Conv") out[1] = (*weight)[0];
  else if ((*weight)[1] != kUnknownDim && group > 0) out[1] = checkedProduct((*weight)[1], group).value_or(kUnknownDim);
  if (node.opType() == "Conv" && input && input->size() == out.size())
    windowOutputDims(node, *input, Shape(weight->begin() + 2, weight->end()), out);
  return out;
}

std::optional<Shape> gemmShape(const Node& node, const InputShapes& in) {
  Shape out(2, kUnknownDim);
  const auto& a = in(0);
  const auto& b = in(1);
  if (a && a->size() == 2) out[0] = (*a)[node.attributeInt("transA", 0) ? 1 : 0];
  if (b && b->size() == 2) out[1] = (*b)[node.attributeInt("transB", 0) ? 0 : 1];
  return out;
}

/// MatMul by a 2-D weight (the layers rules fold into): the last dim becomes the weight's columns.
std::optional<Shape> matMulShape(const Node&, const InputShapes& in) {
  const auto& a = in(0);
  const auto& b = in(1);
  if (!a || !b || b->size() < 2 || a->empty()) return std::nullopt;
  if (a->size() == 1) return b->size() == 2 ? std::optional<Shape>(Shape{(*b)[1]}) : std::nullopt;
  if (b->size() == 2) {
    Shape out(*a);
    out.back() = (*b)[1];
    return out;
  }
  // Batched (an attention's Q·Kᵀ): the batch dims broadcast numpy-style.
  Shape out = broadcastShapes(Shape(a->begin(), a->end() - 2), Shape(b->begin(), b->end() - 2));
  out.push_back((*a)[a->size() - 2]);
  out.push_back(b->back());
  return out;
}

/// Pooling: batch and channels pass through; the spatial dims shrink (to 1 for the global pools).
std::optional<Shape> poolShape(const Node& node, const InputShapes& in) {
  const auto& input = in(0);
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
  // As RuleContext::integersOf reads them: any integer type (the spec says int64); a float is not read as one.
  if (!tensor || !isIntegerType(tensor->dataType())) return std::nullopt;
  return tensor->toInt64s();
}

std::optional<Shape> shapeIfFormed(OutputShape out) {
  return out.ok() ? std::optional<Shape>(std::move(out.dims)) : std::nullopt;
}

/// ReduceMean: the reduced axes become 1 (keepdims, the default) or go; no axes means all of them.
std::optional<Shape> reduceMeanShape(const Node& node, const InputShapes& in) {
  const auto& input = in(0);
  auto axes = intsOperand(node, 1, "axes", kReduceMeanAxesInputOpset);
  if (!input || !axes) return std::nullopt;
  const auto rank = static_cast<int64_t>(input->size());
  std::vector<bool> reduced(input->size(), axes->empty());
  if (axes->empty() && node.attributeInt("noop_with_empty_axes", 0) != 0) return input;
  for (int64_t axis : *axes) {
    if (axis < -rank || axis >= rank) return std::nullopt;
    reduced[static_cast<std::size_t>(axis < 0 ? axis + rank : axis)] = true;
  }
  const bool keepDims = node.attributeInt("keepdims", 1) != 0;
  Shape out;
  for (std::size_t i = 0; i < input->size(); ++i) {
    if (!reduced[i]) out.push_back((*input)[i]);
    else if (keepDims) out.push_back(1);
  }
  return out;
}

/// Whether a Reshape's output dims are its target's whatever its input: no 0 that copies an input dim, no -1 to infer.
/// (A valid model's input then has as many elements; an invalid one's fails at run time, not here.)
bool targetStandsAlone(const std::vector<int64_t>& target, bool allowZero) {
  return std::none_of(target.begin(), target.end(), [&](int64_t d) { return d == -1 || (d == 0 && !allowZero); });
}

/// How many inputs a Reshape's shape reads: none when its target stands alone, so that a query stops there.
std::size_t reshapeInputsRead(const Node& node) {
  auto target = intsOperand(node, 1, "shape", kReshapeShapeInputOpset);
  return target && targetStandsAlone(*target, reshapeAllowsZero(node)) ? 0 : 1;
}

std::optional<Shape> reshapeOutput(const Node& node, const InputShapes& in) {
  auto target = intsOperand(node, 1, "shape", kReshapeShapeInputOpset);
  if (!target) return std::nullopt;
  const bool allowZero = reshapeAllowsZero(node);
  // The output's rank is the target's: with the input unknown (or not read, when the target stands alone), a 0 or
  // -1 leaves its dim unknown, the others are known.
  if (in.reads(0))
    if (const std::optional<Shape>& input = in(0)) return shapeIfFormed(reshapeShape(*input, *target, allowZero));
  return shapeIfFormed(reshapeShape(Shape(target->size(), kUnknownDim), *target, allowZero));
}

std::optional<Shape> transposeOutput(const Node& node, const InputShapes& in) {
  const auto& input = in(0);
  if (!input) return std::nullopt;
  return shapeIfFormed(transposeShape(*input, node.attributeInts("perm")));
}

std::optional<Shape> squeezeOutput(const Node& node, const InputShapes& in) {
  const auto& input = in(0);
  auto axes = intsOperand(node, 1, "axes", kSqueezeAxesInputOpset);
  if (!input || !axes) return std::nullopt;
  return shapeIfFormed(node.opType() == "Squeeze" ? squeezeShape(*input, *axes) : unsqueezeShape(*input, *axes));
}

std::optional<Shape> flattenOutput(const Node& node, const InputShapes& in) {
  const auto& input = in(0);
  if (!input) return Shape{kUnknownDim, kUnknownDim};
  return shapeIfFormed(flattenShape(*input, node.attributeInt("axis", 1)));
}

/// Add, Sub, Mul, Div: numpy broadcast of both sides.
std::optional<Shape> broadcastShape(const Node&, const InputShapes& in) {
  const auto& a = in(0);
  const auto& b = in(1);
  if (!a || !b) return std::nullopt;
  return broadcastShapes(*a, *b);
}
std::optional<DataType> binaryType(const Node& node, int depth) {
  if (auto type = typeOf(node.input(0), depth + 1)) return type;
  return typeOf(node.input(1), depth + 1);
}

struct OpShapeRule {
  std::optional<Shape> (*shape)(const Node& producer, const InputShapes& in);
  std::optional<DataType> (*type)(const Node& producer, int depth);
  std::size_t shapeReadsInputs;  // the shape rule reads the shapes of inputs 0 .. shapeReadsInputs - 1
  std::size_t (*inputsRead)(const Node& producer) = nullptr;  // fewer for this node, when set
  std::size_t readsInputs(const Node& producer) const {
    return inputsRead ? inputsRead(producer) : shapeReadsInputs;
  }
};

/// Every op whose output shape is inferred, keyed by op type: adding an op is one entry.
const std::unordered_map<std::string, OpShapeRule>& shapeRules() {
  static const std::unordered_map<std::string, OpShapeRule> rules = [] {
    std::unordered_map<std::string, OpShapeRule> table = {
        {"Cast", {sameShapeAsInput, castType, 1}},
        {"Conv", {convShape, layerType, 2}},
        {"ConvTranspose", {convShape, layerType, 2}},
        {"Gemm", {gemmShape, layerType, 2}},
        {"MatMul", {matMulShape, layerType, 2}},
        {"Flatten", {flattenOutput, sameTypeAsInput, 1}},
        {"Reshape", {reshapeOutput, sameTypeAsInput, 1, reshapeInputsRead}},
        {"Transpose", {transposeOutput, sameTypeAsInput, 1}},
        {"Squeeze", {squeezeOutput, sameTypeAsInput, 1}},
        {"Unsqueeze", {squeezeOutput, sameTypeAsInput, 1}},
        {"ReduceMean", {reduceMeanShape, sameTypeAsInput, 1}},
    };
    // Output 0 has exactly the shape and element type of input 0.
    for (const char* op : {"Relu", "LeakyRelu", "PRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Clip", "Elu",
                           "Selu", "Celu", "Softplus", "Softsign", "Gelu", "Mish", "Identity", "Dropout", "Neg", "Abs",
                           "Exp", "Log", "Sqrt", "Erf", "Reciprocal", "Softmax", "LogSoftmax", "LRN",
                           "BatchNormalization", "InstanceNormalization", "ThresholdedRelu", "Shrink",
                           "LayerNormalization", "RMSNormalization"})
      table.emplace(op, OpShapeRule{sameShapeAsInput, sameTypeAsInput, 1});
    for (const char* op : {"LayerNormalization", "RMSNormalization", "GroupNormalization"})
      table.emplace(op, OpShapeRule{sameShapeAsInput, sameTypeAsInput, 1});
    for (const char* op : {"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
      table.emplace(op, OpShapeRule{poolShape, sameTypeAsInput, 1});
    for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow"})
      table.emplace(op, OpShapeRule{broadcastShape, binaryType, 2});
    return table;
  }();
  return rules;
}

/// The rule for the op type `opType`, or null when its shape is not inferred.
const OpShapeRule* ruleFor(const std::string& opType) {
  auto rule = shapeRules().find(opType);
  return rule == shapeRules().end() ? nullptr : &rule->second;
}

/// Whether `value` is output 0 of a standard-domain node, the only outputs shape rules give.
bool hasRuleOutput(const Value& value) {
  return value.producer() && value.producerOutputIndex() == 0 && value.producer()->isOnnxDomain();
}

/// The facts worked out so far, by value. Invariant: a value's facts for up to N steps left were worked out from its
/// producer's inputs' facts for up to N - 1, which are kept too; so whatever was inferred from a value is found by
/// following the readers of values that have facts, and a value without any has nothing inferred from it.
class ShapeStore {
 public:
  const Facts& factsOf(const Value& value, int stepsLeft) {
    auto known = facts_.find(&value);
    if (known != facts_.end() && known->second.stepsKnown >= stepsLeft) return known->second;
    Facts worked = workOut(value, stepsLeft);
    return facts_[&value] = std::move(worked);
  }

  /// The facts of a value factsOf worked out for at least `stepsLeft` steps.
  const Fact& knownFact(const Value& value, int stepsLeft) const { return facts_.at(&value).at(stepsLeft); }

  void forget(const Value& value) {
    if (facts_.erase(&value) == 0) return;
    // A fact with N steps left reads facts at most N producers back, so only readers within kStepsAtQuery steps of
    // `value` can have read its facts. Breadth first, so that each reader is reached over its shortest path.
    std::deque<std::pair<const Value*, int>> forgotten{{&value, 0}};
    while (!forgotten.empty()) {
      auto [next, distance] = forgotten.front();
      forgotten.pop_front();
      if (distance == kStepsAtQuery) continue;
      for (const Use& use : next->uses())
        for (const Value* output : use.node->outputs())
          if (output && facts_.erase(output)) forgotten.emplace_back(output, distance + 1);
    }
  }

  void clear() {
    decltype(facts_)(&entryMemory_).swap(facts_);  // the old entries go with the temporary, their memory below
    entryMemory_.release();
  }

 private:
  // A node's op type is the model's one copy of it (Model::internOpType): its address stands for it.
  const OpShapeRule* producerRule(const Value& value) {
    if (!hasRuleOutput(value)) return nullptr;
    const std::string& opType = value.producer()->opType();
    auto known = rulesByOpType_.find(&opType);
    if (known == rulesByOpType_.end()) known = rulesByOpType_.emplace(&opType, ruleFor(opType)).first;
    return known->second;
  }

  Facts workOut(const Value& value, int stepsLeft) {
    if (const Tensor* tensor = value.constantTensor()) return everywhere({tensor->dims()});
    auto declared = declaredShape(value);
    const OpShapeRule* rule = producerRule(value);
    if (!rule) return everywhere({declared});
    Facts facts{stepsLeft, {{0, {declared}}}};  // no step left: the producer is not followed
    if (stepsLeft == 0) return facts;
    const Node& producer = *value.producer();
    // The fact can change only with one more step than where an input's fact changes (bit N: at N steps left).
    uint64_t changes = uint64_t{1} << 1;
    const std::size_t reads = rule->readsInputs(producer);
    for (std::size_t slot = 0; slot < reads; ++slot) {
      const Value* input = producer.input(slot);
      if (!input) continue;
      for (const FactRun& run : factsOf(*input, stepsLeft - 1).runs)
        if (run.fromSteps < stepsLeft) changes |= uint64_t{1} << (run.fromSteps + 1);
    }
    for (int steps = 1; steps <= stepsLeft; ++steps) {
      if (!(changes >> steps & 1)) continue;
      Fact fact = inferredFact(producer, *rule, reads, declared, steps - 1);
      if (!(fact == facts.runs.back().fact)) facts.runs.push_back({steps, std::move(fact)});
    }
    return facts;
  }

  static Facts everywhere(Fact fact) { return {kStepsAtQuery, {{0, std::move(fact)}}}; }

  /// The fact the producer's rule gives its output from its first `reads` inputs' facts with `inputStepsLeft` steps
  /// left, merged with the declared shape: inference wins, the declared shape fills the dims it leaves unknown.
  Fact inferredFact(const Node& producer, const OpShapeRule& rule, std::size_t reads,
                    const std::optional<Shape>& declared, int inputStepsLeft) const {
    InputShapes in(*this, producer, reads, inputStepsLeft);
    auto inferred = rule.shape(producer, in);
    if (in.contradicted()) return {std::nullopt, true};
    if (!inferred) return {declared};
    if (!declared) return {inferred};
    if (inferred->size() != declared->size()) return {std::nullopt, true};
    for (std::size_t i = 0; i < inferred->size(); ++i) {
      const int64_t said = (*declared)[i];
      if ((*inferred)[i] == kUnknownDim) (*inferred)[i] = said;
      else if (said != kUnknownDim && said != (*inferred)[i]) return {std::nullopt, true};
    }
    return {inferred};
  }

  // The entries' memory goes all at once, with the store or clear(); a forgotten entry's is not given back before.
  std::pmr::monotonic_buffer_resource entryMemory_;
  std::pmr::unordered_map<const Value*, Facts> facts_{&entryMemory_};
  std::unordered_map<const std::string*, const OpShapeRule*> rulesByOpType_;
};

const std::optional<Shape>& InputShapes::operator()(std::size_t slot) const {
  static const std::optional<Shape> kOmitted;
  if (slot >= readable_) throw std::logic_error("shape rule of " + node_.opType() + " reads an input it did not declare");
  const Value* input = node_.input(slot);
  if (!input) return kOmitted;
  const Fact& fact = store_.knownFact(*input, stepsLeft_);
  if (fact.contradicted) contradicted_ = true;
  return fact.shape;
}

std::optional<DataType> typeOf(const Value* value, int depth) {
  if (!value || depth > kMaxDepth) return std::nullopt;
  if (const Tensor* tensor = value->constantTensor()) return tensor->dataType();
  if (const onnx::TypeProto* declared = value->declaredType())
    if (declared->has_tensor_type() && declared->tensor_type().elem_type() != 0)
      return static_cast<DataType>(declared->tensor_type().elem_type());
  const OpShapeRule* rule = hasRuleOutput(*value) ? ruleFor(value->producer()->opType()) : nullptr;
  return rule ? rule->type(*value->producer(), depth) : std::nullopt;
}

}  // namespace

class ShapeFacts::Store : public ShapeStore {};

ShapeFacts::ShapeFacts() : store_(std::make_unique<Store>()) {}
ShapeFacts::~ShapeFacts() = default;

std::optional<std::vector<int64_t>> ShapeFacts::knownShape(const Value& value) {
  return store_->factsOf(value, kStepsAtQuery).at(kStepsAtQuery).shape;
}

void ShapeFacts::forget(const Value& value) { store_->forget(value); }

void ShapeFacts::forgetOutputsOf(const Node& node) {
  for (const Value* output : node.outputs())
    if (output) store_->forget(*output);
}

void ShapeFacts::clear() { store_->clear(); }

std::optional<std::vector<int64_t>> knownShape(const Value& value) { return ShapeFacts().knownShape(value); }

std::optional<DataType> knownElementType(const Value& value) { return typeOf(&value, 0); }

bool reshapeAllowsZero(const Node& reshape) { return reshape.attributeInt("allowzero", 0) != 0; }

}  // namespace bnfold::analysis
