// The reference kernels against ONNX Runtime on a seeded table of random cases. Every case is a one-node model
// whose operands are all initializers; scripts/ort/run_cases.js runs the whole folder in one node start-up (graph
// optimisation off) and writes each model's outputs as JSON, which we compare element-wise with the kernel:
//   |ort - ref| <= atol + rtol * |ort|,  float: atol 1e-5, rtol 1e-4;  double: atol 1e-10, rtol 1e-10;
//   int64: exact.
// A case ORT refuses to load or run fails the test, except for op/dtype pairs listed as excluded (ORT CPU has no
// kernel for them); those are reported, and compared like any other case should ORT ever run them.
#include <catch2/catch.hpp>

#include "test_support.h"
#include "verify/reference_kernels.h"

#include <onnx/onnx_pb.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

namespace v = bnfold::verify;
using v::Array;
using v::Dims;

constexpr uint64_t kSeed = 20261115;

// ---------------------------------------------------------------------------------------------------------------
// Element types

template <typename T>
struct TypeInfo;
template <>
struct TypeInfo<float> {
  static constexpr int onnx = onnx::TensorProto::FLOAT;
  static constexpr const char* name = "float";
};
template <>
struct TypeInfo<double> {
  static constexpr int onnx = onnx::TensorProto::DOUBLE;
  static constexpr const char* name = "double";
};
template <>
struct TypeInfo<int64_t> {
  static constexpr int onnx = onnx::TensorProto::INT64;
  static constexpr const char* name = "int64";
};

std::string dimsText(const Dims& dims) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < dims.size(); ++i) out << (i ? "," : "") << dims[i];
  return out.str() + "]";
}

// ---------------------------------------------------------------------------------------------------------------
// Random operands

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(engine_); }
  double real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(engine_); }
  bool chance(double p) { return real(0, 1) < p; }
  template <typename T>
  T pick(const std::vector<T>& options) {
    return options[static_cast<size_t>(integer(0, static_cast<int64_t>(options.size()) - 1))];
  }
  /// Uniform in [lo, hi); integers in [lo, hi].
  template <typename T>
  Array<T> array(const Dims& dims, double lo = -1, double hi = 1) {
    Array<T> a{dims, std::vector<T>(static_cast<size_t>(v::elementCount(dims)))};
    for (T& value : a.data) {
      if constexpr (std::is_integral_v<T>) value = static_cast<T>(integer(static_cast<int64_t>(lo), static_cast<int64_t>(hi)));
      else value = static_cast<T>(real(lo, hi));
    }
    return a;
  }
  /// Magnitude in [0.5, 2) with a random sign: safe denominators.
  template <typename T>
  Array<T> awayFromZero(const Dims& dims) {
    Array<T> a = array<T>(dims, 0.5, 2);
    for (T& value : a.data)
      if (chance(0.5)) value = -value;
    return a;
  }

 private:
  std::mt19937_64 engine_;
};

// ---------------------------------------------------------------------------------------------------------------
// Cases

struct Expected {
  Dims dims;
  std::vector<double> values;
  bool exact = false;  // integers
  double atol = 0, rtol = 0;
};

template <typename T>
Expected expected(const Array<T>& a) {
  Expected e;
  e.dims = a.dims;
  e.values.assign(a.data.begin(), a.data.end());
  if constexpr (std::is_integral_v<T>) {
    e.exact = true;
  } else if constexpr (std::is_same_v<T, float>) {
    e.atol = 1e-5;
    e.rtol = 1e-4;
  } else {
    e.atol = 1e-10;
    e.rtol = 1e-10;
  }
  return e;
}

struct Case {
  std::string op;           // for the summary: "Conv", "BatchNormalization-train-9", ...
  std::string dtype;
  std::string description;  // op, dtype, shapes, attributes: printed on failure
  onnx::ModelProto model;
  std::vector<Expected> outputs;
};

/// A one-node model under construction; operands become initializers in0, in1, ...
class CaseBuilder {
 public:
  CaseBuilder(const std::string& op, int64_t opset, std::string dtype) {
    case_.op = op;
    case_.dtype = std::move(dtype);
    onnx::ModelProto& m = case_.model;
    m.set_ir_version(8);
    m.set_producer_name("bnfold-test");
    auto* import = m.add_opset_import();
    import->set_domain("");
    import->set_version(opset);
    m.mutable_graph()->set_name("case");
    node_ = m.mutable_graph()->add_node();
    node_->set_op_type(op);
    text_ << op << "-" << opset << " " << case_.dtype;
  }

  template <typename T>
  CaseBuilder& input(const Array<T>& a, const char* label) {
    const std::string name = "in" + std::to_string(inputs_++);
    onnx::TensorProto* t = case_.model.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(TypeInfo<T>::onnx);
    for (int64_t d : a.dims) t->add_dims(d);
    t->set_raw_data(std::string(reinterpret_cast<const char*>(a.data.data()), a.data.size() * sizeof(T)));
    node_->add_input(name);
    text_ << " " << label << dimsText(a.dims);
    return *this;
  }
  CaseBuilder& absentInput() {
    node_->add_input("");
    return *this;
  }
  /// An int64 operand shown with its values (shapes, axes, starts...).
  CaseBuilder& intsInput(const std::vector<int64_t>& values, const char* label) {
    Array<int64_t> a{{static_cast<int64_t>(values.size())}, values};
    const std::string name = "in" + std::to_string(inputs_++);
    onnx::TensorProto* t = case_.model.mutable_graph()->add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    t->set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t)));
    node_->add_input(name);
    text_ << " " << label << "=" << dimsText(values);
    return *this;
  }
  CaseBuilder& ints(const char* name, const std::vector<int64_t>& values) {
    auto* attr = node_->add_attribute();
    attr->set_name(name);
    attr->set_type(onnx::AttributeProto::INTS);
    for (int64_t value : values) attr->add_ints(value);
    text_ << " " << name << "=" << dimsText(values);
    return *this;
  }
  CaseBuilder& integer(const char* name, int64_t value) {
    auto* attr = node_->add_attribute();
    attr->set_name(name);
    attr->set_type(onnx::AttributeProto::INT);
    attr->set_i(value);
    text_ << " " << name << "=" << value;
    return *this;
  }
  CaseBuilder& real(const char* name, float value) {
    auto* attr = node_->add_attribute();
    attr->set_name(name);
    attr->set_type(onnx::AttributeProto::FLOAT);
    attr->set_f(value);
    text_ << " " << name << "=" << std::setprecision(9) << value;
    return *this;
  }
  CaseBuilder& string(const char* name, const std::string& value) {
    auto* attr = node_->add_attribute();
    attr->set_name(name);
    attr->set_type(onnx::AttributeProto::STRING);
    attr->set_s(value);
    text_ << " " << name << "=" << value;
    return *this;
  }
  CaseBuilder& note(const std::string& text) {
    text_ << " " << text;
    return *this;
  }
  template <typename T>
  CaseBuilder& output(const Array<T>& reference) {
    const std::string name = "out" + std::to_string(case_.outputs.size());
    node_->add_output(name);
    auto* info = case_.model.mutable_graph()->add_output();
    info->set_name(name);
    info->mutable_type()->mutable_tensor_type()->set_elem_type(TypeInfo<T>::onnx);
    case_.outputs.push_back(expected(reference));
    return *this;
  }
  Case finish() {
    case_.description = text_.str();
    return std::move(case_);
  }

 private:
  Case case_;
  onnx::NodeProto* node_ = nullptr;
  int inputs_ = 0;
  std::ostringstream text_;
};

