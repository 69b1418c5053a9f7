#include "constant_eval.h"
#include "op_versions.h"
#include "understood_ops.h"

#include "analysis/shape_ops.h"
#include "analysis/value_shape.h"
#include "bnfold/dims_text.h"

#include <algorithm>
#include <cmath>
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

bool isQuantizationOp(const std::string& op) {
  return op == "DequantizeLinear" || op == "QuantizeLinear" || op == "DynamicQuantizeLinear" ||
         op.rfind("QLinear", 0) == 0;
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

/// One node's evaluation: its evaluated inputs and what every handler needs to report a result or a failure.
struct NodeEvaluation {
  const Node& node;
  std::vector<ResultPtr> inputs;
  std::vector<const Node*> nodes;  // the chain up to and including `node`, in evaluation order
  int64_t opset;
  int64_t byteLimit;
  MatchFailure* whyNot;

  const std::string& op() const { return node.opType(); }
  const Result* input(std::size_t i) const { return i < inputs.size() ? inputs[i].get() : nullptr; }
  const Result& x() const { return *inputs[0]; }

  ResultPtr fail(ReasonCode code, const std::string& problem) const {
    if (whyNot) *whyNot = {code, describe(node) + " " + problem};
    return nullptr;
  }
  ResultPtr unsupported(const std::string& problem) const { return fail(reason::kParamsNotConstant, problem); }

  /// Every computed op checks its output's size before allocating it.
  std::optional<ResultPtr> tooLarge(DataType type, const Dims& dims) const {
    const std::optional<int64_t> bytes = checkedByteSize(type, dims);
    if (!bytes || *bytes > byteLimit)
      return fail(reason::kConstantTooLarge, "would compute a tensor of dims " + formatDims(dims) +
                                                 ", more than the limit of " + std::to_string(byteLimit) +
                                                 " bytes for constant evaluation (--max-constant-size)");
    return std::nullopt;
  }

  ResultPtr finish(std::shared_ptr<Result> out) const {
    out->nodes = nodes;
    return out;
  }

  /// Input 0's bytes seen with the dims of `shape` (shape-only ops share a stored tensor's bytes).
  ResultPtr view(const analysis::OutputShape& shape) const {
    if (!shape.ok()) return unsupported(shape.message);
    auto out = std::make_shared<Result>(x());
    out->dims = shape.dims;
    return finish(out);
  }

  /// Integer operands (shapes, axes, indices) as int64.
  std::optional<std::vector<int64_t>> intsOf(std::size_t i) const {
    const Result* in = input(i);
    if (!in || !isIntegerType(in->type)) return std::nullopt;
    return in->intValues();
  }
};

// ---- one handler per op: its output from its evaluated inputs and attributes ----

ResultPtr evaluateIdentity(const NodeEvaluation& e) {
  analysis::OutputShape same;
  same.dims = e.x().dims;
  return e.view(same);
}

ResultPtr evaluateReshape(const NodeEvaluation& e) {
  std::vector<int64_t> shape;
  if (auto fromInput = e.intsOf(1)) shape = *fromInput;
  else if (e.node.hasAttribute("shape")) shape = e.node.attributeInts("shape");
  else return e.unsupported("has no constant int64 shape");
  return e.view(analysis::reshapeShape(e.x().dims, shape, analysis::reshapeAllowsZero(e.node)));
}

ResultPtr evaluateSqueezeOrUnsqueeze(const NodeEvaluation& e) {
  std::vector<int64_t> axes;
  if (e.input(1)) {
    auto fromInput = e.intsOf(1);
    if (!fromInput) return e.unsupported("has axes that are not int64");
    axes = *fromInput;
  } else {
    axes = e.node.attributeInts("axes");
  }
  return e.view(e.op() == "Unsqueeze" ? analysis::unsqueezeShape(e.x().dims, axes)
                                      : analysis::squeezeShape(e.x().dims, axes));
}

ResultPtr evaluateFlatten(const NodeEvaluation& e) {
  return e.view(analysis::flattenShape(e.x().dims, e.node.attributeInt("axis", 1)));
}

/// Sqrt, Reciprocal, Neg.
ResultPtr evaluateUnary(const NodeEvaluation& e) {
  const Result& x = e.x();
  const std::string& op = e.op();
  if (!x.floating() && op != "Neg") return e.unsupported("has a non-floating input");
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
  return e.finish(out);
}

/// Add, Sub, Mul, Div, Pow, and Max and Min of any number of inputs.
ResultPtr evaluateBinary(const NodeEvaluation& e) {
  const Result& x = e.x();
  const std::string& op = e.op();
  if (e.inputs.size() == 1) return e.finish(std::make_shared<Result>(x));  // Max/Min of one input
  std::shared_ptr<Result> acc;
  for (std::size_t i = 1; i < e.inputs.size(); ++i) {
    const Result& a = acc ? *acc : x;
    const Result* b = e.input(i);
    if (!b) return e.unsupported("has an omitted input");
    if (op != "Pow" && b->type != a.type) return e.unsupported("mixes element types");
    Dims bDims = b->dims;
    if (e.opset < kNumpyBroadcastOpset && e.node.attributeInt("broadcast", 0) != 0) {
      // Legacy broadcasting: B's dims stand at `axis` of A's (suffix-aligned without it).
      const auto rank = static_cast<int64_t>(a.dims.size());
      const int64_t axis = e.node.hasAttribute("axis") ? normalizedAxis(e.node.attributeInt("axis", 0), rank)
                                                       : rank - static_cast<int64_t>(bDims.size());
      if (axis < 0 || axis + static_cast<int64_t>(bDims.size()) > rank) return e.unsupported("has an invalid axis");
      Dims aligned(static_cast<std::size_t>(rank), 1);
      std::copy(bDims.begin(), bDims.end(), aligned.begin() + axis);
      bDims = aligned;
    } else if (e.opset < kNumpyBroadcastOpset && bDims != a.dims) {
      return e.unsupported("combines different shapes without broadcast=1 at opset " + std::to_string(e.opset));
    }
    const auto dims = broadcastDims(a.dims, bDims);
    if (!dims)
      return e.unsupported("has shapes " + formatDims(a.dims) + " and " + formatDims(b->dims) + " that do not broadcast");
    if (auto failure = e.tooLarge(a.type, *dims)) return *failure;
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
      for (std::size_t k = 0; k < out->reals.size(); ++k)
        out->reals[k] = applyReal(op, va[static_cast<std::size_t>(ia[k])], vb[static_cast<std::size_t>(ib[k])]);
    } else {
      if (!isIntegerType(b->type)) return e.unsupported("has a non-integer exponent for an integer base");
      const auto va = a.intValues();
      const auto vb = b->intValues();
      out->ints.resize(static_cast<std::size_t>(count));
      for (std::size_t k = 0; k < out->ints.size(); ++k) {
        auto v = applyInt(op, va[static_cast<std::size_t>(ia[k])], vb[static_cast<std::size_t>(ib[k])]);
        if (!v) return e.unsupported("divides an integer by zero");
        out->ints[k] = wrapToType(a.type, *v);
      }
    }
    acc = std::move(out);
  }
  return e.finish(acc);
}

