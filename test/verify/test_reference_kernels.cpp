// Tests for lib/verify/reference_kernels: hand-computed values for edge behaviour, argument checks that must throw
// std::invalid_argument, and (test_reference_kernels_ort.cpp) a seeded table of random cases against ONNX Runtime.
#include <catch2/catch.hpp>

#include "verify/interpreter.h"
#include "verify/reference_kernels.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

namespace {

namespace v = bnfold::verify;
using v::Array;
using v::Dims;

template <typename T>
Array<T> arr(Dims dims, std::vector<T> data) {
  return Array<T>{std::move(dims), std::move(data)};
}

template <typename T>
void requireClose(const Array<T>& got, const Dims& dims, const std::vector<double>& want) {
  REQUIRE(got.dims == dims);
  REQUIRE(got.data.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i);
    CHECK(static_cast<double>(got.data[i]) == Approx(want[i]).margin(1e-6));
  }
}

}  // namespace

TEST_CASE("elementCount and broadcastDims", "[verify][kernels]") {
  CHECK(v::elementCount({}) == 1);
  CHECK(v::elementCount({2, 0, 3}) == 0);
  CHECK(v::elementCount({2, 3, 4}) == 24);
  CHECK_THROWS_AS(v::elementCount({2, -1}), std::invalid_argument);
  CHECK_THROWS_AS(v::elementCount({int64_t{1} << 40, int64_t{1} << 40}), std::invalid_argument);
  CHECK(v::broadcastDims({2, 1, 4}, {3, 1}) == Dims{2, 3, 4});
  CHECK(v::broadcastDims({}, {5}) == Dims{5});
  CHECK(v::broadcastDims({0}, {1}) == Dims{0});
  CHECK_THROWS_AS(v::broadcastDims({2, 3}, {4}), std::invalid_argument);
}

TEST_CASE("conv by hand: 1-D pads, strides, auto_pad, bias", "[verify][kernels]") {
  const auto x = arr<float>({1, 1, 4}, {1, 2, 3, 4});
  const auto w = arr<float>({1, 1, 2}, {1, 1});
  v::ConvAttributes a;
  requireClose(v::conv(x, w, nullptr, a), {1, 1, 3}, {3, 5, 7});
  a.pads = {1, 1};
  requireClose(v::conv(x, w, nullptr, a), {1, 1, 5}, {1, 3, 5, 7, 4});
  a.strides = {2};
  requireClose(v::conv(x, w, nullptr, a), {1, 1, 3}, {1, 5, 4});
  // SAME: total pad 1; SAME_UPPER puts it at the end, SAME_LOWER at the beginning.
  v::ConvAttributes same;
  same.autoPad = "SAME_UPPER";
  requireClose(v::conv(x, w, nullptr, same), {1, 1, 4}, {3, 5, 7, 4});
  same.autoPad = "SAME_LOWER";
  requireClose(v::conv(x, w, nullptr, same), {1, 1, 4}, {1, 3, 5, 7});
  const auto bias = arr<float>({1}, {10});
  v::ConvAttributes valid;
  valid.autoPad = "VALID";
  valid.dilations = {3};
  requireClose(v::conv(x, w, &bias, valid), {1, 1, 1}, {15});
}

TEST_CASE("conv by hand: depthwise 2-D and a 1x1 pointwise", "[verify][kernels]") {
  // Two channels, group 2: channel 0 sums its 2x2 window, channel 1 takes its top-left minus bottom-right.
  const auto x = arr<double>({1, 2, 2, 2}, {1, 2, 3, 4, 10, 20, 30, 40});
  const auto w = arr<double>({2, 1, 2, 2}, {1, 1, 1, 1, 1, 0, 0, -1});
  v::ConvAttributes a;
  a.group = 2;
  requireClose(v::conv(x, w, nullptr, a), {1, 2, 1, 1}, {10, -30});
  // 1x1: out[m] = sum_c w[m][c] * x[c] per pixel.
  const auto w1 = arr<double>({1, 2, 1, 1}, {1, -1});
  requireClose(v::conv(x, w1, nullptr, {}), {1, 1, 2, 2}, {-9, -18, -27, -36});
}