/// ConvAttributes as ONNX attributes (only those set).
void convAttributes(CaseBuilder& b, const v::ConvAttributes& a) {
  if (!a.kernelShape.empty()) b.ints("kernel_shape", a.kernelShape);
  if (!a.strides.empty()) b.ints("strides", a.strides);
  if (!a.dilations.empty()) b.ints("dilations", a.dilations);
  if (!a.pads.empty()) b.ints("pads", a.pads);
  if (!a.outputPadding.empty()) b.ints("output_padding", a.outputPadding);
  if (!a.outputShape.empty()) b.ints("output_shape", a.outputShape);
  if (a.group != 1) b.integer("group", a.group);
  if (a.autoPad != "NOTSET") b.string("auto_pad", a.autoPad);
}

/// Group layout: plain, grouped or depthwise. Returns {group, in channels per group, out channels per group}.
std::array<int64_t, 3> randomGroups(Rng& r) {
  switch (r.integer(0, 3)) {
    case 1: return {r.integer(2, 3), r.integer(1, 3), r.integer(1, 3)};
    case 2: return {r.integer(2, 4), 1, r.integer(1, 2)};  // depthwise (channel multiplier 1 or 2)
    default: return {1, r.integer(1, 4), r.integer(1, 4)};
  }
}

template <typename T>
Case convCase(Rng& r, size_t n) {
  const auto [group, inPerGroup, outPerGroup] = randomGroups(r);
  v::ConvAttributes a;
  a.group = group;
  a.autoPad = r.pick<std::string>({"NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"});
  const int64_t maxKernel = n == 3 ? 2 : 3;
  const bool withStrides = r.chance(0.8), withDilations = r.chance(0.8);
  const bool withPads = a.autoPad == "NOTSET" && r.chance(0.8);
  Dims kernel(n), strides(n), dilations(n), in(n), padBegin(n, 0), padEnd(n, 0);
  for (size_t d = 0; d < n; ++d) {
    kernel[d] = r.integer(1, maxKernel);
    strides[d] = withStrides ? r.integer(1, 3) : 1;
    // ORT refuses auto_pad SAME_* with a dilation ("Dilation not supported for AutoPadType::SAME_UPPER or
    // AutoPadType::SAME_LOWER"): that form is left out here (the kernel follows the spec's formula for it).
    dilations[d] = a.autoPad.rfind("SAME", 0) == 0 || !withDilations ? 1 : r.integer(1, 2);
    const int64_t reach = (kernel[d] - 1) * dilations[d] + 1;
    if (withPads) {
      padBegin[d] = r.integer(0, 2);
      padEnd[d] = r.integer(0, 2);
    }
    const int64_t minimum = a.autoPad == "NOTSET" ? std::max<int64_t>(1, reach - padBegin[d] - padEnd[d])
                            : a.autoPad == "VALID" ? reach : 1;
    in[d] = minimum + r.integer(0, n == 3 ? 2 : 4);
  }
  if (r.chance(0.5)) a.kernelShape = kernel;
  if (withStrides) a.strides = strides;
  if (withDilations) a.dilations = dilations;
  if (withPads) {
    a.pads = padBegin;
    a.pads.insert(a.pads.end(), padEnd.begin(), padEnd.end());
  }
  Dims xDims{r.integer(1, 2), group * inPerGroup};
  xDims.insert(xDims.end(), in.begin(), in.end());
  Dims wDims{group * outPerGroup, inPerGroup};
  wDims.insert(wDims.end(), kernel.begin(), kernel.end());
  const Array<T> x = r.array<T>(xDims), w = r.array<T>(wDims), bias = r.array<T>({group * outPerGroup});
  const bool withBias = r.chance(0.5);
  CaseBuilder b("Conv", 11, TypeInfo<T>::name);
  b.input(x, "X").input(w, "W");
  if (withBias) b.input(bias, "B");
  convAttributes(b, a);
  b.output(v::conv(x, w, withBias ? &bias : nullptr, a));
  return b.finish();
}

// A pool's random window geometry (kernel, strides, dilations, pads or auto_pad) and an input it fits.
struct PoolGeometry {
  v::ConvAttributes attributes;
  Dims xDims;
};

