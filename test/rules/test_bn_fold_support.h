#pragma once
// Helpers for the bn-fold tests: deterministic parameter values, ONNX-text tensor literals, an independent
// reference for the folded weights (plain index arithmetic per layout, not lib/kernels), converting a model's
// float tensors to float16 / bfloat16 / double, and report lookups.

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <Eigen/Core>

#include "test_support.h"

namespace bnfold::test::bnfold_cases {

/// Deterministic values in [lo, hi): a hash of (seed, index), so every test has its own "random" numbers.
inline std::vector<double> sampleValues(std::size_t count, double seed, double lo = -1.0, double hi = 1.0) {
  std::vector<double> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    const double h = std::sin(seed * 12.9898 + static_cast<double>(i) * 78.233) * 43758.5453;
    values[i] = lo + (hi - lo) * (h - std::floor(h));
  }
  return values;
}

/// Values rounded to float, as ONNX text stores them in a float tensor.
inline std::vector<double> asFloats(std::vector<double> values) {
  for (double& v : values) v = static_cast<double>(static_cast<float>(v));
  return values;
}

/// "float[2,3] w = {...}" (type "float" or "double").
inline std::string tensorText(const std::string& type, const std::string& name, const std::vector<int64_t>& dims,
                              const std::vector<double>& values) {
  // "float s" is a scalar in ONNX text ("float[]" would be a tensor of unknown rank).
  std::string text = type;
  if (!dims.empty()) {
    text += "[";
    for (std::size_t i = 0; i < dims.size(); ++i) text += (i ? "," : "") + std::to_string(dims[i]);
    text += "]";
  }
  text += " " + name + " = {";
  char buffer[40];
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::snprintf(buffer, sizeof buffer, type == "double" ? "%.17g" : "%.9g", values[i]);
    text += (i ? ", " : "") + std::string(buffer);
  }
  return text + "}";
}

/// BatchNormalization parameters (float-representable) with negative scales, non-trivial means and variances.
struct BnParams {
  std::vector<double> gamma, beta, mean, var;
  double epsilon = 1e-3;
  std::size_t channels() const { return gamma.size(); }
};

inline BnParams makeBnParams(std::size_t channels, double seed, double epsilon = 1e-3) {
  BnParams p;
  p.gamma = asFloats(sampleValues(channels, seed + 0.1, -2.0, 2.0));
  p.beta = asFloats(sampleValues(channels, seed + 0.2, -1.0, 1.0));
  p.mean = asFloats(sampleValues(channels, seed + 0.3, -0.5, 0.5));
  p.var = asFloats(sampleValues(channels, seed + 0.4, 0.2, 2.0));
  p.epsilon = static_cast<double>(static_cast<float>(epsilon));
  return p;
}

/// "float[C] s = {...}, float[C] b = {...}, float[C] m = {...}, float[C] v = {...}" with a name prefix.
inline std::string bnInitializers(const BnParams& p, const std::string& prefix = "", const std::string& type = "float") {
  const std::vector<int64_t> dims{static_cast<int64_t>(p.channels())};
  return tensorText(type, prefix + "s", dims, p.gamma) + ", " + tensorText(type, prefix + "b", dims, p.beta) + ", " +
         tensorText(type, prefix + "m", dims, p.mean) + ", " + tensorText(type, prefix + "v", dims, p.var);
}

/// k = gamma / sqrt(var + eps), the reference multiplier per channel.
inline std::vector<double> bnMultiplier(const BnParams& p) {
  std::vector<double> k(p.channels());
  for (std::size_t c = 0; c < k.size(); ++c) k[c] = p.gamma[c] / std::sqrt(p.var[c] + p.epsilon);
  return k;
}

/// Reference folded bias: (b - mean) * k + beta, with b = 0 when the layer had none.
inline std::vector<double> expectedBias(const BnParams& p, const std::vector<double>& oldBias = {}) {
  const auto k = bnMultiplier(p);
  std::vector<double> bias(p.channels());
  for (std::size_t c = 0; c < bias.size(); ++c)
    bias[c] = ((oldBias.empty() ? 0.0 : oldBias[c]) - p.mean[c]) * k[c] + p.beta[c];
  return bias;
}