TEST_CASE("convTranspose by hand: stride, pads, output_padding, output_shape", "[verify][kernels]") {
  const auto x = arr<float>({1, 1, 2}, {1, 2});
  const auto w = arr<float>({1, 1, 3}, {1, 1, 1});
  v::ConvAttributes a;
  a.strides = {2};
  requireClose(v::convTranspose(x, w, nullptr, a), {1, 1, 5}, {1, 1, 3, 2, 2});
  a.outputPadding = {1};
  requireClose(v::convTranspose(x, w, nullptr, a), {1, 1, 6}, {1, 1, 3, 2, 2, 0});
  a.outputPadding = {};
  a.pads = {1, 0};
  requireClose(v::convTranspose(x, w, nullptr, a), {1, 1, 4}, {1, 3, 2, 2});
  // output_shape 4 replaces the pads: total 1, the extra one at the beginning (as ORT splits it for NOTSET).
  v::ConvAttributes shaped;
  shaped.strides = {2};
  shaped.outputShape = {4};
  requireClose(v::convTranspose(x, w, nullptr, shaped), {1, 1, 4}, {1, 3, 2, 2});
  shaped.outputShape = {1, 1, 4};  // the N, C, spatial form
  requireClose(v::convTranspose(x, w, nullptr, shaped), {1, 1, 4}, {1, 3, 2, 2});
  // SAME_UPPER pads to D * stride = 4: total 1, the extra one at the end; SAME_LOWER at the beginning.
  v::ConvAttributes same;
  same.strides = {2};
  same.autoPad = "SAME_UPPER";
  requireClose(v::convTranspose(x, w, nullptr, same), {1, 1, 4}, {1, 1, 3, 2});
  same.autoPad = "SAME_LOWER";
  requireClose(v::convTranspose(x, w, nullptr, same), {1, 1, 4}, {1, 3, 2, 2});
  // Two output channels in two groups, with bias.
  const auto x2 = arr<float>({1, 2, 1}, {1, 2});
  const auto w2 = arr<float>({2, 1, 1}, {3, 4});
  const auto b2 = arr<float>({2}, {1, -1});
  v::ConvAttributes grouped;
  grouped.group = 2;
  requireClose(v::convTranspose(x2, w2, &b2, grouped), {1, 2, 1}, {4, 7});
}

TEST_CASE("gemm and matMul by hand", "[verify][kernels]") {
  const auto a = arr<double>({2, 2}, {1, 2, 3, 4});
  const auto b = arr<double>({2, 2}, {5, 6, 7, 8});
  const auto cColumn = arr<double>({2, 1}, {1, 2});
  requireClose(v::gemm(a, b, &cColumn, 1.0, 10.0, false, false), {2, 2}, {29, 32, 63, 70});
  requireClose(v::gemm(a, b, nullptr, 2.0, 1.0, true, true), {2, 2}, {46, 62, 68, 92});
  const auto scalar = arr<double>({}, {1});
  requireClose(v::gemm(a, b, &scalar, 1.0, -1.0, true, false), {2, 2}, {25, 29, 37, 43});

  const auto vec = arr<double>({2}, {1, 2});
  requireClose(v::matMul(vec, vec), {}, {5});
  requireClose(v::matMul(vec, b), {2}, {19, 22});
  requireClose(v::matMul(a, vec), {2}, {5, 11});
  const auto batched = arr<double>({2, 1, 2}, {1, 0, 0, 1});
  requireClose(v::matMul(batched, b), {2, 1, 2}, {5, 6, 7, 8});
}