PoolGeometry randomPoolGeometry(Rng& r, size_t n, double dilationChance) {
  v::ConvAttributes a;
  a.autoPad = r.pick<std::string>({"NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"});
  const bool withStrides = r.chance(0.8), withDilations = r.chance(dilationChance);
  const bool withPads = a.autoPad == "NOTSET" && r.chance(0.8);
  Dims kernel(n), strides(n), dilations(n), in(n), padBegin(n, 0), padEnd(n, 0);
  for (size_t d = 0; d < n; ++d) {
    kernel[d] = r.integer(1, n == 3 ? 2 : 3);
    const bool same = a.autoPad.rfind("SAME", 0) == 0;
    dilations[d] = same || !withDilations ? 1 : r.integer(1, 2);
    const int64_t reach = (kernel[d] - 1) * dilations[d] + 1;
    // ORT refuses SAME_* where a stride beyond the window makes the spec's pad negative (Conv clamps it to 0).
    strides[d] = withStrides ? r.integer(1, same ? std::min<int64_t>(3, reach) : 3) : 1;
    // ONNX: a pad must be smaller than the kernel, so no window lies wholly in the padding.
    if (withPads) {
      padBegin[d] = r.integer(0, kernel[d] - 1);
      padEnd[d] = r.integer(0, kernel[d] - 1);
    }
    const int64_t minimum = a.autoPad == "NOTSET"  ? std::max<int64_t>(1, reach - padBegin[d] - padEnd[d])
                            : a.autoPad == "VALID" ? reach
                                                   : 1;
    in[d] = std::max<int64_t>(minimum, reach) + r.integer(0, n == 3 ? 2 : 4);
  }
  a.kernelShape = kernel;
  if (withStrides) a.strides = strides;
  if (withDilations) a.dilations = dilations;
  if (withPads) {
    a.pads = padBegin;
    a.pads.insert(a.pads.end(), padEnd.begin(), padEnd.end());
  }
  Dims xDims{r.integer(1, 2), r.integer(1, 3)};
  xDims.insert(xDims.end(), in.begin(), in.end());
  return {a, xDims};
}

template <typename T>
Case maxPoolCase(Rng& r, size_t n) {
  const PoolGeometry pool = randomPoolGeometry(r, n, 0.6);
  const Array<T> x = r.array<T>(pool.xDims);
  CaseBuilder b("MaxPool", 12, TypeInfo<T>::name);
  b.input(x, "X");
  convAttributes(b, pool.attributes);
  b.output(v::maxPool(x, pool.attributes));
  return b.finish();
}

// Dilations came to AveragePool in opset 19.
template <typename T>
Case averagePoolCase(Rng& r, size_t n) {
  const PoolGeometry pool = randomPoolGeometry(r, n, 0.5);
  const bool countIncludePad = r.chance(0.5);
  const Array<T> x = r.array<T>(pool.xDims);
  CaseBuilder b("AveragePool", pool.attributes.dilations.empty() ? 11 : 19, TypeInfo<T>::name);
  b.input(x, "X");
  convAttributes(b, pool.attributes);
  b.integer("count_include_pad", countIncludePad);
  b.output(v::averagePool(x, pool.attributes, countIncludePad));
  return b.finish();
}

// GlobalMaxPool (a MaxPool with one window over the spatial axes) and GlobalAveragePool (a mean over them), as the
// interpreter evaluates them.
template <typename T>
Case globalPoolCase(Rng& r, size_t n, bool max) {
  Dims xDims{r.integer(1, 2), r.integer(1, 3)};
  for (size_t d = 0; d < n; ++d) xDims.push_back(r.integer(1, 4));
  const Array<T> x = r.array<T>(xDims);
  CaseBuilder b(max ? "GlobalMaxPool" : "GlobalAveragePool", 1, TypeInfo<T>::name);
  b.input(x, "X");
  if (max) {
    v::ConvAttributes whole;
    whole.kernelShape.assign(xDims.begin() + 2, xDims.end());
    b.output(v::maxPool(x, whole));
  } else {
    std::vector<int64_t> spatial;
    for (size_t d = 0; d < n; ++d) spatial.push_back(static_cast<int64_t>(d + 2));
    b.output(v::reduceMean(x, spatial, true));
  }
  return b.finish();
}

template <typename T>
Case convTransposeCase(Rng& r, size_t n) {
  const auto [group, inPerGroup, outPerGroup] = randomGroups(r);
  v::ConvAttributes a;
  a.group = group;
  a.autoPad = r.pick<std::string>({"NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"});
  const int64_t maxKernel = n == 3 ? 2 : 3;
  const bool withStrides = r.chance(0.8), withDilations = r.chance(0.8);
  const bool withAdjust = r.chance(0.5);
  Dims kernel(n), strides(n), dilations(n), in(n), adjust(n), padBegin(n, 0), padEnd(n, 0), natural(n);
  for (size_t d = 0; d < n; ++d) {
    kernel[d] = r.integer(1, maxKernel);
    strides[d] = withStrides ? r.integer(1, 3) : 1;
    dilations[d] = withDilations ? r.integer(1, 2) : 1;
    in[d] = r.integer(1, n == 3 ? 3 : 4);
    adjust[d] = withAdjust && r.chance(0.7) ? r.integer(0, strides[d] - 1) : 0;
    natural[d] = (in[d] - 1) * strides[d] + adjust[d] + (kernel[d] - 1) * dilations[d] + 1;
    if (a.autoPad == "NOTSET") {
      padBegin[d] = r.integer(0, 2);
      padEnd[d] = r.integer(0, 2);
      while (padBegin[d] + padEnd[d] >= natural[d]) (padBegin[d] > 0 ? padBegin[d] : padEnd[d])--;
    }
  }
  if (r.chance(0.5)) a.kernelShape = kernel;
  if (withStrides) a.strides = strides;
  if (withDilations) a.dilations = dilations;
  if (withAdjust) a.outputPadding = adjust;
  if (a.autoPad == "NOTSET" && r.chance(0.8)) {
    a.pads = padBegin;
    a.pads.insert(a.pads.end(), padEnd.begin(), padEnd.end());
  }
  const int64_t batch = r.integer(1, 2);
  if (r.chance(0.3)) {
    // output_shape at or below the natural size (it replaces pads). Only the spatial form: ORT's shape inference
    // refuses the N, C, spatial form at load ("Attribute output_shape has incorrect size"), though its kernel and
    // ours accept it.
    for (size_t d = 0; d < n; ++d)
      a.outputShape.push_back(natural[d] - r.integer(0, std::min<int64_t>(3, natural[d] - 1)));
  }
  Dims xDims{batch, group * inPerGroup};
  xDims.insert(xDims.end(), in.begin(), in.end());
  Dims wDims{group * inPerGroup, outPerGroup};
  wDims.insert(wDims.end(), kernel.begin(), kernel.end());
  const Array<T> x = r.array<T>(xDims), w = r.array<T>(wDims), bias = r.array<T>({group * outPerGroup});
  const bool withBias = r.chance(0.5);
  CaseBuilder b("ConvTranspose", 11, TypeInfo<T>::name);
  b.input(x, "X").input(w, "W");
  if (withBias) b.input(bias, "B");
  convAttributes(b, a);
  b.output(v::convTranspose(x, w, withBias ? &bias : nullptr, a));
  return b.finish();
}