ResultPtr evaluateCast(const NodeEvaluation& e) {
  const Result& x = e.x();
  const auto to = static_cast<DataType>(e.node.attributeInt("to", 0));
  if (!isSupportedType(to)) return e.unsupported("casts to " + dataTypeName(to) + ", which bnfold does not evaluate");
  if (auto failure = e.tooLarge(to, x.dims)) return *failure;
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
      if (!std::isfinite(v) || std::fabs(v) >= 9.2e18) return e.unsupported("casts a value out of integer range");
      out->ints.push_back(wrapToType(to, to == DataType::Bool ? (v != 0.0) : static_cast<int64_t>(std::trunc(v))));
    }
  } else {
    for (int64_t v : x.intValues()) out->ints.push_back(wrapToType(to, v));
  }
  return e.finish(out);
}

ResultPtr evaluateTranspose(const NodeEvaluation& e) {
  const Result& x = e.x();
  const analysis::OutputShape shape = analysis::transposeShape(x.dims, e.node.attributeInts("perm"));
  if (!shape.ok()) return e.unsupported(shape.message);
  if (auto failure = e.tooLarge(x.type, x.dims)) return *failure;
  const Dims inStrides = stridesOf(x.dims);
  Dims stride(shape.sourceAxis.size());
  for (std::size_t i = 0; i < shape.sourceAxis.size(); ++i)
    stride[i] = inStrides[static_cast<std::size_t>(shape.sourceAxis[i])];
  const auto index = stridedIndex(shape.dims, Dims(shape.dims.size(), 0), Dims(shape.dims.size(), 1), stride);
  return e.finish(gathered(x, shape.dims, index));
}