/// Reference folded weights: every element times k[channel of that element].
inline std::vector<double> scaledBy(const std::vector<double>& weights, const std::vector<double>& k,
                                    const std::function<std::size_t(std::size_t)>& channelOf) {
  std::vector<double> out(weights.size());
  for (std::size_t i = 0; i < weights.size(); ++i) out[i] = weights[i] * k[channelOf(i)];
  return out;
}

inline std::size_t product(const std::vector<int64_t>& dims, std::size_t from) {
  std::size_t n = 1;
  for (std::size_t i = from; i < dims.size(); ++i) n *= static_cast<std::size_t>(dims[i]);
  return n;
}

/// Output channel of a flat weight index, per layout.
inline std::function<std::size_t(std::size_t)> convChannel(const std::vector<int64_t>& dims) {
  const std::size_t rest = product(dims, 1);
  return [rest](std::size_t i) { return i / rest; };
}
inline std::function<std::size_t(std::size_t)> convTransposeChannel(const std::vector<int64_t>& dims, int64_t group) {
  const std::size_t kernel = product(dims, 2), perGroupOut = static_cast<std::size_t>(dims[1]);
  const std::size_t rowsPerGroup = static_cast<std::size_t>(dims[0] / group);
  return [=](std::size_t i) {
    const std::size_t row = i / (perGroupOut * kernel), j = (i / kernel) % perGroupOut;
    return (row / rowsPerGroup) * perGroupOut + j;
  };
}
/// [K, N] weights (Gemm transB=0, MatMul): column; [N, K] (Gemm transB=1): row.
inline std::function<std::size_t(std::size_t)> columnChannel(int64_t columns) {
  return [columns](std::size_t i) { return i % static_cast<std::size_t>(columns); };
}
inline std::function<std::size_t(std::size_t)> rowChannel(int64_t rowLength) {
  return [rowLength](std::size_t i) { return i / static_cast<std::size_t>(rowLength); };
}

/// The initializer called `name` in any graph, or null.
inline const Tensor* findInitializer(Model& model, const std::string& name) {
  for (Graph* graph : model.allGraphs())
    if (Value* value = graph->findLocal(name))
      if (value->initializer()) return value->initializer();
  return nullptr;
}

inline std::vector<double> initializerValues(Model& model, const std::string& name) {
  const Tensor* tensor = findInitializer(model, name);
  if (!tensor) FAIL("no initializer '" << name << "'");
  return tensor->toDoubles();
}

/// Element-wise |a - b| <= tol * max(1, |b|).
inline void checkClose(const std::vector<double>& actual, const std::vector<double>& expected, double tolerance) {
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    INFO("element " << i << ": " << actual[i] << " vs expected " << expected[i]);
    CHECK(std::abs(actual[i] - expected[i]) <= tolerance * std::max(1.0, std::abs(expected[i])));
  }
}

/// The `folds` entry for the BN named `bn`, or a null json.
inline nlohmann::json foldEntry(const Report& report, const std::string& bn) {
  for (const auto& entry : report.section("folds"))
    if (entry.value("bn", "") == bn) return entry;
  return nullptr;
}

/// The `skipped` entry's reason for the BN named `bn`, or "" when it was not skipped.
inline std::string skipReason(const Report& report, const std::string& bn) {
  for (const auto& entry : report.section("skipped"))
    if (entry.value("node", "") == bn) return entry.value("reason", "");
  return "";
}
inline std::string skipMessage(const Report& report, const std::string& bn) {
  for (const auto& entry : report.section("skipped"))
    if (entry.value("node", "") == bn) return entry.value("message", "");
  return "";
}