template <typename T>
Case gemmCase(Rng& r, bool transA, bool transB, int cForm) {
  const int64_t m = r.integer(1, 5), k = r.integer(1, 6), n = r.integer(1, 5);
  const Array<T> a = r.array<T>(transA ? Dims{k, m} : Dims{m, k});
  const Array<T> b = r.array<T>(transB ? Dims{n, k} : Dims{k, n});
  const std::vector<Dims> cShapes{{}, {}, {1}, {n}, {m, 1}, {m, n}, {1, n}};  // index 0: no C
  const double alpha = static_cast<float>(r.real(-2, 2)), beta = static_cast<float>(r.real(-2, 2));
  const Array<T> c = r.array<T>(cShapes[static_cast<size_t>(cForm)]);
  CaseBuilder builder("Gemm", 13, TypeInfo<T>::name);
  builder.input(a, "A").input(b, "B");
  if (cForm != 0) builder.input(c, "C");
  builder.real("alpha", static_cast<float>(alpha)).real("beta", static_cast<float>(beta));
  builder.integer("transA", transA).integer("transB", transB);
  builder.output(v::gemm(a, b, cForm != 0 ? &c : nullptr, alpha, beta, transA, transB));
  return builder.finish();
}

template <typename T>
Case matMulCase(Rng& r, const Dims& aDims, const Dims& bDims) {
  const Array<T> a = r.array<T>(aDims), b = r.array<T>(bDims);
  CaseBuilder builder("MatMul", 13, TypeInfo<T>::name);
  builder.input(a, "A").input(b, "B").output(v::matMul(a, b));
  return builder.finish();
}

/// Random NC... dims of a rank for BatchNormalization.
Dims bnDims(Rng& r, int64_t rank) {
  Dims dims{r.integer(1, 3), r.integer(1, 4)};
  for (int64_t d = 2; d < rank; ++d) dims.push_back(r.integer(1, rank >= 5 ? 3 : 4));
  return dims;
}

template <typename T>
Case batchNormInferenceCase(Rng& r, int64_t rank, int64_t opset) {
  const Dims dims = bnDims(r, rank);
  const Dims c{dims[1]};
  const Array<T> x = r.array<T>(dims, -3, 3), scale = r.array<T>(c, -2, 2), bias = r.array<T>(c), mean = r.array<T>(c),
                 var = r.array<T>(c, 0.1, 2);
  const float epsilon = r.pick<float>({1e-5f, 1e-3f, 0.1f});
  CaseBuilder b("BatchNormalization", opset, TypeInfo<T>::name);
  b.input(x, "X").input(scale, "scale").input(bias, "B").input(mean, "mean").input(var, "var").real("epsilon", epsilon);
  b.output(v::batchNormInference(x, scale, bias, mean, var, epsilon));
  return b.finish();
}

/// Training mode: opset >= 14 with training_mode=1 and 3 outputs; opset 9 with 5 outputs (the mode follows from
/// the output count there; 3 outputs are not allowed by the BatchNormalization-9 schema).
template <typename T>
Case batchNormTrainingCase(Rng& r, int64_t rank, int64_t opset, int outputs) {
  Dims dims = bnDims(r, rank);
  dims[0] = std::max<int64_t>(dims[0], 2);  // a batch with some spread
  const Dims c{dims[1]};
  const Array<T> x = r.array<T>(dims, -3, 3), scale = r.array<T>(c, -2, 2), bias = r.array<T>(c),
                 mean = r.array<T>(c), var = r.array<T>(c, 0.1, 2);
  const float epsilon = r.pick<float>({1e-5f, 1e-3f, 0.1f});
  const float momentum = r.pick<float>({0.9f, 0.5f, 0.1f, 0.99f});
  CaseBuilder b("BatchNormalization", opset, TypeInfo<T>::name);
  b.input(x, "X").input(scale, "scale").input(bias, "B").input(mean, "input_mean").input(var, "input_var");
  b.real("epsilon", epsilon).real("momentum", momentum);
  if (opset >= 14) b.integer("training_mode", 1);
  b.note("outputs=" + std::to_string(outputs));
  const auto t = v::batchNormTraining(x, scale, bias, mean, var, epsilon, momentum);
  b.output(t.y).output(t.runningMean).output(t.runningVar);
  if (outputs == 5) b.output(t.savedMean).output(t.savedInvStdDev);
  Case result = b.finish();
  result.op += "-train";
  return result;
}

const std::vector<std::pair<Dims, Dims>> kBroadcastPairs{
    {{2, 3}, {2, 3}}, {{2, 3, 4}, {4}}, {{3, 1}, {1, 4}}, {{}, {2, 3}}, {{2, 1, 4}, {3, 1}}, {{1}, {5}}, {{2, 3, 1, 2}, {1, 3, 4, 1}}};

template <typename T>
Case binaryCase(Rng& r, v::BinaryOp op, const char* name, int64_t opset) {
  auto [aDims, bDims] = r.pick(kBroadcastPairs);
  if (r.chance(0.5)) std::swap(aDims, bDims);
  Array<T> a, b;
  if constexpr (std::is_integral_v<T>) {
    a = r.array<T>(aDims, -20, 20);
    b = r.array<T>(bDims, -20, 20);
    if (op == v::BinaryOp::Div)
      for (T& value : b.data) value = value == 0 ? 3 : value;
    if (op == v::BinaryOp::Pow) {
      a = r.array<T>(aDims, -3, 3);
      b = r.array<T>(bDims, 0, 5);
    }
  } else {
    a = r.array<T>(aDims, -2, 2);
    b = op == v::BinaryOp::Div ? r.awayFromZero<T>(bDims) : r.array<T>(bDims, -2, 2);
    if (op == v::BinaryOp::Pow) {
      a = r.array<T>(aDims, 0.5, 2);
      b = r.array<T>(bDims, -2, 2);
    }
  }
  CaseBuilder builder(name, opset, TypeInfo<T>::name);
  builder.input(a, "A").input(b, "B").output(v::binary(op, a, b));
  return builder.finish();
}