TEST_CASE("batch normalization by hand: inference and training statistics", "[verify][kernels]") {
  const auto x = arr<double>({2, 1}, {1, 3});
  const auto one = arr<double>({1}, {1}), zero = arr<double>({1}, {0}), four = arr<double>({1}, {4});
  requireClose(v::batchNormInference(x, one, zero, one, four, 0.0), {2, 1}, {0, 1});
  // Batch mean 2, population variance 1 (not the unbiased 2).
  const auto t = v::batchNormTraining(x, one, zero, zero, zero, 0.0, 0.5);
  requireClose(t.y, {2, 1}, {-1, 1});
  requireClose(t.runningMean, {1}, {1});
  requireClose(t.runningVar, {1}, {0.5});
  requireClose(t.savedMean, {1}, {2});
  requireClose(t.savedInvStdDev, {1}, {1});
}

TEST_CASE("element-wise by hand: broadcasting, integer Div and Pow, NaN", "[verify][kernels]") {
  const auto col = arr<int64_t>({2, 1}, {-7, 7});
  const auto row = arr<int64_t>({3}, {2, -2, 3});
  requireClose(v::binary(v::BinaryOp::Div, col, row), {2, 3}, {-3, 3, -2, 3, -3, 2});
  requireClose(v::binary(v::BinaryOp::Pow, arr<int64_t>({1}, {2}), arr<int64_t>({2}, {10, 0})), {2}, {1024, 1});
  CHECK_THROWS_AS(v::binary(v::BinaryOp::Div, col, arr<int64_t>({}, {0})), std::invalid_argument);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const auto m = v::binary(v::BinaryOp::Max, arr<double>({2}, {nan, 1}), arr<double>({}, {0}));
  CHECK(std::isnan(m.data[0]));
  CHECK(m.data[1] == 1);
  requireClose(v::unary(v::UnaryOp::Relu, arr<float>({3}, {-1, 0, 2})), {3}, {0, 0, 2});
  requireClose(v::unary(v::UnaryOp::Reciprocal, arr<float>({2}, {4, -0.5f})), {2}, {0.25, -2});
  requireClose(v::reduceMean(arr<float>({2, 3}, {1, 2, 3, 4, 5, 6}), {-1}, true), {2, 1}, {2, 5});
  requireClose(v::reduceMean(arr<float>({2, 3}, {1, 2, 3, 4, 5, 6}), {}, false), {}, {3.5});
}