/// Runs `rules` on a model in ONNX text that they must leave as it is: nothing folded, the BN named `bn` skipped
/// with reason `code` and a message, and the same op sequence as before. Returns the report.
inline Report expectBatchNormSkipped(const std::string& text, const std::vector<std::string>& rules,
                                     const std::string& code, const RuleOptions& options = {},
                                     const std::string& bn = "BatchNormalization_0") {
  auto model = parseModel(text);
  const std::string opsBefore = opSequence(model->graph());
  Report report = applyRules(*model, rules, options);
  INFO(report.dump());
  CHECK(report.section("folds").empty());
  CHECK(skipReason(report, bn) == code);
  CHECK_FALSE(skipMessage(report, bn).empty());
  CHECK(opSequence(model->graph()) == opsBefore);
  return report;
}

/// Converts every float tensor (initializers, Constant values) and float tensor type (inputs, outputs,
/// value_info) of the main graph to `type` (float16, bfloat16 or double), except initializers named in
/// `keepFloat`. ONNX text cannot spell float16/bfloat16 literals, so the tests write float and convert.
inline void convertFloatTensors(onnx::GraphProto& graph, int32_t type, const std::set<std::string>& keepFloat = {}) {
  auto convertTensor = [&](onnx::TensorProto& tensor) {
    if (tensor.data_type() != onnx::TensorProto::FLOAT || keepFloat.count(tensor.name())) return;
    std::vector<float> values(tensor.float_data().begin(), tensor.float_data().end());
    tensor.clear_float_data();
    tensor.set_data_type(type);
    std::string raw;
    for (float v : values) {
      if (type == onnx::TensorProto::DOUBLE) {
        tensor.add_double_data(v);
      } else {
        uint16_t bits = type == onnx::TensorProto::FLOAT16 ? Eigen::numext::bit_cast<uint16_t>(Eigen::half(v))
                                                           : Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(v));
        raw.push_back(static_cast<char>(bits & 0xff));
        raw.push_back(static_cast<char>(bits >> 8));
      }
    }
    if (type != onnx::TensorProto::DOUBLE) tensor.set_raw_data(raw);
  };
  for (auto& tensor : *graph.mutable_initializer()) convertTensor(tensor);
  for (auto& node : *graph.mutable_node())
    for (auto& attribute : *node.mutable_attribute())
      if (attribute.has_t()) convertTensor(*attribute.mutable_t());
  auto convertInfo = [&](onnx::ValueInfoProto& info) {
    auto* tensorType = info.mutable_type()->mutable_tensor_type();
    if (tensorType->elem_type() == onnx::TensorProto::FLOAT && !keepFloat.count(info.name()))
      tensorType->set_elem_type(type);
  };
  for (auto& info : *graph.mutable_input()) convertInfo(info);
  for (auto& info : *graph.mutable_output()) convertInfo(info);
  for (auto& info : *graph.mutable_value_info()) convertInfo(info);
}

/// Parses ONNX text and converts its float tensors to `type` (see convertFloatTensors).
inline std::unique_ptr<Model> parseModelAs(const std::string& text, int32_t type,
                                           const std::set<std::string>& keepFloat = {}) {
  onnx::ModelProto proto = parseModelProto(text);
  convertFloatTensors(*proto.mutable_graph(), type, keepFloat);
  return modelFromProto(std::move(proto), "<onnx text>", ".");
}

/// The value a tensor of `type` stores for x (rounded once), for reference values of float16/bfloat16 tensors.
inline double roundTo(int32_t type, double x) {
  switch (type) {
    case onnx::TensorProto::FLOAT16: return static_cast<double>(static_cast<float>(Eigen::half(x)));
    case onnx::TensorProto::BFLOAT16: return static_cast<double>(static_cast<float>(Eigen::bfloat16(x)));
    case onnx::TensorProto::FLOAT: return static_cast<double>(static_cast<float>(x));
    default: return x;
  }
}
inline std::vector<double> roundTo(int32_t type, std::vector<double> values) {
  for (double& v : values) v = roundTo(type, v);
  return values;
}

}  // namespace bnfold::test::bnfold_cases