template <typename T>
Case unaryCase(Rng& r, v::UnaryOp op, const char* name, int64_t opset) {
  const Dims dims = r.pick<Dims>({{5}, {2, 3}, {2, 1, 4}, {}});
  const Array<T> x = op == v::UnaryOp::Sqrt ? r.array<T>(dims, 0, 4)
                     : op == v::UnaryOp::Reciprocal ? r.awayFromZero<T>(dims)
                                                    : r.array<T>(dims, -2, 2);
  CaseBuilder builder(name, opset, TypeInfo<T>::name);
  builder.input(x, "X").output(v::unary(op, x));
  return builder.finish();
}

template <typename T>
Case leakyReluCase(Rng& r) {
  const Dims dims = r.pick<Dims>({{5}, {2, 3}, {2, 3, 2, 2}});
  const Array<T> x = r.array<T>(dims, -2, 2);
  const auto alpha = static_cast<float>(r.real(0, 1));
  CaseBuilder builder("LeakyRelu", 16, TypeInfo<T>::name);
  builder.input(x, "X").real("alpha", alpha).output(v::leakyRelu(x, alpha));
  return builder.finish();
}

template <typename T>
Case preluCase(Rng& r) {
  // The slope shapes equalize passes through: scalar, per channel [C, 1, 1], and the full shape.
  const Dims dims{2, 3, 2, 2};
  const Dims slopeDims = r.pick<Dims>({{1}, {3, 1, 1}, {2, 3, 2, 2}, {2}});
  const Array<T> x = r.array<T>(dims, -2, 2), slope = r.array<T>(slopeDims, -1, 1);
  CaseBuilder builder("PRelu", 16, TypeInfo<T>::name);
  builder.input(x, "X").input(slope, "slope").output(v::prelu(x, slope));
  return builder.finish();
}

template <typename T>
Case reduceMeanCase(Rng& r, int64_t opset) {
  const Dims dims = r.pick<Dims>({{4}, {2, 3}, {2, 3, 4}, {2, 1, 3, 2}});
  const int64_t rank = static_cast<int64_t>(dims.size());
  std::vector<int64_t> axes;
  if (r.chance(0.8)) {
    for (int64_t axis = 0; axis < rank; ++axis)
      if (r.chance(0.5)) axes.push_back(r.chance(0.5) ? axis - rank : axis);
  }
  const bool keepDims = r.chance(0.5);
  const Array<T> x = r.array<T>(dims);
  CaseBuilder builder("ReduceMean", opset, TypeInfo<T>::name);
  builder.input(x, "X");
  if (!axes.empty()) {
    if (opset >= 18) builder.intsInput(axes, "axes");
    else builder.ints("axes", axes);
  }
  builder.integer("keepdims", keepDims).output(v::reduceMean(x, axes, keepDims));
  return builder.finish();
}

template <typename T>
Case transposeCase(Rng& r) {
  Dims dims = r.pick<Dims>({{2, 3}, {2, 3, 4}, {1, 2, 3, 2}, {5}});
  std::vector<int64_t> perm(dims.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[static_cast<size_t>(r.integer(0, static_cast<int64_t>(i) - 1))]);
  if (r.chance(0.3)) perm.clear();
  const Array<T> x = r.array<T>(dims, -9, 9);
  CaseBuilder builder("Transpose", 13, TypeInfo<T>::name);
  builder.input(x, "X");
  if (!perm.empty()) builder.ints("perm", perm);
  builder.output(v::transpose(x, perm));
  return builder.finish();
}

template <typename T>
Case sliceCase(Rng& r) {
  const Dims dims = r.pick<Dims>({{10}, {4, 5}, {3, 4, 5}});
  const int64_t rank = static_cast<int64_t>(dims.size());
  std::vector<int64_t> starts, ends, axes, steps;
  const int64_t lowest = std::numeric_limits<int64_t>::min(), highest = std::numeric_limits<int64_t>::max();
  for (int64_t axis = 0; axis < rank; ++axis) {
    if (!r.chance(0.7) && axis + 1 < rank) continue;
    const int64_t dim = dims[static_cast<size_t>(axis)];
    const int64_t step = r.pick<int64_t>({1, 2, 3, -1, -2, -3});
    auto bound = [&](bool forStart) {
      switch (r.integer(0, 4)) {
        case 0: return r.integer(0, dim);
        case 1: return -r.integer(1, dim);
        case 2: return r.integer(dim, dim + 5);  // clamped
        case 3: return -r.integer(dim + 1, dim + 5);
        default: return (step > 0) == forStart ? lowest : highest;
      }
    };
    starts.push_back(bound(true));
    ends.push_back(bound(false));
    axes.push_back(r.chance(0.5) ? axis - rank : axis);
    steps.push_back(step);
  }
  const bool withAxes = true;
  const Array<T> x = r.array<T>(dims, -9, 9);
  CaseBuilder builder("Slice", 13, TypeInfo<T>::name);
  builder.input(x, "X").intsInput(starts, "starts").intsInput(ends, "ends");
  if (withAxes) builder.intsInput(axes, "axes").intsInput(steps, "steps");
  builder.output(v::slice(x, starts, ends, axes, steps));
  return builder.finish();
}