ResultPtr evaluateConcat(const NodeEvaluation& e) {
  const Result* first = e.input(0);
  const auto rank = static_cast<int64_t>(first->dims.size());
  const int64_t axis = normalizedAxis(e.node.attributeInt("axis", 0), rank);
  if (axis < 0 || axis >= rank) return e.unsupported("has an invalid axis");
  Dims dims = first->dims;
  dims[static_cast<std::size_t>(axis)] = 0;
  for (const auto& in : e.inputs) {
    if (!in || in->type != first->type || in->dims.size() != first->dims.size())
      return e.unsupported("has inputs of different types or ranks");
    for (int64_t i = 0; i < rank; ++i)
      if (i != axis && in->dims[static_cast<std::size_t>(i)] != first->dims[static_cast<std::size_t>(i)])
        return e.unsupported("has inputs whose dims differ off the concatenation axis");
    dims[static_cast<std::size_t>(axis)] += in->dims[static_cast<std::size_t>(axis)];
  }
  if (auto failure = e.tooLarge(first->type, dims)) return *failure;
  int64_t outer = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= dims[static_cast<std::size_t>(i)];
  auto out = std::make_shared<Result>();
  out->type = first->type;
  out->dims = dims;
  std::vector<std::vector<double>> reals;
  std::vector<std::vector<int64_t>> ints;
  for (const auto& in : e.inputs) {
    if (out->floating()) reals.push_back(in->realValues());
    else ints.push_back(in->intValues());
  }
  for (int64_t o = 0; o < outer; ++o) {
    for (std::size_t j = 0; j < e.inputs.size(); ++j) {
      const int64_t block = outer == 0 ? 0 : e.inputs[j]->count() / outer;
      const auto begin = static_cast<std::ptrdiff_t>(o * block);
      if (out->floating()) out->reals.insert(out->reals.end(), reals[j].begin() + begin, reals[j].begin() + begin + block);
      else out->ints.insert(out->ints.end(), ints[j].begin() + begin, ints[j].begin() + begin + block);
    }
  }
  return e.finish(out);
}

ResultPtr evaluateSlice(const NodeEvaluation& e) {
  const Result& x = e.x();
  const auto rank = static_cast<int64_t>(x.dims.size());
  std::vector<int64_t> starts, ends, axes, steps;
  if (e.input(1)) {
    auto s = e.intsOf(1), en = e.intsOf(2);
    if (!s || !en) return e.unsupported("has starts/ends that are not constant integers");
    starts = *s;
    ends = *en;
    if (e.input(3)) {
      auto a = e.intsOf(3);
      if (!a) return e.unsupported("has axes that are not constant integers");
      axes = *a;
    }
    if (e.input(4)) {
      auto st = e.intsOf(4);
      if (!st) return e.unsupported("has steps that are not constant integers");
      steps = *st;
    }
  } else {
    starts = e.node.attributeInts("starts");
    ends = e.node.attributeInts("ends");
    axes = e.node.attributeInts("axes");
  }
  if (axes.empty())
    for (std::size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    return e.unsupported("has starts, ends, axes and steps of different lengths");
  Dims begin(static_cast<std::size_t>(rank), 0), step(static_cast<std::size_t>(rank), 1), dims = x.dims;
  for (std::size_t i = 0; i < starts.size(); ++i) {
    const int64_t axis = normalizedAxis(axes[i], rank);
    if (axis < 0 || axis >= rank || steps[i] == 0) return e.unsupported("has an invalid axis or step");
    const int64_t dim = x.dims[static_cast<std::size_t>(axis)];
    int64_t s = starts[i] < 0 ? starts[i] + dim : starts[i];
    int64_t en = ends[i] < 0 && ends[i] > INT64_MIN + dim ? ends[i] + dim : ends[i];
    int64_t count = 0;
    if (steps[i] > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      en = std::clamp<int64_t>(en, 0, dim);
      count = en > s ? (en - s + steps[i] - 1) / steps[i] : 0;
    } else {
      s = std::clamp<int64_t>(s, -1, dim - 1);
      en = std::clamp<int64_t>(en, -1, dim - 1);
      count = s > en ? (s - en + (-steps[i]) - 1) / (-steps[i]) : 0;
    }
    begin[static_cast<std::size_t>(axis)] = s;
    step[static_cast<std::size_t>(axis)] = steps[i];
    dims[static_cast<std::size_t>(axis)] = count;
  }
  if (auto failure = e.tooLarge(x.type, dims)) return *failure;
  const auto index = stridedIndex(dims, begin, step, stridesOf(x.dims));
  return e.finish(gathered(x, std::move(dims), index));
}

ResultPtr evaluateGather(const NodeEvaluation& e) {
  const Result& x = e.x();
  auto indices = e.intsOf(1);
  if (!indices) return e.unsupported("has indices that are not constant integers");
  const auto rank = static_cast<int64_t>(x.dims.size());
  const int64_t axis = normalizedAxis(e.node.attributeInt("axis", 0), rank);
  if (axis < 0 || axis >= rank) return e.unsupported("has an invalid axis");
  const int64_t dim = x.dims[static_cast<std::size_t>(axis)];
  Dims dims(x.dims.begin(), x.dims.begin() + axis);
  dims.insert(dims.end(), e.input(1)->dims.begin(), e.input(1)->dims.end());
  dims.insert(dims.end(), x.dims.begin() + axis + 1, x.dims.end());
  if (auto failure = e.tooLarge(x.type, dims)) return *failure;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < axis; ++i) outer *= x.dims[static_cast<std::size_t>(i)];
  for (int64_t i = axis + 1; i < rank; ++i) inner *= x.dims[static_cast<std::size_t>(i)];
  std::vector<int64_t> index;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k : *indices) {
      const int64_t at = k < 0 ? k + dim : k;
      if (at < 0 || at >= dim) return e.unsupported("has an index out of range");
      for (int64_t i = 0; i < inner; ++i) index.push_back((o * dim + at) * inner + i);
    }
  return e.finish(gathered(x, std::move(dims), index));
}