TEST_CASE("layout by hand: negative slice steps, clamping, gather, expand, concat", "[verify][kernels]") {
  const auto x = arr<int64_t>({10}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  const int64_t lowest = std::numeric_limits<int64_t>::min(), highest = std::numeric_limits<int64_t>::max();
  requireClose(v::slice(x, {-1}, {lowest}, {}, {-3}), {4}, {9, 6, 3, 0});
  requireClose(v::slice(x, {highest}, {2}, {0}, {-4}), {2}, {9, 5});
  requireClose(v::slice(x, {-100}, {3}, {}, {}), {3}, {0, 1, 2});
  requireClose(v::slice(x, {5}, {5}, {}, {}), {0}, {});
  const auto m = arr<int64_t>({2, 3}, {1, 2, 3, 4, 5, 6});
  requireClose(v::slice(m, {-1, 0}, {-2, 3}, {0, -1}, {-1, 2}), {1, 2}, {4, 6});
  requireClose(v::transpose(m, {}), {3, 2}, {1, 4, 2, 5, 3, 6});
  requireClose(v::gather(m, arr<int64_t>({2}, {-1, 0}), 1), {2, 2}, {3, 1, 6, 4});
  requireClose(v::gather(m, arr<int64_t>({}, {1}), 0), {3}, {4, 5, 6});
  requireClose(v::expand(arr<int64_t>({2, 1}, {1, 2}), {2, 1, 3}), {2, 2, 3}, {1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2});
  const auto tail = arr<int64_t>({2, 1}, {7, 8});
  requireClose(v::concat<int64_t>({&m, &tail}, -1), {2, 4}, {1, 2, 3, 7, 4, 5, 6, 8});
}

TEST_CASE("bad shapes and attributes throw invalid_argument", "[verify][kernels]") {
  const auto x = arr<float>({1, 2, 4}, std::vector<float>(8, 1));
  const auto w = arr<float>({1, 2, 2}, std::vector<float>(4, 1));
  v::ConvAttributes a;
  CHECK_NOTHROW(v::conv(x, w, nullptr, a));
  CHECK_THROWS_AS(v::conv(arr<float>({1, 2, 4}, {1, 2}), w, nullptr, a), std::invalid_argument);  // data size
  CHECK_THROWS_AS(v::conv(x, arr<float>({1, 3, 2}, std::vector<float>(6, 1)), nullptr, a), std::invalid_argument);
  CHECK_THROWS_AS(v::conv(arr<float>({2, 4}, std::vector<float>(8, 1)), w, nullptr, a), std::invalid_argument);
  const auto badBias = arr<float>({2}, {1, 2});
  CHECK_THROWS_AS(v::conv(x, w, &badBias, a), std::invalid_argument);
  v::ConvAttributes bad = a;
  bad.group = 0;
  CHECK_THROWS_AS(v::conv(x, w, nullptr, bad), std::invalid_argument);
  bad = a;
  bad.group = 3;
  CHECK_THROWS_AS(v::conv(x, w, nullptr, bad), std::invalid_argument);
  bad = a;
  bad.strides = {0};
  CHECK_THROWS_AS(v::conv(x, w, nullptr, bad), std::invalid_argument);
  bad = a;
  bad.pads = {1};
  CHECK_THROWS_AS(v::conv(x, w, nullptr, bad), std::invalid_argument);
  bad = a;
  bad.kernelShape = {3};
  CHECK_THROWS_AS(v::conv(x, w, nullptr, bad), std::invalid_argument);
  bad = a;
  bad.autoPad = "SAME";
  CHECK_THROWS_AS(v::conv(x, w, nullptr, bad), std::invalid_argument);
  bad = a;
  bad.dilations = {int64_t{1} << 62};  // reach overflows
  CHECK_THROWS_AS(v::conv(x, w, nullptr, bad), std::invalid_argument);
  bad = a;
  bad.dilations = {5};  // kernel reaches past the input
  CHECK_THROWS_AS(v::conv(x, w, nullptr, bad), std::invalid_argument);

  const auto wt = arr<float>({2, 1, 2}, std::vector<float>(4, 1));
  CHECK_NOTHROW(v::convTranspose(x, wt, nullptr, a));
  bad = a;
  bad.outputShape = {1, 2};
  CHECK_THROWS_AS(v::convTranspose(x, wt, nullptr, bad), std::invalid_argument);
  bad = a;
  bad.pads = {3, 3};
  CHECK_THROWS_AS(v::convTranspose(x, wt, nullptr, bad), std::invalid_argument);
  CHECK_THROWS_AS(v::convTranspose(x, w, nullptr, a), std::invalid_argument);

  const auto m23 = arr<float>({2, 3}, std::vector<float>(6, 1));
  CHECK_THROWS_AS(v::gemm(m23, m23, nullptr, 1, 1, false, false), std::invalid_argument);
  const auto c3 = arr<float>({3}, {1, 2, 3});
  CHECK_THROWS_AS(v::gemm(m23, m23, &c3, 1, 1, false, true), std::invalid_argument);
  CHECK_THROWS_AS(v::matMul(m23, m23), std::invalid_argument);
  CHECK_THROWS_AS(v::matMul(arr<float>({}, {1}), m23), std::invalid_argument);
  CHECK_THROWS_AS(v::matMul(arr<float>({2, 2, 3}, std::vector<float>(12)), arr<float>({3, 3, 1}, std::vector<float>(9))),
                  std::invalid_argument);

  const auto p2 = arr<float>({2}, {1, 1}), p3 = arr<float>({3}, {1, 1, 1});
  CHECK_THROWS_AS(v::batchNormInference(x, p2, p2, p2, p3, 1e-5), std::invalid_argument);
  CHECK_THROWS_AS(v::batchNormTraining(arr<float>({2}, {1, 1}), p2, p2, p2, p2, 1e-5, 0.9), std::invalid_argument);
  CHECK_THROWS_AS(v::batchNormTraining(arr<float>({0, 2}, {}), p2, p2, p2, p2, 1e-5, 0.9), std::invalid_argument);

  CHECK_THROWS_AS(v::binary(v::BinaryOp::Add, m23, p2), std::invalid_argument);
  CHECK_THROWS_AS(v::reduceMean(m23, {2}, true), std::invalid_argument);
  CHECK_THROWS_AS(v::reduceMean(m23, {1, -1}, true), std::invalid_argument);
  // An empty input reduced over its zero dim: the output (NaN means) would be 2^31 elements, and is refused before
  // anything that size is allocated (a fuzzer's model once asked for 16 GiB here).
  CHECK_THROWS_AS(v::reduceMean(arr<float>({0, int64_t{1} << 31}, {}), {0}, true), std::invalid_argument);
  CHECK_THROWS_AS(v::transpose(m23, {0, 0}), std::invalid_argument);
  CHECK_THROWS_AS(v::transpose(m23, {1}), std::invalid_argument);
  CHECK_THROWS_AS(v::slice(m23, {0}, {1}, {0}, {0}), std::invalid_argument);
  CHECK_THROWS_AS(v::slice(m23, {0, 0}, {1, 1}, {1, -1}, {}), std::invalid_argument);
  CHECK_THROWS_AS(v::slice(m23, {0}, {1, 2}, {}, {}), std::invalid_argument);
  CHECK_THROWS_AS(v::gather(m23, arr<int64_t>({1}, {3}), 1), std::invalid_argument);
  CHECK_THROWS_AS(v::gather(m23, arr<int64_t>({1}, {-4}), 1), std::invalid_argument);
  CHECK_THROWS_AS(v::gather(m23, arr<int64_t>({1}, {0}), 2), std::invalid_argument);
  CHECK_THROWS_AS(v::expand(m23, {2, 2}), std::invalid_argument);
  CHECK_THROWS_AS(v::expand(m23, {int64_t{1} << 40, 1, 1}), std::invalid_argument);  // absurdly large
  CHECK_THROWS_AS(v::concat<float>({&m23, &p2}, 0), std::invalid_argument);
  CHECK_THROWS_AS(v::concat<float>({&m23, nullptr}, 0), std::invalid_argument);
  CHECK_THROWS_AS(v::concat<float>({}, 0), std::invalid_argument);
}

TEST_CASE("normalizations by hand: LayerNorm, RMSNorm, GroupNorm 18 and 21, InstanceNorm", "[verify][kernels]") {
  // Rows {1, 3} and {2, 6}: means 2 and 4, variances 1 and 4; epsilon 0 keeps the numbers round.
  const auto x = arr<double>({2, 2}, {1, 3, 2, 6});
  const auto scale = arr<double>({2}, {1, 10});
  const auto bias = arr<double>({2}, {0, 1});
  const auto ln = v::layerNormalization(x, scale, &bias, -1, 0.0, nullptr);
  requireClose(ln.y, {2, 2}, {-1, 11, -1, 11});
  requireClose(ln.mean, {2, 1}, {2, 4});
  requireClose(ln.invStdDev, {2, 1}, {1, 0.5});
  // axis 0: one block of four, mean 3, variance (4 + 0 + 1 + 9) / 4 = 3.5.
  const auto whole = v::layerNormalization(x, arr<double>({}, {1}), nullptr, 0, 0.0, nullptr);
  requireClose(whole.y, {2, 2}, {-2 / std::sqrt(3.5), 0, -1 / std::sqrt(3.5), 3 / std::sqrt(3.5)});
  requireClose(whole.mean, {1, 1}, {3});
  // epsilon enters under the root: variance 1 + epsilon 3 = 4.
  requireClose(v::layerNormalization(arr<double>({1, 2}, {1, 3}), scale, nullptr, 1, 3.0, nullptr).y, {1, 2},
               {-0.5, 5});
  // A scale that broadcasts X to a bigger shape is refused.
  CHECK_THROWS_AS(v::layerNormalization(x, arr<double>({3, 1, 1}, {1, 1, 1}), nullptr, -1, 0.0, nullptr),
                  std::invalid_argument);

  // RMS of {3, 4} is sqrt(12.5); of {1, 1} it is 1. No mean is subtracted.
  const auto rx = arr<double>({2, 2}, {3, 4, 1, 1});
  const double rms = std::sqrt(12.5);
  requireClose(v::rmsNormalization(rx, arr<double>({2}, {1, 2}), -1, 0.0, nullptr), {2, 2},
               {3 / rms, 8 / rms, 1, 2});

  // GroupNorm over x [1, 4, 2], 2 groups: group 0 = {1, 3, 1, 3} (mean 2, var 1), group 1 = {0, 4, 0, 4} (2, 4).
  const auto gx = arr<double>({1, 4, 2}, {1, 3, 1, 3, 0, 4, 0, 4});
  const auto perGroup = v::groupNormalization(gx, arr<double>({2}, {1, 2}), arr<double>({2}, {0, 10}), 2, 0.0,
                                              v::GroupAffine::PerGroup, nullptr);
  requireClose(perGroup, {1, 4, 2}, {-1, 1, -1, 1, 8, 12, 8, 12});
  const auto perChannel = v::groupNormalization(gx, arr<double>({4}, {1, 2, 3, 4}), arr<double>({4}, {0, 0, 0, 1}), 2,
                                                0.0, v::GroupAffine::PerChannel, nullptr);
  requireClose(perChannel, {1, 4, 2}, {-1, 1, -2, 2, -3, 3, -3, 5});
  CHECK_THROWS_AS(v::groupNormalization(gx, arr<double>({4}, {1, 2, 3, 4}), arr<double>({4}, {0, 0, 0, 0}), 3, 0.0,
                                        v::GroupAffine::PerChannel, nullptr),
                  std::invalid_argument);
  CHECK_THROWS_AS(v::groupNormalization(gx, arr<double>({2}, {1, 2}), arr<double>({2}, {0, 0}), 2, 0.0,
                                        v::GroupAffine::PerChannel, nullptr),
                  std::invalid_argument);

  // InstanceNorm: each (sample, channel) on its own: {1, 3} -> {-1, 1}, {0, 4} -> {-1, 1}, then per-channel affine.
  const auto ix = arr<double>({1, 2, 2}, {1, 3, 0, 4});
  requireClose(v::instanceNormalization(ix, arr<double>({2}, {2, 3}), arr<double>({2}, {1, 0}), 0.0), {1, 2, 2},
               {-1, 3, -3, 3});
  CHECK_THROWS_AS(v::instanceNormalization(arr<double>({2, 2}, {1, 2, 3, 4}), arr<double>({2}, {1, 1}),
                                           arr<double>({2}, {0, 0}), 0.0),
                  std::invalid_argument);
}

namespace {

v::RegionNode normalizationNode(const std::string& op, std::vector<std::string> inputs,
                                std::vector<std::string> outputs) {
  v::RegionNode node;
  node.opType = op;
  node.name = "norm";
  node.inputs = std::move(inputs);
  node.outputs = std::move(outputs);
  return node;
}

void setAttribute(v::RegionNode& node, const std::string& name, double value, bool isFloat) {
  auto* attribute = node.attributes.add_attribute();
  attribute->set_name(name);
  if (isFloat) {
    attribute->set_type(onnx::AttributeProto::FLOAT);
    attribute->set_f(static_cast<float>(value));
  } else {
    attribute->set_type(onnx::AttributeProto::INT);
    attribute->set_i(static_cast<int64_t>(value));
  }
}

v::Operand<double> realOperand(Array<double> a) {
  v::Operand<double> operand;
  operand.type = bnfold::DataType::Double;
  operand.real = std::move(a);
  return operand;
}

}  // namespace

TEST_CASE("the interpreter evaluates the normalizations with their attributes and outputs", "[verify][kernels]") {
  std::map<std::string, v::Operand<double>> values;
  values["x"] = realOperand(arr<double>({1, 4, 2}, {1, 3, 1, 3, 0, 4, 0, 4}));
  values["s2"] = realOperand(arr<double>({2}, {1, 2}));
  values["b2"] = realOperand(arr<double>({2}, {0, 10}));
  values["one"] = realOperand(arr<double>({}, {1}));

  SECTION("LayerNormalization: axis, epsilon, Mean and InvStdDev in the stash type") {
    v::Region region;
    region.opset = 17;
    auto node = normalizationNode("LayerNormalization", {"x", "one", ""}, {"y", "mean", "inv"});
    setAttribute(node, "axis", 1, false);
    setAttribute(node, "epsilon", 0.0, true);
    region.nodes.push_back(node);
    const auto out = v::evaluateRegion(region, values, {});
    // Per sample over [4, 2]: mean 2, variance 2.5.
    requireClose(out.at("mean").real, {1, 1, 1}, {2});
    requireClose(out.at("inv").real, {1, 1, 1}, {1 / std::sqrt(2.5)});
    CHECK(out.at("mean").type == bnfold::DataType::Float);
    CHECK(out.at("y").type == bnfold::DataType::Double);
    CHECK(out.at("y").real.data[4] == Approx(-2 / std::sqrt(2.5)));
  }
  SECTION("GroupNormalization: per group at opset 18, a wrong parameter shape at 21") {
    v::Region region;
    region.opset = 18;
    auto node = normalizationNode("GroupNormalization", {"x", "s2", "b2"}, {"y"});
    setAttribute(node, "num_groups", 2, false);
    setAttribute(node, "epsilon", 0.0, true);
    region.nodes.push_back(node);
    requireClose(v::evaluateRegion(region, values, {}).at("y").real, {1, 4, 2}, {-1, 1, -1, 1, 8, 12, 8, 12});
    region.opset = 21;
    CHECK_THROWS_AS(v::evaluateRegion(region, values, {}), v::EvaluationError);
  }
  SECTION("RMSNormalization and InstanceNormalization") {
    v::Region region;
    region.opset = 23;
    auto rms = normalizationNode("RMSNormalization", {"x", "one"}, {"r"});
    setAttribute(rms, "epsilon", 0.0, true);
    region.nodes.push_back(rms);
    auto instance = normalizationNode("InstanceNormalization", {"x", "s2", "b2"}, {"i"});
    values["s4"] = realOperand(arr<double>({4}, {1, 1, 1, 2}));
    values["b4"] = realOperand(arr<double>({4}, {0, 0, 0, 1}));
    instance.inputs = {"x", "s4", "b4"};
    setAttribute(instance, "epsilon", 0.0, true);
    region.nodes.push_back(instance);
    const auto out = v::evaluateRegion(region, values, {});
    // RMS over the last axis: {1, 3} -> sqrt(5); {0, 4} -> sqrt(8).
    requireClose(out.at("r").real, {1, 4, 2},
                 {1 / std::sqrt(5), 3 / std::sqrt(5), 1 / std::sqrt(5), 3 / std::sqrt(5), 0, std::sqrt(2), 0, std::sqrt(2)});
    requireClose(out.at("i").real, {1, 4, 2}, {-1, 1, -1, 1, -1, 1, -1, 3});
    CHECK(v::isEvaluableOp("RMSNormalization"));
  }
}