template <typename T>
Case gatherCase(Rng& r) {
  const Dims dims = r.pick<Dims>({{5}, {3, 4}, {2, 3, 4}});
  const int64_t rank = static_cast<int64_t>(dims.size());
  const int64_t axis = r.integer(-rank, rank - 1);
  const int64_t dim = dims[static_cast<size_t>(axis < 0 ? axis + rank : axis)];
  const Dims indexDims = r.pick<Dims>({{}, {3}, {2, 2}});
  Array<int64_t> indices = r.array<int64_t>(indexDims, -dim, dim - 1);
  const Array<T> x = r.array<T>(dims, -9, 9);
  CaseBuilder builder("Gather", 13, TypeInfo<T>::name);
  builder.input(x, "X").input(indices, "indices").integer("axis", axis).output(v::gather(x, indices, axis));
  return builder.finish();
}

template <typename T>
Case expandCase(Rng& r) {
  const auto [xDims, shape] = r.pick<std::pair<Dims, Dims>>(
      {{{3, 1}, {2, 3, 4}}, {{1}, {2, 2}}, {{2, 1, 3}, {4, 1}}, {{4}, {1}}, {{}, {3}}, {{2, 3}, {1, 1, 2, 1}}});
  const Array<T> x = r.array<T>(xDims, -9, 9);
  CaseBuilder builder("Expand", 13, TypeInfo<T>::name);
  builder.input(x, "X").intsInput(shape, "shape").output(v::expand(x, shape));
  return builder.finish();
}

template <typename T>
Case concatCase(Rng& r) {
  Dims base = r.pick<Dims>({{4}, {2, 3}, {2, 3, 2}});
  const int64_t rank = static_cast<int64_t>(base.size());
  const int64_t axis = r.integer(-rank, rank - 1);
  const size_t at = static_cast<size_t>(axis < 0 ? axis + rank : axis);
  std::vector<Array<T>> parts;
  const int64_t count = r.integer(1, 3);
  for (int64_t i = 0; i < count; ++i) {
    Dims dims = base;
    dims[at] = r.integer(1, 3);
    parts.push_back(r.array<T>(dims, -9, 9));
  }
  std::vector<const Array<T>*> pointers;
  CaseBuilder builder("Concat", 13, TypeInfo<T>::name);
  for (const auto& part : parts) {
    pointers.push_back(&part);
    builder.input(part, "X");
  }
  builder.integer("axis", axis).output(v::concat(pointers, axis));
  return builder.finish();
}

double roundToFloat(double v) { return static_cast<float>(v); }

/// Rank 1-4 dims and an axis in [-rank, rank) for the trailing-axes normalizations.
std::pair<Dims, int64_t> trailingNormDims(Rng& r) {
  const Dims dims = r.pick<Dims>({{6}, {2, 5}, {2, 3, 4}, {2, 2, 3, 2}});
  const auto rank = static_cast<int64_t>(dims.size());
  return {dims, r.integer(-rank, rank - 1)};
}

/// Scale or bias of the normalized dims (axis..), or, now and then, of only its last dims (numpy broadcasting).
Dims normalizedShape(Rng& r, const Dims& dims, int64_t axis) {
  const auto rank = static_cast<int64_t>(dims.size());
  const int64_t from = axis < 0 ? axis + rank : axis;
  const int64_t start = r.chance(0.3) ? r.integer(from, rank - 1) : from;
  return Dims(dims.begin() + start, dims.end());
}

template <typename T>
Case layerNormCase(Rng& r, int outputs) {
  const auto [dims, axis] = trailingNormDims(r);
  const Array<T> x = r.array<T>(dims, -3, 3), scale = r.array<T>(normalizedShape(r, dims, axis), -2, 2),
                 bias = r.array<T>(normalizedShape(r, dims, axis));
  const bool withBias = r.chance(0.7);
  const float epsilon = r.pick<float>({1e-5f, 1e-3f, 0.1f});
  CaseBuilder b("LayerNormalization", 17, TypeInfo<T>::name);
  b.input(x, "X").input(scale, "scale");
  if (withBias) b.input(bias, "B");
  b.integer("axis", axis).real("epsilon", epsilon);
  // The statistics outputs have the stash type; float cases keep the default (float), double ones ask for double.
  const bool isDouble = std::is_same_v<T, double>;
  if (isDouble) b.integer("stash_type", onnx::TensorProto::DOUBLE);
  const auto result = v::layerNormalization(x, scale, withBias ? &bias : nullptr, axis, epsilon,
                                            isDouble ? nullptr : roundToFloat);
  b.output(result.y);
  if (outputs == 3) b.output(result.mean).output(result.invStdDev);
  return b.finish();
}

template <typename T>
Case rmsNormCase(Rng& r) {
  const auto [dims, axis] = trailingNormDims(r);
  const Array<T> x = r.array<T>(dims, -3, 3), scale = r.array<T>(normalizedShape(r, dims, axis), -2, 2);
  const float epsilon = r.pick<float>({1e-5f, 1e-3f, 0.1f});
  CaseBuilder b("RMSNormalization", 23, TypeInfo<T>::name);
  b.input(x, "X").input(scale, "scale").integer("axis", axis).real("epsilon", epsilon);
  const bool isDouble = std::is_same_v<T, double>;
  if (isDouble) b.integer("stash_type", onnx::TensorProto::DOUBLE);
  b.output(v::rmsNormalization(x, scale, axis, epsilon, isDouble ? nullptr : roundToFloat));
  return b.finish();
}

template <typename T>
Case groupNormCase(Rng& r, int64_t opset) {
  const int64_t groups = r.integer(1, 3), perGroup = r.integer(1, 3);
  Dims dims{r.integer(1, 2), groups * perGroup};
  for (int64_t d = 0, rank = r.integer(0, 2); d < rank; ++d) dims.push_back(r.integer(1, 4));
  const Dims params{opset >= 21 ? dims[1] : groups};
  const Array<T> x = r.array<T>(dims, -3, 3), scale = r.array<T>(params, -2, 2), bias = r.array<T>(params);
  const float epsilon = r.pick<float>({1e-5f, 1e-3f, 0.1f});
  CaseBuilder b("GroupNormalization", opset, TypeInfo<T>::name);
  b.input(x, "X").input(scale, "scale").input(bias, "bias").integer("num_groups", groups).real("epsilon", epsilon);
  // Double cases compute in double (stash_type, from opset 21); the default float stash rounds X itself too.
  const bool inDouble = std::is_same_v<T, double> && opset >= 21;
  if (inDouble) b.integer("stash_type", onnx::TensorProto::DOUBLE);
  b.output(v::groupNormalization(x, scale, bias, groups, epsilon,
                                 opset >= 21 ? v::GroupAffine::PerChannel : v::GroupAffine::PerGroup,
                                 inDouble ? nullptr : roundToFloat));
  return b.finish();
}