ResultPtr evaluateExpand(const NodeEvaluation& e) {
  const Result& x = e.x();
  auto shape = e.intsOf(1);
  if (!shape) return e.unsupported("has a shape that is not constant integers");
  const auto dims = broadcastDims(x.dims, *shape);
  if (!dims)
    return e.unsupported("expands " + formatDims(x.dims) + " to " + formatDims(*shape) + ", which does not broadcast");
  if (auto failure = e.tooLarge(x.type, *dims)) return *failure;
  return e.finish(gathered(x, *dims, broadcastIndex(x.dims, *dims, *checkedElementCount(*dims))));
}

ResultPtr evaluateConstantOfShape(const NodeEvaluation& e) {
  auto shape = e.intsOf(0);
  if (!shape) return e.unsupported("has a shape that is not constant integers");
  const Tensor* fill = e.node.attributeTensor("value");
  const DataType type = fill ? fill->dataType() : DataType::Float;
  if (fill && (fill->elementCount() != 1 || !isSupportedType(type)))
    return e.unsupported("has a value that is not one number");
  if (auto failure = e.tooLarge(type, *shape)) return *failure;
  const int64_t count = *checkedElementCount(*shape);
  auto out = std::make_shared<Result>();
  out->type = type;
  out->dims = *shape;
  if (isFloatingPoint(type)) out->reals.assign(static_cast<std::size_t>(count), fill ? fill->toDoubles()[0] : 0.0);
  else out->ints.assign(static_cast<std::size_t>(count), fill->toInt64s()[0]);
  return e.finish(out);
}

/// An op the evaluator computes: its handler, and the versions it was written for (understood_ops.h).
struct ConstantOp {
  ResultPtr (*evaluate)(const NodeEvaluation&);
  const OpVersions* versions;
};

/// Every op constant evaluation computes, keyed by op type: adding an op is one entry.
const std::unordered_map<std::string, ConstantOp>& constantOps() {
  static const std::unordered_map<std::string, ConstantOp> table = {
      {"Identity", {evaluateIdentity, &kIdentity}},
      {"Reshape", {evaluateReshape, &kReshape}},
      {"Squeeze", {evaluateSqueezeOrUnsqueeze, &kSqueeze}},
      {"Unsqueeze", {evaluateSqueezeOrUnsqueeze, &kUnsqueeze}},
      {"Flatten", {evaluateFlatten, &kFlatten}},
      {"Sqrt", {evaluateUnary, &kSqrt}},
      {"Reciprocal", {evaluateUnary, &kReciprocal}},
      {"Neg", {evaluateUnary, &kNeg}},
      {"Add", {evaluateBinary, &kAdd}},
      {"Sub", {evaluateBinary, &kSub}},
      {"Mul", {evaluateBinary, &kMul}},
      {"Div", {evaluateBinary, &kDiv}},
      {"Pow", {evaluateBinary, &kPow}},
      {"Max", {evaluateBinary, &kMax}},
      {"Min", {evaluateBinary, &kMin}},
      {"Cast", {evaluateCast, &kCast}},
      {"Transpose", {evaluateTranspose, &kTranspose}},
      {"Concat", {evaluateConcat, &kConcat}},
      {"Slice", {evaluateSlice, &kSlice}},
      {"Gather", {evaluateGather, &kGather}},
      {"Expand", {evaluateExpand, &kExpand}},
      {"ConstantOfShape", {evaluateConstantOfShape, &kConstantOfShape}},
  };
  return table;
}

}  // namespace

bool isConstantFoldableOp(const Node& node) {
  return node.isOnnxDomain() && constantOps().count(node.opType()) != 0;
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
  if (auto problem = opsetProblem({*constantOps().at(producer->opType()).versions}, context_.opset(),
                                  "constant evaluation"))
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
  const NodeEvaluation evaluation{node, std::move(inputs), std::move(nodes), context_.opset(),
                                  context_.options().maxConstantBytes, whyNot};
  // Every op here reads input 0 (Concat's first operand gives the type and rank), so an omitted one ends it.
  if (!evaluation.input(0)) return evaluation.unsupported("has no first input");
  return constantOps().at(node.opType()).evaluate(evaluation);
}

}  // namespace bnfold
