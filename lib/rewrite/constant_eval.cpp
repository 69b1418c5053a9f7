#include "constant_eval.h"
#include "op_versions.h"
#include "understood_ops.h"

#include "bnfold/dims_text.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <optional>
#include <stdexcept>

namespace bnfold {

// An intermediate value: either a stored tensor's bytes seen with (possibly) other dims, or computed values.
struct ConstantEvaluator::Result {
  DataType type = DataType::Undefined;
  std::vector<int64_t> dims;
  const Tensor* alias = nullptr;  // the bytes are this tensor's (Identity, Reshape, ... of a stored tensor)
  std::vector<double> reals;      // floating types
  std::vector<int64_t> ints;      // integer types and bool
  std::vector<const Node*> nodes;

  bool floating() const { return isFloatingPoint(type); }
  int64_t count() const { return saturatingElementCount(dims); }
  std::vector<double> realValues() const { return alias ? alias->toDoubles() : reals; }
  std::vector<int64_t> intValues() const { return alias ? alias->toInt64s() : ints; }
};

namespace {

using Result = ConstantEvaluator::Result;
using ResultPtr = std::shared_ptr<const Result>;
using Dims = std::vector<int64_t>;

// A chain longer than this is not followed (the answer is then "not a constant").
constexpr int kMaxDepth = 64;

enum class OpKind { View, Unary, Binary, Cast, Transpose, Concat, Slice, Gather, Expand, ConstantOfShape };

const std::unordered_map<std::string, OpKind>& opTable() {
  static const std::unordered_map<std::string, OpKind> table = {
      {"Identity", OpKind::View},      {"Reshape", OpKind::View},     {"Squeeze", OpKind::View},
      {"Unsqueeze", OpKind::View},     {"Flatten", OpKind::View},     {"Sqrt", OpKind::Unary},
      {"Reciprocal", OpKind::Unary},   {"Neg", OpKind::Unary},        {"Add", OpKind::Binary},
      {"Sub", OpKind::Binary},         {"Mul", OpKind::Binary},       {"Div", OpKind::Binary},
      {"Pow", OpKind::Binary},         {"Max", OpKind::Binary},       {"Min", OpKind::Binary},
      {"Cast", OpKind::Cast},          {"Transpose", OpKind::Transpose}, {"Concat", OpKind::Concat},
      {"Slice", OpKind::Slice},        {"Gather", OpKind::Gather},    {"Expand", OpKind::Expand},
      {"ConstantOfShape", OpKind::ConstantOfShape},
  };
  return table;
}

bool isQuantizationOp(const std::string& op) {
  return op == "DequantizeLinear" || op == "QuantizeLinear" || op == "DynamicQuantizeLinear" ||
         op.rfind("QLinear", 0) == 0;
}

bool isIntegerType(DataType type) {
  switch (type) {
    case DataType::Int8: case DataType::Int16: case DataType::Int32: case DataType::Int64:
    case DataType::UInt8: case DataType::UInt16: case DataType::UInt32: case DataType::UInt64:
    case DataType::Bool:
      return true;
    default:
      return false;
  }
}

bool isSupportedType(DataType type) { return isFloatingPoint(type) || isIntegerType(type); }

/// An integer of `type` as stored: narrower types wrap, bool is 0 or 1.
int64_t wrapToType(DataType type, int64_t v) {
  switch (type) {
    case DataType::Int8: return static_cast<int8_t>(v);
    case DataType::Int16: return static_cast<int16_t>(v);
    case DataType::Int32: return static_cast<int32_t>(v);
    case DataType::UInt8: return static_cast<uint8_t>(v);
    case DataType::UInt16: return static_cast<uint16_t>(v);
    case DataType::UInt32: return static_cast<uint32_t>(v);
    case DataType::Bool: return v != 0;
    default: return v;
  }
}

std::unique_ptr<Tensor> integerTensor(DataType type, const Dims& dims, const std::vector<int64_t>& values) {
  auto proto = std::make_unique<onnx::TensorProto>();
  proto->set_data_type(static_cast<int32_t>(type));
  for (int64_t d : dims) proto->add_dims(d);
  const std::size_t size = elementSize(type);
  std::string raw(values.size() * size, '\0');
  for (std::size_t i = 0; i < values.size(); ++i) {
    const uint64_t bits = static_cast<uint64_t>(values[i]);
    for (std::size_t b = 0; b < size; ++b) raw[i * size + b] = static_cast<char>((bits >> (8 * b)) & 0xff);
  }
  proto->set_raw_data(std::move(raw));
  return std::make_unique<Tensor>(std::move(proto));
}

/// Values rounded to a floating `type` (as a Cast to it does).
std::vector<double> roundTo(DataType type, const Dims& dims, const std::vector<double>& values) {
  if (type == DataType::Double) return values;
  return Tensor::fromDoubles("", type, dims, values).toDoubles();
}

/// numpy broadcast of two shapes, or nullopt when they do not broadcast.
std::optional<Dims> broadcastDims(const Dims& a, const Dims& b) {
  const std::size_t rank = std::max(a.size(), b.size());
  Dims out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

/// For every element of `out` (row-major), the index of the element of `in` it reads under numpy broadcasting.
std::vector<int64_t> broadcastIndex(const Dims& in, const Dims& out, int64_t count) {
  const std::size_t rank = out.size();
  Dims strides(rank, 0);
  int64_t stride = 1;
  for (std::size_t k = 0; k < in.size(); ++k) {
    const std::size_t i = in.size() - 1 - k;
    const std::size_t o = rank - 1 - k;
    strides[o] = in[i] == 1 ? 0 : stride;
    stride *= in[i];
  }
  std::vector<int64_t> index(static_cast<std::size_t>(count));
  Dims position(rank, 0);
  int64_t source = 0;
  for (int64_t e = 0; e < count; ++e) {
    index[static_cast<std::size_t>(e)] = source;
    for (std::size_t k = rank; k-- > 0;) {
      source += strides[k];
      if (++position[k] < out[k]) break;
      source -= strides[k] * position[k];
      position[k] = 0;
    }
  }
  return index;
}

/// For every element of an output of `dims` (row-major), the input element it reads: the sum over the axes k of
/// (begin[k] + position[k] * step[k]) * stride[k].
std::vector<int64_t> stridedIndex(const Dims& dims, const Dims& begin, const Dims& step, const Dims& stride) {
  int64_t count = 1;
  for (int64_t d : dims) count *= d;
  std::vector<int64_t> index(static_cast<std::size_t>(count));
  Dims position(dims.size(), 0);
  for (int64_t e = 0; e < count; ++e) {
    int64_t source = 0;
    for (std::size_t k = 0; k < dims.size(); ++k) source += (begin[k] + position[k] * step[k]) * stride[k];
    index[static_cast<std::size_t>(e)] = source;
    for (std::size_t k = dims.size(); k-- > 0;) {
      if (++position[k] < dims[k]) break;
      position[k] = 0;
    }
  }
  return index;
}

/// Row-major strides of `dims`.
Dims stridesOf(const Dims& dims) {
  Dims strides(dims.size(), 1);
  for (std::size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  return strides;
}

/// A result whose element e is element index[e] of `source`.
std::shared_ptr<Result> gathered(const Result& source, Dims dims, const std::vector<int64_t>& index) {
  auto out = std::make_shared<Result>();
  out->type = source.type;
  out->dims = std::move(dims);
  if (source.floating()) {
    const std::vector<double> values = source.realValues();
    out->reals.reserve(index.size());
    for (int64_t i : index) out->reals.push_back(values[static_cast<std::size_t>(i)]);
  } else {
    const std::vector<int64_t> values = source.intValues();
    out->ints.reserve(index.size());
    for (int64_t i : index) out->ints.push_back(values[static_cast<std::size_t>(i)]);
  }
  return out;
}

int64_t normalizedAxis(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }

double applyReal(const std::string& op, double a, double b) {
  if (op == "Add") return a + b;
  if (op == "Sub") return a - b;
  if (op == "Mul") return a * b;
  if (op == "Div") return a / b;
  if (op == "Pow") return std::pow(a, b);
  if (op == "Max") return std::isnan(a) || std::isnan(b) ? std::nan("") : std::max(a, b);
  return std::isnan(a) || std::isnan(b) ? std::nan("") : std::min(a, b);  // Min
}

std::optional<int64_t> applyInt(const std::string& op, int64_t a, int64_t b) {
  if (op == "Add") return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  if (op == "Sub") return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
  if (op == "Mul") return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
  if (op == "Div") {
    if (b == 0 || (a == INT64_MIN && b == -1)) return std::nullopt;
    return a / b;
  }
  if (op == "Pow") return static_cast<int64_t>(std::pow(static_cast<double>(a), static_cast<double>(b)));
  if (op == "Max") return std::max(a, b);
  return std::min(a, b);  // Min
}

/// The versions of each op in opTable() that evaluation was written for (understood_ops.h).
std::vector<OpVersions> understoodVersions(const std::string& op) {
  static const std::vector<OpVersions> understood = {
      kIdentity, kReshape, kSqueeze, kUnsqueeze, kFlatten, kSqrt, kReciprocal, kNeg, kAdd, kSub, kMul, kDiv,
      kPow, kMax, kMin, kCast, kTranspose, kConcat, kSlice, kGather, kExpand, kConstantOfShape};
  for (const OpVersions& entry : understood)
    if (entry.op == op) return {entry};
  return {};
}

}  // namespace

bool isConstantFoldableOp(const Node& node) {
  return node.isOnnxDomain() && opTable().count(node.opType()) != 0;
}

ConstantEvaluator::ConstantEvaluator(const RuleContext& context) : context_(context) {}
ConstantEvaluator::~ConstantEvaluator() = default;

void ConstantEvaluator::forgetIfModelChanged() {
  const uint64_t changes = context_.model().changeCount();
  if (changes == cachedAtChange_) return;
  cachedAtChange_ = changes;
  if (!results_.empty()) results_.clear();
  if (!failures_.empty()) failures_.clear();
  if (!tensors_.empty()) tensors_.clear();
  handedOut_.clear();
}

const Tensor* ConstantEvaluator::evaluate(const Value& value, MatchFailure* whyNot) {
  forgetIfModelChanged();
  auto pend = [&](const Value* v) {
    if (std::find(handedOut_.begin(), handedOut_.end(), v) == handedOut_.end()) handedOut_.push_back(v);
  };
  if (auto known = tensors_.find(&value); known != tensors_.end()) {
    pend(&value);
    return known->second.tensor.get();
  }
  const Graph* graph = value.graph();
  if (graph && graph->parent() && context_.model().irVersion() < 4) {
    // IR version 3 lists every initializer among its graph's inputs, which a subgraph cannot take.
    if (whyNot)
      *whyNot = {reason::kParamsNotConstant, "'" + value.name() + "' is computed inside a subgraph of an IR version 3 "
                                        "model, where bnfold does not evaluate constant chains"};
    return nullptr;
  }
  ResultPtr result = evaluateValue(value, 0, whyNot);
  if (!result) return nullptr;

  EvaluatedConstant evaluated;
  evaluated.value = &value;
  evaluated.nodes = result->nodes;
  if (result->alias) {
    evaluated.tensor = std::make_unique<Tensor>(
        Tensor::deferred(value.name(), result->type, result->dims, result->alias->byteSource()));
  } else if (result->floating()) {
    evaluated.tensor = std::make_unique<Tensor>(Tensor::fromDoubles(value.name(), result->type, result->dims,
                                                                    result->reals));
  } else {
    evaluated.tensor = integerTensor(result->type, result->dims, result->ints);
    evaluated.tensor->setName(value.name());
  }
  const Tensor* tensor = evaluated.tensor.get();
  tensors_.emplace(&value, std::move(evaluated));
  pend(&value);
  return tensor;
}

std::vector<EvaluatedConstant> ConstantEvaluator::takeHandedOut() {
  std::vector<EvaluatedConstant> out;
  for (const Value* value : handedOut_) {
    auto it = tensors_.find(value);
    if (it == tensors_.end()) continue;
    out.push_back(std::move(it->second));
    tensors_.erase(it);
  }
  handedOut_.clear();
  return out;
}

ResultPtr ConstantEvaluator::evaluateValue(const Value& value, int depth, MatchFailure* whyNot) {
  auto fail = [&](ReasonCode code, std::string message) -> ResultPtr {
    MatchFailure failure{code, std::move(message)};
    failures_[&value] = failure;
    if (whyNot) *whyNot = std::move(failure);
    return nullptr;
  };
  if (auto known = results_.find(&value); known != results_.end()) return known->second;
  if (auto known = failures_.find(&value); known != failures_.end()) {
    if (whyNot) *whyNot = known->second;
    return nullptr;
  }

  const Node* producer = value.producer();
  if (value.initializer() || !producer || producer->isOnnxOp("Constant")) {
    // A leaf: the rules' own policy decides (overridable defaults, graph inputs, sparse initializers).
    MatchFailure why;
    const Tensor* tensor = nullptr;
    if (producer && context_.isKept(*producer))
      return fail(reason::kParamKeptByUser, "'" + value.name() + "' comes from Constant '" + producer->name() +
                                            "', which is kept by --keep/--keep-op");
    if (value.initializer() || !producer) {
      tensor = context_.constantOf(&value, &why);
    } else {
      tensor = value.constantTensor();
      if (!tensor) why = {reason::kParamsNotConstant, "Constant '" + producer->name() + "' holds no tensor bnfold reads"};
    }
    if (!tensor) return fail(why.code, why.message);
    if (!isSupportedType(tensor->dataType()))
      return fail(reason::kParamsNotConstant, "'" + value.name() + "' has type " + dataTypeName(tensor->dataType()) +
                                             ", which bnfold does not evaluate");
    auto leaf = std::make_shared<Result>();
    leaf->type = tensor->dataType();
    leaf->dims = tensor->dims();
    leaf->alias = tensor;
    results_[&value] = leaf;
    return leaf;
  }
  if (depth >= kMaxDepth)
    return fail(reason::kParamsNotConstant, "'" + value.name() + "' is computed by a chain of more than " +
                                           std::to_string(kMaxDepth) + " ops, which bnfold does not follow");
  if (producer->isOnnxDomain() && isQuantizationOp(producer->opType()))
    return fail(reason::kQuantizedWeights, "'" + value.name() + "' is computed by " + describe(*producer) +
                                         ": quantized weights are not folded into");
  if (!isConstantFoldableOp(*producer))
    return fail(reason::kParamsNotConstant, "'" + value.name() + "' is computed at run time by node '" +
                                           producer->name() + "' (" + producer->opType() + ")");
  if (auto problem = opsetProblem(understoodVersions(producer->opType()), context_.opset(), "constant evaluation"))
    return fail(reason::kParamsNotConstant, "'" + value.name() + "' is computed by " + describe(*producer) + ", but " +
                                               *problem);
  if (context_.isKept(*producer))
    return fail(reason::kParamKeptByUser, "'" + value.name() + "' is computed by " + describe(*producer) +
                                          ", which is kept by --keep/--keep-op");
  MatchFailure why;
  ResultPtr result = evaluateNode(*producer, depth, &why);
  if (!result) return fail(why.code, why.message);
  results_[&value] = result;
  return result;
}

ResultPtr ConstantEvaluator::evaluateNode(const Node& node, int depth, MatchFailure* whyNot) {
  const std::string& op = node.opType();
  auto fail = [&](ReasonCode code, const std::string& problem) -> ResultPtr {
    if (whyNot) *whyNot = {code, describe(node) + " " + problem};
    return nullptr;
  };
  auto unsupported = [&](const std::string& problem) { return fail(reason::kParamsNotConstant, problem); };

  // Inputs first (an omitted optional input stays null).
  std::vector<ResultPtr> inputs;
  std::vector<const Node*> nodes;
  for (const Value* input : node.inputs()) {
    if (!input) {
      inputs.push_back(nullptr);
      continue;
    }
    ResultPtr in = evaluateValue(*input, depth + 1, whyNot);
    if (!in) return nullptr;
    for (const Node* n : in->nodes)
      if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) nodes.push_back(n);
    inputs.push_back(std::move(in));
  }
  nodes.push_back(&node);
  auto input = [&](std::size_t i) -> const Result* { return i < inputs.size() ? inputs[i].get() : nullptr; };
  // Every op here reads input 0 (Concat's first operand gives the type and rank), so an omitted one ends it.
  if (!input(0)) return unsupported("has no first input");

  // Every computed op checks its output's size before allocating it.
  const int64_t limit = context_.options().maxConstantBytes;
  auto sizeOk = [&](DataType type, const Dims& dims, std::string* problem) {
    const auto count = checkedElementCount(dims);
    int64_t bytes = 0;
    if (!count || __builtin_mul_overflow(*count, static_cast<int64_t>(elementSize(type)), &bytes) ||
        bytes > limit) {
      *problem = "would compute a tensor of dims " + formatDims(dims) + ", more than the limit of " +
                 std::to_string(limit) + " bytes for constant evaluation (--max-constant-size)";
      return false;
    }
    return true;
  };
  auto tooLarge = [&](DataType type, const Dims& dims) -> std::optional<ResultPtr> {
    std::string problem;
    if (sizeOk(type, dims, &problem)) return std::nullopt;
    return fail(reason::kConstantTooLarge, problem);
  };
  auto finish = [&](std::shared_ptr<Result> out) -> ResultPtr {
    out->nodes = nodes;
    return out;
  };
  // Integer operands (shapes, axes, indices) as int64.
  auto intsOf = [&](std::size_t i) -> std::optional<std::vector<int64_t>> {
    const Result* in = input(i);
    if (!in || !isIntegerType(in->type)) return std::nullopt;
    return in->intValues();
  };

  const Result& x = *input(0);
  const OpKind kind = opTable().at(op);
  switch (kind) {
    case OpKind::View: {
      Dims dims;
      if (op == "Identity") {
        dims = x.dims;
      } else if (op == "Reshape") {
        std::vector<int64_t> shape;
        if (auto fromInput = intsOf(1)) shape = *fromInput;
        else if (node.hasAttribute("shape")) shape = node.attributeInts("shape");
        else return unsupported("has no constant int64 shape");
        const bool allowZero = node.attributeInt("allowzero", 0) != 0;
        int64_t known = 1;
        int inferred = -1;
        for (std::size_t i = 0; i < shape.size(); ++i) {
          int64_t d = shape[i];
          if (d == 0 && !allowZero) {
            if (i >= x.dims.size()) return unsupported("copies dim " + std::to_string(i) + " that does not exist");
            d = x.dims[i];
          }
          if (d == -1) {
            if (inferred >= 0) return unsupported("has two -1 dims");
            inferred = static_cast<int>(i);
            dims.push_back(-1);
            continue;
          }
          if (d < 0) return unsupported("has a negative target dim");
          dims.push_back(d);
          const std::optional<int64_t> product = checkedProduct(known, d);
          if (!product) return unsupported("reshapes to dims whose element count does not fit in 64 bits");
          known = *product;
        }
        const int64_t total = x.count();
        if (inferred >= 0) {
          if (known == 0 || total % known != 0) return unsupported("cannot infer its -1 dim");
          dims[static_cast<std::size_t>(inferred)] = total / known;
        } else if (known != total) {
          return unsupported("reshapes " + formatDims(x.dims) + " to " + formatDims(dims) + ", a different size");
        }
      } else if (op == "Unsqueeze" || op == "Squeeze") {
        std::vector<int64_t> axes;
        if (input(1)) {
          auto fromInput = intsOf(1);
          if (!fromInput) return unsupported("has axes that are not int64");
          axes = *fromInput;
        } else {
          axes = node.attributeInts("axes");
        }
        if (op == "Unsqueeze") {
          const auto rank = static_cast<int64_t>(x.dims.size() + axes.size());
          std::vector<bool> inserted(static_cast<std::size_t>(rank), false);
          for (int64_t a : axes) {
            a = normalizedAxis(a, rank);
            if (a < 0 || a >= rank || inserted[static_cast<std::size_t>(a)]) return unsupported("has invalid axes");
            inserted[static_cast<std::size_t>(a)] = true;
          }
          std::size_t next = 0;
          for (int64_t i = 0; i < rank; ++i) dims.push_back(inserted[static_cast<std::size_t>(i)] ? 1 : x.dims[next++]);
        } else {
          const auto rank = static_cast<int64_t>(x.dims.size());
          std::vector<bool> removed(x.dims.size(), false);
          for (int64_t a : axes) {
            a = normalizedAxis(a, rank);
            if (a < 0 || a >= rank || x.dims[static_cast<std::size_t>(a)] != 1)
              return unsupported("squeezes an axis that is not of size 1");
            removed[static_cast<std::size_t>(a)] = true;
          }
          for (std::size_t i = 0; i < x.dims.size(); ++i)
            if (!(axes.empty() ? x.dims[i] == 1 : removed[i])) dims.push_back(x.dims[i]);
        }
      } else {  // Flatten
        const auto rank = static_cast<int64_t>(x.dims.size());
        const int64_t axis = normalizedAxis(node.attributeInt("axis", 1), rank);
        if (axis < 0 || axis > rank) return unsupported("has an invalid axis");
        int64_t outer = 1, inner = 1;
        for (int64_t i = 0; i < rank; ++i) (i < axis ? outer : inner) *= x.dims[static_cast<std::size_t>(i)];
        dims = {outer, inner};
      }
      auto out = std::make_shared<Result>(x);
      out->dims = std::move(dims);
      return finish(out);
    }
    case OpKind::Unary: {
      if (!x.floating() && op != "Neg") return unsupported("has a non-floating input");
      auto out = std::make_shared<Result>();
      out->type = x.type;
      out->dims = x.dims;
      if (x.floating()) {
        out->reals = x.realValues();
        for (double& v : out->reals) v = op == "Sqrt" ? std::sqrt(v) : op == "Reciprocal" ? 1.0 / v : -v;
      } else {
        out->ints = x.intValues();
        for (int64_t& v : out->ints) v = wrapToType(x.type, -v);
      }
      return finish(out);
    }
    case OpKind::Binary: {
      std::shared_ptr<Result> acc;
      for (std::size_t i = 1; i < inputs.size() || (i == 1 && inputs.size() == 1); ++i) {
        const Result& a = acc ? *acc : x;
        if (inputs.size() == 1) return finish(std::make_shared<Result>(x));  // Max/Min of one input
        const Result* b = input(i);
        if (!b) return unsupported("has an omitted input");
        if (op != "Pow" && b->type != a.type) return unsupported("mixes element types");
        Dims bDims = b->dims;
        if (context_.opset() < kNumpyBroadcastOpset && node.attributeInt("broadcast", 0) != 0) {
          // Legacy broadcasting: B's dims stand at `axis` of A's (suffix-aligned without it).
          const auto rank = static_cast<int64_t>(a.dims.size());
          const int64_t axis = node.hasAttribute("axis") ? normalizedAxis(node.attributeInt("axis", 0), rank)
                                                         : rank - static_cast<int64_t>(bDims.size());
          if (axis < 0 || axis + static_cast<int64_t>(bDims.size()) > rank) return unsupported("has an invalid axis");
          Dims aligned(static_cast<std::size_t>(rank), 1);
          std::copy(bDims.begin(), bDims.end(), aligned.begin() + axis);
          bDims = aligned;
        } else if (context_.opset() < kNumpyBroadcastOpset && bDims != a.dims) {
          return unsupported("combines different shapes without broadcast=1 at opset " +
                             std::to_string(context_.opset()));
        }
        const auto dims = broadcastDims(a.dims, bDims);
        if (!dims) return unsupported("has shapes " + formatDims(a.dims) + " and " + formatDims(b->dims) +
                                      " that do not broadcast");
        if (auto failure = tooLarge(a.type, *dims)) return *failure;
        const int64_t count = *checkedElementCount(dims.value());
        const auto ia = broadcastIndex(a.dims, *dims, count);
        const auto ib = broadcastIndex(bDims, *dims, count);
        auto out = std::make_shared<Result>();
        out->type = a.type;
        out->dims = *dims;
        if (a.floating()) {
          const auto va = a.realValues();
          const auto vb = b->realValues();
          out->reals.resize(static_cast<std::size_t>(count));
          for (std::size_t e = 0; e < out->reals.size(); ++e)
            out->reals[e] = applyReal(op, va[static_cast<std::size_t>(ia[e])], vb[static_cast<std::size_t>(ib[e])]);
        } else {
          if (!isIntegerType(b->type)) return unsupported("has a non-integer exponent for an integer base");
          const auto va = a.intValues();
          const auto vb = b->intValues();
          out->ints.resize(static_cast<std::size_t>(count));
          for (std::size_t e = 0; e < out->ints.size(); ++e) {
            auto v = applyInt(op, va[static_cast<std::size_t>(ia[e])], vb[static_cast<std::size_t>(ib[e])]);
            if (!v) return unsupported("divides an integer by zero");
            out->ints[e] = wrapToType(a.type, *v);
          }
        }
        acc = std::move(out);
      }
      return finish(acc);
    }
    case OpKind::Cast: {
      const auto to = static_cast<DataType>(node.attributeInt("to", 0));
      if (!isSupportedType(to)) return unsupported("casts to " + dataTypeName(to) + ", which bnfold does not evaluate");
      if (auto failure = tooLarge(to, x.dims)) return *failure;
      auto out = std::make_shared<Result>();
      out->type = to;
      out->dims = x.dims;
      if (isFloatingPoint(to)) {
        if (x.floating()) {
          out->reals = roundTo(to, x.dims, x.realValues());
        } else {
          for (int64_t v : x.intValues()) out->reals.push_back(static_cast<double>(v));
          out->reals = roundTo(to, x.dims, out->reals);
        }
      } else if (x.floating()) {
        for (double v : x.realValues()) {
          if (!std::isfinite(v) || std::fabs(v) >= 9.2e18) return unsupported("casts a value out of integer range");
          out->ints.push_back(wrapToType(to, to == DataType::Bool ? (v != 0.0) : static_cast<int64_t>(std::trunc(v))));
        }
      } else {
        for (int64_t v : x.intValues()) out->ints.push_back(wrapToType(to, v));
      }
      return finish(out);
    }
    case OpKind::Transpose: {
      const auto rank = static_cast<int64_t>(x.dims.size());
      std::vector<int64_t> perm = node.attributeInts("perm");
      if (perm.empty())
        for (int64_t i = rank - 1; i >= 0; --i) perm.push_back(i);
      std::vector<int64_t> sorted = perm;
      std::sort(sorted.begin(), sorted.end());
      std::vector<int64_t> identity(static_cast<std::size_t>(rank));
      std::iota(identity.begin(), identity.end(), 0);
      if (sorted != identity) return unsupported("has an invalid perm");
      if (auto failure = tooLarge(x.type, x.dims)) return *failure;
      const Dims inStrides = stridesOf(x.dims);
      Dims dims(perm.size()), stride(perm.size());
      for (std::size_t i = 0; i < perm.size(); ++i) {
        dims[i] = x.dims[static_cast<std::size_t>(perm[i])];
        stride[i] = inStrides[static_cast<std::size_t>(perm[i])];
      }
      const auto index = stridedIndex(dims, Dims(dims.size(), 0), Dims(dims.size(), 1), stride);
      return finish(gathered(x, std::move(dims), index));
    }
    case OpKind::Concat: {
      const Result* first = input(0);
      const auto rank = static_cast<int64_t>(first->dims.size());
      const int64_t axis = normalizedAxis(node.attributeInt("axis", 0), rank);
      if (axis < 0 || axis >= rank) return unsupported("has an invalid axis");
      Dims dims = first->dims;
      dims[static_cast<std::size_t>(axis)] = 0;
      for (const auto& in : inputs) {
        if (!in || in->type != first->type || in->dims.size() != first->dims.size())
          return unsupported("has inputs of different types or ranks");
        for (int64_t i = 0; i < rank; ++i)
          if (i != axis && in->dims[static_cast<std::size_t>(i)] != first->dims[static_cast<std::size_t>(i)])
            return unsupported("has inputs whose dims differ off the concatenation axis");
        dims[static_cast<std::size_t>(axis)] += in->dims[static_cast<std::size_t>(axis)];
      }
      if (auto failure = tooLarge(first->type, dims)) return *failure;
      int64_t outer = 1;
      for (int64_t i = 0; i < axis; ++i) outer *= dims[static_cast<std::size_t>(i)];
      auto out = std::make_shared<Result>();
      out->type = first->type;
      out->dims = dims;
      std::vector<std::vector<double>> reals;
      std::vector<std::vector<int64_t>> ints;
      for (const auto& in : inputs) {
        if (out->floating()) reals.push_back(in->realValues());
        else ints.push_back(in->intValues());
      }
      for (int64_t o = 0; o < outer; ++o) {
        for (std::size_t j = 0; j < inputs.size(); ++j) {
          const int64_t block = outer == 0 ? 0 : inputs[j]->count() / outer;
          const auto begin = static_cast<std::ptrdiff_t>(o * block);
          if (out->floating()) out->reals.insert(out->reals.end(), reals[j].begin() + begin, reals[j].begin() + begin + block);
          else out->ints.insert(out->ints.end(), ints[j].begin() + begin, ints[j].begin() + begin + block);
        }
      }
      return finish(out);
    }
    case OpKind::Slice: {
      const auto rank = static_cast<int64_t>(x.dims.size());
      std::vector<int64_t> starts, ends, axes, steps;
      if (input(1)) {
        auto s = intsOf(1), e = intsOf(2);
        if (!s || !e) return unsupported("has starts/ends that are not constant integers");
        starts = *s;
        ends = *e;
        if (input(3)) {
          auto a = intsOf(3);
          if (!a) return unsupported("has axes that are not constant integers");
          axes = *a;
        }
        if (input(4)) {
          auto st = intsOf(4);
          if (!st) return unsupported("has steps that are not constant integers");
          steps = *st;
        }
      } else {
        starts = node.attributeInts("starts");
        ends = node.attributeInts("ends");
        axes = node.attributeInts("axes");
      }
      if (axes.empty())
        for (std::size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
      if (steps.empty()) steps.assign(starts.size(), 1);
      if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
        return unsupported("has starts, ends, axes and steps of different lengths");
      Dims begin(static_cast<std::size_t>(rank), 0), step(static_cast<std::size_t>(rank), 1), dims = x.dims;
      for (std::size_t i = 0; i < starts.size(); ++i) {
        const int64_t axis = normalizedAxis(axes[i], rank);
        if (axis < 0 || axis >= rank || steps[i] == 0) return unsupported("has an invalid axis or step");
        const int64_t dim = x.dims[static_cast<std::size_t>(axis)];
        int64_t s = starts[i] < 0 ? starts[i] + dim : starts[i];
        int64_t e = ends[i] < 0 && ends[i] > INT64_MIN + dim ? ends[i] + dim : ends[i];
        int64_t count = 0;
        if (steps[i] > 0) {
          s = std::clamp<int64_t>(s, 0, dim);
          e = std::clamp<int64_t>(e, 0, dim);
          count = e > s ? (e - s + steps[i] - 1) / steps[i] : 0;
        } else {
          s = std::clamp<int64_t>(s, -1, dim - 1);
          e = std::clamp<int64_t>(e, -1, dim - 1);
          count = s > e ? (s - e + (-steps[i]) - 1) / (-steps[i]) : 0;
        }
        begin[static_cast<std::size_t>(axis)] = s;
        step[static_cast<std::size_t>(axis)] = steps[i];
        dims[static_cast<std::size_t>(axis)] = count;
      }
      if (auto failure = tooLarge(x.type, dims)) return *failure;
      const auto index = stridedIndex(dims, begin, step, stridesOf(x.dims));
      return finish(gathered(x, std::move(dims), index));
    }
    case OpKind::Gather: {
      auto indices = intsOf(1);
      if (!indices) return unsupported("has indices that are not constant integers");
      const auto rank = static_cast<int64_t>(x.dims.size());
      const int64_t axis = normalizedAxis(node.attributeInt("axis", 0), rank);
      if (axis < 0 || axis >= rank) return unsupported("has an invalid axis");
      const int64_t dim = x.dims[static_cast<std::size_t>(axis)];
      Dims dims(x.dims.begin(), x.dims.begin() + axis);
      dims.insert(dims.end(), input(1)->dims.begin(), input(1)->dims.end());
      dims.insert(dims.end(), x.dims.begin() + axis + 1, x.dims.end());
      if (auto failure = tooLarge(x.type, dims)) return *failure;
      int64_t outer = 1, inner = 1;
      for (int64_t i = 0; i < axis; ++i) outer *= x.dims[static_cast<std::size_t>(i)];
      for (int64_t i = axis + 1; i < rank; ++i) inner *= x.dims[static_cast<std::size_t>(i)];
      std::vector<int64_t> index;
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t k : *indices) {
          const int64_t at = k < 0 ? k + dim : k;
          if (at < 0 || at >= dim) return unsupported("has an index out of range");
          for (int64_t i = 0; i < inner; ++i) index.push_back((o * dim + at) * inner + i);
        }
      return finish(gathered(x, std::move(dims), index));
    }
    case OpKind::Expand: {
      auto shape = intsOf(1);
      if (!shape) return unsupported("has a shape that is not constant integers");
      const auto dims = broadcastDims(x.dims, *shape);
      if (!dims) return unsupported("expands " + formatDims(x.dims) + " to " + formatDims(*shape) + ", which does not broadcast");
      if (auto failure = tooLarge(x.type, *dims)) return *failure;
      return finish(gathered(x, *dims, broadcastIndex(x.dims, *dims, *checkedElementCount(*dims))));
    }
    case OpKind::ConstantOfShape: {
      auto shape = intsOf(0);
      if (!shape) return unsupported("has a shape that is not constant integers");
      const Tensor* fill = node.attributeTensor("value");
      const DataType type = fill ? fill->dataType() : DataType::Float;
      if (fill && (fill->elementCount() != 1 || !isSupportedType(type)))
        return unsupported("has a value that is not one number");
      if (auto failure = tooLarge(type, *shape)) return *failure;
      const int64_t count = *checkedElementCount(*shape);
      auto out = std::make_shared<Result>();
      out->type = type;
      out->dims = *shape;
      if (isFloatingPoint(type)) out->reals.assign(static_cast<std::size_t>(count), fill ? fill->toDoubles()[0] : 0.0);
      else out->ints.assign(static_cast<std::size_t>(count), fill->toInt64s()[0]);
      return finish(out);
    }
  }
  return unsupported("is not evaluated");
}

}  // namespace bnfold