template <typename T>
Case instanceNormCase(Rng& r) {
  Dims dims{r.integer(1, 2), r.integer(1, 4)};
  for (int64_t d = 0, rank = r.integer(1, 3); d < rank; ++d) dims.push_back(r.integer(1, 4));
  dims[2] = std::max<int64_t>(dims[2], 2);  // some spread to normalize
  const Dims c{dims[1]};
  const Array<T> x = r.array<T>(dims, -3, 3), scale = r.array<T>(c, -2, 2), bias = r.array<T>(c);
  const float epsilon = r.pick<float>({1e-5f, 1e-3f, 0.1f});
  CaseBuilder b("InstanceNormalization", 6, TypeInfo<T>::name);
  b.input(x, "X").input(scale, "scale").input(bias, "B").real("epsilon", epsilon);
  b.output(v::instanceNormalization(x, scale, bias, epsilon));
  return b.finish();
}

std::vector<Case> buildCases() {
  Rng r(kSeed);
  std::vector<Case> cases;
  for (size_t n = 1; n <= 3; ++n) {
    for (int i = 0; i < 16; ++i) cases.push_back(convCase<float>(r, n));
    for (int i = 0; i < 2; ++i) cases.push_back(convCase<double>(r, n));
    for (int i = 0; i < 14; ++i) cases.push_back(convTransposeCase<float>(r, n));
    cases.push_back(convTransposeCase<double>(r, n));
  }
  for (size_t n = 1; n <= 3; ++n) {
    for (int i = 0; i < 8; ++i) cases.push_back(maxPoolCase<float>(r, n));
    cases.push_back(maxPoolCase<double>(r, n));
  }
  for (int transA = 0; transA < 2; ++transA)
    for (int transB = 0; transB < 2; ++transB)
      for (int cForm = 0; cForm < 7; ++cForm) cases.push_back(gemmCase<float>(r, transA, transB, cForm));
  for (int cForm = 0; cForm < 7; ++cForm) cases.push_back(gemmCase<double>(r, cForm % 2, cForm % 3 == 0, cForm));
  const std::vector<std::pair<Dims, Dims>> matMulShapes{
      {{4}, {4}},       {{4}, {4, 3}},          {{3, 4}, {4}},        {{3, 4}, {4, 5}},       {{2, 3, 4}, {4, 5}},
      {{4}, {2, 4, 5}}, {{2, 1, 3, 4}, {3, 4, 2}}, {{2, 3, 4}, {2, 4, 5}}, {{1, 3, 4}, {3, 4, 2}}, {{2, 3, 4}, {4}}};
  for (const auto& [a, b] : matMulShapes) {
    cases.push_back(matMulCase<float>(r, a, b));
    cases.push_back(matMulCase<double>(r, a, b));
  }
  for (int64_t rank = 2; rank <= 5; ++rank) {
    cases.push_back(batchNormInferenceCase<float>(r, rank, 15));
    cases.push_back(batchNormInferenceCase<float>(r, rank, 9));
    cases.push_back(batchNormInferenceCase<double>(r, rank, 15));
    cases.push_back(batchNormTrainingCase<float>(r, rank, 15, 3));
    cases.push_back(batchNormTrainingCase<float>(r, rank, 9, 5));
  }
  cases.push_back(batchNormTrainingCase<double>(r, 4, 15, 3));
  cases.push_back(batchNormTrainingCase<double>(r, 3, 9, 5));
  cases.push_back(batchNormTrainingCase<float>(r, 4, 14, 3));
  const std::vector<std::tuple<v::BinaryOp, const char*, int64_t>> binaries{
      {v::BinaryOp::Add, "Add", 14}, {v::BinaryOp::Sub, "Sub", 14}, {v::BinaryOp::Mul, "Mul", 14},
      {v::BinaryOp::Div, "Div", 14}, {v::BinaryOp::Pow, "Pow", 15}, {v::BinaryOp::Max, "Max", 13},
      {v::BinaryOp::Min, "Min", 13}};
  for (const auto& [op, name, opset] : binaries) {
    cases.push_back(binaryCase<float>(r, op, name, opset));
    cases.push_back(binaryCase<float>(r, op, name, opset));
    cases.push_back(binaryCase<double>(r, op, name, opset));
    cases.push_back(binaryCase<int64_t>(r, op, name, opset));
  }
  const std::vector<std::tuple<v::UnaryOp, const char*, int64_t>> unaries{
      {v::UnaryOp::Sqrt, "Sqrt", 13}, {v::UnaryOp::Reciprocal, "Reciprocal", 13}, {v::UnaryOp::Neg, "Neg", 13},
      {v::UnaryOp::Relu, "Relu", 14}, {v::UnaryOp::Identity, "Identity", 16}};
  for (const auto& [op, name, opset] : unaries) {
    cases.push_back(unaryCase<float>(r, op, name, opset));
    cases.push_back(unaryCase<double>(r, op, name, opset));
  }
  for (int i = 0; i < 4; ++i) {
    cases.push_back(leakyReluCase<float>(r));
    cases.push_back(preluCase<float>(r));
  }
  cases.push_back(leakyReluCase<double>(r));
  cases.push_back(preluCase<double>(r));
  for (int i = 0; i < 5; ++i) {
    cases.push_back(reduceMeanCase<float>(r, 13));
    cases.push_back(reduceMeanCase<float>(r, 18));
  }
  cases.push_back(reduceMeanCase<double>(r, 13));
  cases.push_back(reduceMeanCase<double>(r, 18));
  for (int i = 0; i < 3; ++i) {
    cases.push_back(transposeCase<float>(r));
    cases.push_back(sliceCase<float>(r));
    cases.push_back(sliceCase<int64_t>(r));
    cases.push_back(gatherCase<float>(r));
    cases.push_back(expandCase<float>(r));
    cases.push_back(concatCase<float>(r));
  }
  cases.push_back(transposeCase<double>(r));
  cases.push_back(transposeCase<int64_t>(r));
  cases.push_back(sliceCase<double>(r));
  cases.push_back(gatherCase<double>(r));
  cases.push_back(gatherCase<int64_t>(r));
  cases.push_back(expandCase<double>(r));
  cases.push_back(expandCase<int64_t>(r));
  cases.push_back(concatCase<double>(r));
  cases.push_back(concatCase<int64_t>(r));
  for (int i = 0; i < 4; ++i) {
    cases.push_back(layerNormCase<float>(r, 1));
    cases.push_back(layerNormCase<float>(r, 3));
    cases.push_back(rmsNormCase<float>(r));
    cases.push_back(groupNormCase<float>(r, 18));
    cases.push_back(groupNormCase<float>(r, 21));
    cases.push_back(instanceNormCase<float>(r));
  }
  cases.push_back(layerNormCase<double>(r, 3));
  cases.push_back(rmsNormCase<double>(r));
  cases.push_back(groupNormCase<double>(r, 21));
  cases.push_back(instanceNormCase<double>(r));
  // Last, so that the cases above keep their random draws. Float only: ORT 1.30's CPU AveragePool and global pools
  // have no double.
  for (size_t n = 1; n <= 3; ++n)
    for (int i = 0; i < 9; ++i) cases.push_back(averagePoolCase<float>(r, n));
  for (size_t n = 1; n <= 3; ++n)
    for (bool max : {true, false}) {
      cases.push_back(globalPoolCase<float>(r, n, max));
      cases.push_back(globalPoolCase<float>(r, n, max));
    }
  return cases;
}

// Op/dtype pairs ORT 1.30's CPU provider has no kernel for. They are still generated: a refusal is reported, not
// failed, and should ORT ever run one it is compared like the rest.
const std::set<std::pair<std::string, std::string>> kExcluded{{"Conv", "double"},
                                                               {"ConvTranspose", "double"},
                                                               {"LayerNormalization", "double"},
                                                               {"InstanceNormalization", "double"}};

double jsonNumber(const nlohmann::json& value) {
  if (value.is_number()) return value.get<double>();
  const std::string text = value.get<std::string>();
  if (text == "NaN") return std::numeric_limits<double>::quiet_NaN();
  if (text == "Infinity") return std::numeric_limits<double>::infinity();
  if (text == "-Infinity") return -std::numeric_limits<double>::infinity();
  return std::stod(text);
}

/// Empty when the ORT outputs match the expected ones, else what differs.
std::string compareOutputs(const Case& c, const nlohmann::json& outputs) {
  std::ostringstream problems;
  if (outputs.size() != c.outputs.size()) {
    problems << "ORT gave " << outputs.size() << " outputs, expected " << c.outputs.size();
    return problems.str();
  }
  for (size_t k = 0; k < c.outputs.size(); ++k) {
    const Expected& e = c.outputs[k];
    const Dims dims = outputs[k]["dims"].get<Dims>();
    const auto& data = outputs[k]["data"];
    if (dims != e.dims) {
      problems << "output " << k << ": ORT dims " << dimsText(dims) << ", reference " << dimsText(e.dims) << "; ";
      continue;
    }
    int bad = 0;
    for (size_t i = 0; i < e.values.size(); ++i) {
      const double ort = jsonNumber(data[i]), ref = e.values[i];
      const bool ok = e.exact ? ort == ref
                      : std::isnan(ort) || std::isnan(ref)
                          ? std::isnan(ort) && std::isnan(ref)
                          : std::abs(ort - ref) <= e.atol + e.rtol * std::abs(ort);
      if (!ok && bad++ < 3) {
        problems << "output " << k << " element " << i << ": ORT " << std::setprecision(17) << ort << ", reference "
                 << ref << "; ";
      }
    }
    if (bad > 3) problems << "output " << k << ": " << bad << " elements differ; ";
  }
  return problems.str();
}

}  // namespace

TEST_CASE("reference kernels agree with ONNX Runtime on a seeded table of random cases", "[verify][kernels][ort]") {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Case> cases = buildCases();
  REQUIRE(cases.size() >= 150);
  bnfold::test::TempDir dir;
  auto stem = [&](size_t i) {
    std::ostringstream name;
    name << "case_" << std::setw(3) << std::setfill('0') << i;
    return dir.file(name.str());
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    std::string bytes;
    REQUIRE(cases[i].model.SerializeToString(&bytes));
    bnfold::test::writeFile(stem(i) + ".onnx", bytes);
  }
  std::string out, err;
  const int code = bnfold::test::runCommand(
      "node '" + bnfold::test::sourceDir() + "/scripts/ort/run_cases.js' '" + dir.path() + "'", &out, &err);
  INFO(out << err);
  REQUIRE(code == 0);

  std::map<std::string, int> perOp;
  std::vector<std::string> refused;
  int failures = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const nlohmann::json result = nlohmann::json::parse(bnfold::test::readFile(stem(i) + ".json"));
    ++perOp[c.op + " " + c.dtype];
    std::string problem;
    if (!result.value("ok", false)) {
      const std::string why = result.value("detail", result.value("error", std::string("?")));
      if (kExcluded.count({c.op, c.dtype})) {
        refused.push_back(c.op + " " + c.dtype + ": " + why);
        continue;
      }
      problem = "ONNX Runtime refused the case: " + why;
    } else {
      problem = compareOutputs(c, result["outputs"]);
    }
    if (!problem.empty()) {
      ++failures;
      FAIL_CHECK("case " << i << ": " << c.description << "\n  " << problem);
    }
  }
  std::ostringstream summary;
  summary << cases.size() << " cases, " << failures << " failed, " << refused.size() << " refused as excluded in "
          << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s:";
  for (const auto& [op, count] : perOp) summary << " " << op << "=" << count << ";";
  for (const auto& why : refused) summary << "\n  excluded: " << why;
  WARN(summary.str());
  CHECK(failures == 0);
}
