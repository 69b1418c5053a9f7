// Tests for lib/kernels/fold_math: every fold is checked against an independent brute-force reference written
// here — the original layer (naive direct Conv / ConvTranspose / Gemm / MatMul) followed by BatchNormalization,
// against the same naive layer run with the folded weights and bias.
#include <catch2/catch.hpp>

#include "kernels/fold_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using bnfold::kernels::ChannelAffine;
using bnfold::kernels::Dims;
using bnfold::kernels::WeightKind;
using bnfold::kernels::WeightLayout;
namespace k = bnfold::kernels;

// Relative tolerance of the comparisons; the floor of 1 on the magnitude keeps outputs that cancel to near zero
// from demanding more than double precision can give.
constexpr double kTolerance = 1e-12;

std::size_t elementCount(const Dims& dims) {
  std::size_t count = 1;
  for (std::int64_t d : dims) count *= static_cast<std::size_t>(d);
  return count;
}

/// Calls visit(index) for every multi-index below extent, in row-major order (once for rank 0).
template <class Visit>
void forEachIndex(const Dims& extent, Visit&& visit) {
  if (std::any_of(extent.begin(), extent.end(), [](std::int64_t d) { return d == 0; })) return;
  Dims index(extent.size(), 0);
  for (;;) {
    visit(static_cast<const Dims&>(index));
    std::size_t axis = extent.size();
    for (;;) {
      if (axis == 0) return;
      --axis;
      if (++index[axis] < extent[axis]) break;
      index[axis] = 0;
    }
  }
}

struct Tensor {
  Dims dims;
  std::vector<double> data;

  explicit Tensor(Dims d) : dims(std::move(d)), data(elementCount(dims), 0.0) {}
  Tensor(Dims d, std::vector<double> values) : dims(std::move(d)), data(std::move(values)) {
    REQUIRE(data.size() == elementCount(dims));
  }

  std::size_t offset(const Dims& index) const {
    // Plain throws: a REQUIRE per element access would swamp the assertion count.
    if (index.size() != dims.size()) throw std::out_of_range("index rank differs from the tensor rank");
    std::size_t flat = 0;
    for (std::size_t i = 0; i < dims.size(); ++i) {
      if (index[i] < 0 || index[i] >= dims[i]) throw std::out_of_range("index outside the tensor");
      flat = flat * static_cast<std::size_t>(dims[i]) + static_cast<std::size_t>(index[i]);
    }
    return flat;
  }
  double& at(const Dims& index) { return data[offset(index)]; }
  double at(const Dims& index) const { return data[offset(index)]; }
};

Dims concat(Dims head, const Dims& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

class Random {
 public:
  explicit Random(unsigned seed) : engine_(seed) {}
  double uniform(double low, double high) { return std::uniform_real_distribution<double>(low, high)(engine_); }
  std::vector<double> vector(std::size_t n, double low = -1.0, double high = 1.0) {
    std::vector<double> values(n);
    for (double& v : values) v = uniform(low, high);
    return values;
  }
  Tensor tensor(const Dims& dims) { return Tensor(dims, vector(elementCount(dims))); }

 private:
  std::mt19937 engine_;
};

struct BatchNormParams {
  std::vector<double> gamma, beta, mean, var;
  double epsilon = 1e-5;
};

BatchNormParams randomBatchNorm(Random& random, std::size_t channels) {
  BatchNormParams p;
  p.gamma = random.vector(channels, -2.0, 2.0);
  p.beta = random.vector(channels);
  p.mean = random.vector(channels);
  p.var = random.vector(channels, 0.05, 3.0);
  return p;
}

ChannelAffine affineOf(const BatchNormParams& p) {
  return k::batchNormAsAffine(p.gamma, p.beta, p.mean, p.var, p.epsilon);
}

/// BatchNormalization (inference) on axis 1, straight from the ONNX formula.
Tensor naiveBatchNorm(const Tensor& x, const BatchNormParams& p) {
  Tensor y(x.dims);
  forEachIndex(x.dims, [&](const Dims& index) {
    const auto c = static_cast<std::size_t>(index[1]);
    y.at(index) = (x.at(index) - p.mean[c]) / std::sqrt(p.var[c] + p.epsilon) * p.gamma[c] + p.beta[c];
  });
  return y;
}

/// Multiplies axis 1 of x by scale (what a per-input-channel Mul in front of a layer does).
Tensor scaleAxis1(const Tensor& x, const std::vector<double>& scale) {
  Tensor y(x.dims);
  forEachIndex(x.dims, [&](const Dims& index) {
    y.at(index) = x.at(index) * scale[static_cast<std::size_t>(index[1])];
  });
  return y;
}

struct ConvGeometry {
  Dims strides, padsBegin, padsEnd, dilations, outputPadding;
  std::int64_t group = 1;
};

/// Direct Conv: x [N, C, in...], w [M, C/group, k...], bias [M] or empty.
Tensor naiveConv(const Tensor& x, const Tensor& w, const std::vector<double>& bias, const ConvGeometry& g) {
  const std::size_t spatial = x.dims.size() - 2;
  const std::int64_t channelsPerGroup = w.dims[1];
  const std::int64_t outChannelsPerGroup = w.dims[0] / g.group;
  REQUIRE(channelsPerGroup * g.group == x.dims[1]);
  const Dims kernel(w.dims.begin() + 2, w.dims.end());
  Dims outDims{x.dims[0], w.dims[0]};
  for (std::size_t i = 0; i < spatial; ++i) {
    outDims.push_back((x.dims[2 + i] + g.padsBegin[i] + g.padsEnd[i] - g.dilations[i] * (kernel[i] - 1) - 1) /
                          g.strides[i] + 1);
  }
  Tensor y(outDims);
  forEachIndex(outDims, [&](const Dims& out) {
    const std::int64_t m = out[1];
    const std::int64_t firstInput = (m / outChannelsPerGroup) * channelsPerGroup;
    double sum = bias.empty() ? 0.0 : bias[static_cast<std::size_t>(m)];
    for (std::int64_t ci = 0; ci < channelsPerGroup; ++ci) {
      forEachIndex(kernel, [&](const Dims& tap) {
        Dims in{out[0], firstInput + ci};
        for (std::size_t i = 0; i < spatial; ++i) {
          const std::int64_t pos = out[2 + i] * g.strides[i] - g.padsBegin[i] + tap[i] * g.dilations[i];
          if (pos < 0 || pos >= x.dims[2 + i]) return;  // zero padding
          in.push_back(pos);
        }
        sum += x.at(in) * w.at(concat({m, ci}, tap));
      });
    }
    y.at(out) = sum;
  });
  return y;
}

/// Direct ConvTranspose by scattering: x [N, C, in...], w [C, M/group, k...], bias [M] or empty.
Tensor naiveConvTranspose(const Tensor& x, const Tensor& w, const std::vector<double>& bias,
                          const ConvGeometry& g) {
  const std::size_t spatial = x.dims.size() - 2;
  REQUIRE(w.dims[0] == x.dims[1]);
  const std::int64_t inChannelsPerGroup = x.dims[1] / g.group;
  const std::int64_t outChannelsPerGroup = w.dims[1];
  const Dims kernel(w.dims.begin() + 2, w.dims.end());
  Dims outDims{x.dims[0], outChannelsPerGroup * g.group};
  for (std::size_t i = 0; i < spatial; ++i) {
    outDims.push_back(g.strides[i] * (x.dims[2 + i] - 1) + g.outputPadding[i] + (kernel[i] - 1) * g.dilations[i] +
                      1 - g.padsBegin[i] - g.padsEnd[i]);
  }
  Tensor y(outDims);
  forEachIndex(outDims, [&](const Dims& out) {
    y.at(out) = bias.empty() ? 0.0 : bias[static_cast<std::size_t>(out[1])];
  });
  forEachIndex(x.dims, [&](const Dims& in) {
    const std::int64_t c = in[1];
    const std::int64_t firstOutput = (c / inChannelsPerGroup) * outChannelsPerGroup;
    for (std::int64_t j = 0; j < outChannelsPerGroup; ++j) {
      forEachIndex(kernel, [&](const Dims& tap) {
        Dims out{in[0], firstOutput + j};
        for (std::size_t i = 0; i < spatial; ++i) {
          const std::int64_t pos = in[2 + i] * g.strides[i] + tap[i] * g.dilations[i] - g.padsBegin[i];
          if (pos < 0 || pos >= outDims[2 + i]) return;  // cropped by the pads
          out.push_back(pos);
        }
        y.at(out) += x.at(in) * w.at(concat({c, j}, tap));
      });
    }
  });
  return y;
}

struct GemmAttributes {
  bool transA = false;
  bool transB = false;
  double alpha = 1.0;
  double beta = 1.0;
};

/// Y = alpha * A' * B' + beta * C with C broadcast to [M, N] (C optional).
Tensor naiveGemm(const Tensor& a, const Tensor& b, const std::optional<Tensor>& c, const GemmAttributes& attr) {
  const std::int64_t rows = attr.transA ? a.dims[1] : a.dims[0];
  const std::int64_t depth = attr.transA ? a.dims[0] : a.dims[1];
  const std::int64_t columns = attr.transB ? b.dims[0] : b.dims[1];
  REQUIRE(depth == (attr.transB ? b.dims[1] : b.dims[0]));
  Tensor y(Dims{rows, columns});
  for (std::int64_t m = 0; m < rows; ++m) {
    for (std::int64_t n = 0; n < columns; ++n) {
      double sum = 0.0;
      for (std::int64_t d = 0; d < depth; ++d) {
        sum += (attr.transA ? a.at({d, m}) : a.at({m, d})) * (attr.transB ? b.at({n, d}) : b.at({d, n}));
      }
      double biasTerm = 0.0;
      if (c) {
        // Unidirectional broadcast from the last axis: size-1 axes repeat.
        Dims index;
        const Dims full{m, n};
        const std::size_t skip = 2 - c->dims.size();
        for (std::size_t i = 0; i < c->dims.size(); ++i) index.push_back(c->dims[i] == 1 ? 0 : full[skip + i]);
        biasTerm = attr.beta * c->at(index);
      }
      y.at({m, n}) = attr.alpha * sum + biasTerm;
    }
  }
  return y;
}

/// Adds a per-column bias [N] to a 2-D tensor (the Add a MatMul fold leaves behind).
Tensor addColumnBias(Tensor y, const std::vector<double>& bias) {
  forEachIndex(y.dims, [&](const Dims& index) { y.at(index) += bias[static_cast<std::size_t>(index[1])]; });
  return y;
}

double maxRelativeError(const std::vector<double>& actual, const std::vector<double>& expected) {
  REQUIRE(actual.size() == expected.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double error = std::abs(actual[i] - expected[i]) / std::max(1.0, std::abs(expected[i]));
    worst = std::isnan(error) ? INFINITY : std::max(worst, error);
  }
  return worst;
}

/// The layer alone must differ clearly from layer + BN, or a test comparing them would prove nothing.
void requireNonTrivial(const Tensor& layerOnly, const Tensor& reference) {
  REQUIRE(maxRelativeError(layerOnly.data, reference.data) > 1e-3);
}

struct ConvCase {
  std::string name;
  Dims input;   // [N, C, spatial...]
  Dims weight;  // Conv: [M, C/group, k...]; ConvTranspose: [C, M/group, k...]
  ConvGeometry geometry;
  bool hasBias;
};

std::vector<ConvCase> convCases() {
  return {
      {"1-D, group 2, stride 2, asymmetric pads, with bias", {2, 4, 7}, {6, 2, 3}, {{2}, {1}, {0}, {1}, {}, 2},
       true},
      {"2-D, dilation and stride, no bias", {1, 3, 5, 6}, {4, 3, 3, 2}, {{1, 2}, {1, 0}, {1, 1}, {2, 1}, {}, 1},
       false},
      {"2-D depthwise, multiplier 2", {2, 4, 4, 5}, {8, 1, 3, 3}, {{1, 1}, {1, 1}, {1, 1}, {1, 1}, {}, 4}, true},
      {"3-D, group 2", {1, 4, 4, 3, 5}, {6, 2, 2, 2, 3}, {{1, 2, 1}, {0, 1, 1}, {1, 0, 1}, {1, 1, 1}, {}, 2},
       true},
  };
}

std::vector<ConvCase> convTransposeCases() {
  return {
      {"1-D, group 2, stride 2, pads, output padding", {2, 4, 5}, {4, 3, 3}, {{2}, {1}, {0}, {1}, {1}, 2}, true},
      {"2-D, group 3, dilation, no bias", {1, 6, 3, 4}, {6, 3, 2, 3}, {{2, 1}, {1, 0}, {0, 1}, {1, 2}, {0, 0}, 3},
       false},
      {"2-D depthwise", {1, 3, 4, 4}, {3, 1, 3, 3}, {{2, 2}, {1, 1}, {1, 1}, {1, 1}, {1, 0}, 3}, true},
      {"3-D, group 1", {1, 2, 2, 3, 2}, {2, 3, 2, 2, 2}, {{2, 1, 2}, {0, 0, 1}, {1, 0, 0}, {1, 1, 1}, {0, 0, 1}, 1},
       true},
  };
}

using LayerFunction = Tensor (*)(const Tensor&, const Tensor&, const std::vector<double>&, const ConvGeometry&);

/// Layer + BN against the layer with folded weights and bias.
void checkBatchNormFold(const ConvCase& c, WeightKind kind, LayerFunction layer, unsigned seed,
                        const std::optional<BatchNormParams>& fixedParams = std::nullopt) {
  INFO(c.name);
  Random random(seed);
  const Tensor x = random.tensor(c.input);
  const Tensor w = random.tensor(c.weight);
  const WeightLayout layout{kind, c.geometry.group, false};
  const auto outChannels = k::outputChannelCount(layout, c.weight);
  REQUIRE(outChannels.has_value());
  const auto channels = static_cast<std::size_t>(*outChannels);
  const std::vector<double> bias = c.hasBias ? random.vector(channels) : std::vector<double>{};
  const BatchNormParams bn = fixedParams ? *fixedParams : randomBatchNorm(random, channels);

  const Tensor layerOnly = layer(x, w, bias, c.geometry);
  REQUIRE(static_cast<std::size_t>(layerOnly.dims[1]) == channels);
  const Tensor reference = naiveBatchNorm(layerOnly, bn);
  requireNonTrivial(layerOnly, reference);

  const ChannelAffine affine = affineOf(bn);
  Tensor foldedWeight = w;
  k::scaleOutputChannels(layout, foldedWeight.data, foldedWeight.dims, affine.scale);
  const std::vector<double> foldedBias = c.hasBias ? k::foldBias(bias, affine) : k::foldBias(affine);
  const Tensor folded = layer(x, foldedWeight, foldedBias, c.geometry);
  CHECK(folded.dims == reference.dims);
  CHECK(maxRelativeError(folded.data, reference.data) <= kTolerance);
}

/// Layer on a per-input-channel scaled input against the layer with input-scaled weights.
void checkInputScaling(const ConvCase& c, WeightKind kind, LayerFunction layer, unsigned seed) {
  INFO(c.name);
  Random random(seed);
  const Tensor x = random.tensor(c.input);
  const Tensor w = random.tensor(c.weight);
  const WeightLayout layout{kind, c.geometry.group, false};
  const auto inChannels = k::inputChannelCount(layout, c.weight);
  REQUIRE(inChannels.has_value());
  REQUIRE(*inChannels == c.input[1]);
  const std::vector<double> scale = random.vector(static_cast<std::size_t>(*inChannels), -2.0, 2.0);
  const auto outChannels = static_cast<std::size_t>(k::outputChannelCount(layout, c.weight).value());
  const std::vector<double> bias = c.hasBias ? random.vector(outChannels) : std::vector<double>{};

  const Tensor reference = layer(scaleAxis1(x, scale), w, bias, c.geometry);
  requireNonTrivial(layer(x, w, bias, c.geometry), reference);

  Tensor scaledWeight = w;
  k::scaleInputChannels(layout, scaledWeight.data, scaledWeight.dims, scale);
  CHECK(maxRelativeError(layer(x, scaledWeight, bias, c.geometry).data, reference.data) <= kTolerance);
}

}  // namespace

TEST_CASE("batchNormAsAffine matches hand-computed values, including degenerate parameters", "[kernels]") {
  // var = 0: scale = gamma / sqrt(eps) = 2 / 0.5 = 4, shift = 0.5 - 1 * 4.
  // gamma = 0: scale 0 and shift = beta exactly, whatever the mean.
  // large eps: 1 / sqrt(6 + 10) = 0.25, shift = 1 - 2 * 0.25.
  const auto zeroVar = k::batchNormAsAffine({2.0}, {0.5}, {1.0}, {0.0}, 0.25);
  CHECK(zeroVar.scale == std::vector<double>{4.0});
  CHECK(zeroVar.shift == std::vector<double>{-3.5});
  const auto zeroGamma = k::batchNormAsAffine({0.0, 0.0}, {0.75, -3.0}, {123.0, -7.0}, {2.0, 0.0}, 1e-5);
  CHECK(zeroGamma.scale == std::vector<double>{0.0, 0.0});
  CHECK(zeroGamma.shift == std::vector<double>{0.75, -3.0});
  const auto largeEps = k::batchNormAsAffine({1.0}, {1.0}, {2.0}, {6.0}, 10.0);
  CHECK(largeEps.scale == std::vector<double>{0.25});
  CHECK(largeEps.shift == std::vector<double>{0.5});

  CHECK_THROWS_AS(k::batchNormAsAffine({1.0, 2.0}, {1.0}, {1.0, 1.0}, {1.0, 1.0}, 1e-5), std::invalid_argument);
}

TEST_CASE("findNonPositiveVariance flags channels the fold would divide by zero on", "[kernels]") {
  CHECK_FALSE(k::findNonPositiveVariance({0.0, 1.0, 2.5}, 1e-5).has_value());
  CHECK(k::findNonPositiveVariance({1.0, 0.0}, 0.0) == std::optional<std::size_t>(1));
  CHECK(k::findNonPositiveVariance({1.0, 1.0, -2.0}, 1.0) == std::optional<std::size_t>(2));
  CHECK(k::findNonPositiveVariance({NAN, 1.0}, 1e-5) == std::optional<std::size_t>(0));
  CHECK(k::findNonPositiveVariance({1.0, INFINITY}, 1e-5) == std::optional<std::size_t>(1));
}

TEST_CASE("channel counts follow the ONNX weight layouts", "[kernels]") {
  using Kind = WeightKind;
  CHECK(k::outputChannelCount({Kind::Conv, 1, false}, {8, 3, 3, 3}) == std::optional<std::int64_t>(8));
  CHECK(k::inputChannelCount({Kind::Conv, 4, false}, {8, 2, 3, 3}) == std::optional<std::int64_t>(8));
  CHECK(k::outputChannelCount({Kind::ConvTranspose, 2, false}, {4, 3, 2, 2}) == std::optional<std::int64_t>(6));
  CHECK(k::inputChannelCount({Kind::ConvTranspose, 2, false}, {4, 3, 2, 2}) == std::optional<std::int64_t>(4));
  CHECK(k::outputChannelCount({Kind::Gemm, 1, false}, {4, 5}) == std::optional<std::int64_t>(5));
  CHECK(k::outputChannelCount({Kind::Gemm, 1, true}, {4, 5}) == std::optional<std::int64_t>(4));
  CHECK(k::inputChannelCount({Kind::Gemm, 1, true}, {4, 5}) == std::optional<std::int64_t>(5));
  CHECK(k::outputChannelCount({Kind::MatMul, 1, false}, {4, 5}) == std::optional<std::int64_t>(5));
  CHECK(k::inputChannelCount({Kind::MatMul, 1, false}, {4, 5}) == std::optional<std::int64_t>(4));

  // Dims that cannot belong to the layout.
  CHECK_FALSE(k::outputChannelCount({Kind::Conv, 3, false}, {8, 2, 3}).has_value());  // 8 not divisible by 3
  CHECK_FALSE(k::outputChannelCount({Kind::Conv, 0, false}, {8, 2, 3}).has_value());
  CHECK_FALSE(k::outputChannelCount({Kind::Conv, 1, false}, {8, 2}).has_value());      // no kernel axes
  CHECK_FALSE(k::outputChannelCount({Kind::ConvTranspose, 4, false}, {6, 1, 3}).has_value());
  CHECK_FALSE(k::outputChannelCount({Kind::Gemm, 1, false}, {2, 3, 4}).has_value());
  CHECK_FALSE(k::outputChannelCount({Kind::MatMul, 1, false}, {4, -1}).has_value());
}

TEST_CASE("weight scaling rejects arguments that do not fit together", "[kernels]") {
  std::vector<double> weights(24, 1.0);
  const WeightLayout conv{WeightKind::Conv, 1, false};
  CHECK_THROWS_AS(k::scaleOutputChannels(conv, weights, {4, 2, 3}, {1.0, 2.0, 3.0}), std::invalid_argument);
  CHECK_THROWS_AS(k::scaleOutputChannels(conv, weights, {4, 2, 2}, {1.0, 2.0, 3.0, 4.0}), std::invalid_argument);
  CHECK_THROWS_AS(k::scaleInputChannels({WeightKind::Conv, 3, false}, weights, {4, 2, 3}, std::vector<double>(6)),
                  std::invalid_argument);
  CHECK_THROWS_AS(k::scaleOutputChannels({WeightKind::Gemm, 1, true}, weights, {4, 6}, std::vector<double>(6)),
                  std::invalid_argument);
  CHECK(weights == std::vector<double>(24, 1.0));  // nothing written by a rejected call
}

TEST_CASE("Conv + BN fold matches a direct convolution followed by BN", "[kernels]") {
  unsigned seed = 100;
  for (const ConvCase& c : convCases()) checkBatchNormFold(c, WeightKind::Conv, naiveConv, seed++);
}

TEST_CASE("ConvTranspose + BN fold matches a direct transposed convolution followed by BN", "[kernels]") {
  unsigned seed = 200;
  for (const ConvCase& c : convTransposeCases()) {
    checkBatchNormFold(c, WeightKind::ConvTranspose, naiveConvTranspose, seed++);
  }
}

TEST_CASE("BN fold stays exact for degenerate parameters", "[kernels]") {
  const ConvCase conv = convCases()[0];            // M = 6
  const ConvCase transposed = convTransposeCases()[1];  // M = 9
  for (std::size_t channels : {std::size_t{6}, std::size_t{9}}) {
    const ConvCase& c = channels == 6 ? conv : transposed;
    const WeightKind kind = channels == 6 ? WeightKind::Conv : WeightKind::ConvTranspose;
    const LayerFunction layer = channels == 6 ? naiveConv : naiveConvTranspose;
    Random random(300 + static_cast<unsigned>(channels));
    BatchNormParams params = randomBatchNorm(random, channels);

    SECTION("var = 0 in " + c.name) {
      std::fill(params.var.begin(), params.var.end(), 0.0);
      checkBatchNormFold(c, kind, layer, 7, params);
    }
    SECTION("eps = 10 in " + c.name) {
      params.epsilon = 10.0;
      checkBatchNormFold(c, kind, layer, 8, params);
    }
    SECTION("gamma = 0 in " + c.name + ": the output is exactly beta") {
      std::fill(params.gamma.begin(), params.gamma.end(), 0.0);
      const Tensor x = random.tensor(c.input);
      Tensor w = random.tensor(c.weight);
      const std::vector<double> bias = random.vector(channels);
      const ChannelAffine affine = affineOf(params);
      k::scaleOutputChannels({kind, c.geometry.group, false}, w.data, w.dims, affine.scale);
      const Tensor y = layer(x, w, k::foldBias(bias, affine), c.geometry);
      std::size_t mismatches = 0;
      forEachIndex(y.dims, [&](const Dims& index) {
        if (y.at(index) != params.beta[static_cast<std::size_t>(index[1])]) ++mismatches;
      });
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("per-input-channel scaling of Conv and ConvTranspose weights", "[kernels]") {
  unsigned seed = 400;
  for (const ConvCase& c : convCases()) checkInputScaling(c, WeightKind::Conv, naiveConv, seed++);
  for (const ConvCase& c : convTransposeCases()) {
    checkInputScaling(c, WeightKind::ConvTranspose, naiveConvTranspose, seed++);
  }
}

TEST_CASE("Gemm + BN fold for every transA/transB/alpha/beta and C shape", "[kernels]") {
  constexpr std::int64_t rows = 3, depth = 4, columns = 5;
  struct BiasCase {
    const char* name;
    std::optional<Dims> dims;  // nullopt: no C input
    Dims foldedDims;           // documented shape of C' when beta != 0
  };
  const std::vector<BiasCase> biasCases = {
      {"no C", std::nullopt, {columns}},     {"scalar []", Dims{}, {columns}},
      {"[1]", Dims{1}, {columns}},           {"[N]", Dims{columns}, {columns}},
      {"[1,1]", Dims{1, 1}, {1, columns}},   {"[1,N]", Dims{1, columns}, {1, columns}},
      {"[M,1]", Dims{rows, 1}, {rows, columns}}, {"[M,N]", Dims{rows, columns}, {rows, columns}},
  };
  unsigned seed = 500;
  for (bool transA : {false, true}) {
    for (bool transB : {false, true}) {
      for (double alpha : {1.0, 0.75}) {
        for (double beta : {1.0, 0.5, 0.0, -2.0}) {
          for (const BiasCase& biasCase : biasCases) {
            INFO("transA " << transA << " transB " << transB << " alpha " << alpha << " beta " << beta << " C "
                           << biasCase.name);
            Random random(seed++);
            const Tensor a = random.tensor(transA ? Dims{depth, rows} : Dims{rows, depth});
            const Tensor b = random.tensor(transB ? Dims{columns, depth} : Dims{depth, columns});
            std::optional<Tensor> c;
            if (biasCase.dims) c = random.tensor(*biasCase.dims);
            const BatchNormParams bn = randomBatchNorm(random, columns);
            const GemmAttributes attributes{transA, transB, alpha, beta};

            const Tensor layerOnly = naiveGemm(a, b, c, attributes);
            const Tensor reference = naiveBatchNorm(layerOnly, bn);
            requireNonTrivial(layerOnly, reference);

            const ChannelAffine affine = affineOf(bn);
            Tensor foldedB = b;
            k::scaleOutputChannels({WeightKind::Gemm, 1, transB}, foldedB.data, foldedB.dims, affine.scale);
            const k::GemmBiasFold foldedC =
                c ? k::foldGemmBias(c->data, c->dims, beta, affine) : k::foldGemmBias(affine);
            CHECK(foldedC.dims == (c && beta != 0.0 ? biasCase.foldedDims : Dims{columns}));
            CHECK(k::isGemmBiasShape(foldedC.dims, columns));
            const Tensor folded = naiveGemm(a, foldedB, Tensor(foldedC.dims, foldedC.values),
                                            {transA, transB, alpha, foldedC.beta});
            CHECK(maxRelativeError(folded.data, reference.data) <= kTolerance);
          }
        }
      }
    }
  }
}

TEST_CASE("Gemm C shapes", "[kernels]") {
  CHECK(k::isGemmBiasShape({}, 5));
  CHECK(k::isGemmBiasShape({1}, 5));
  CHECK(k::isGemmBiasShape({5}, 5));
  CHECK(k::isGemmBiasShape({7, 1}, 5));
  CHECK(k::isGemmBiasShape({7, 5}, 5));
  CHECK_FALSE(k::isGemmBiasShape({4}, 5));
  CHECK_FALSE(k::isGemmBiasShape({5, 4}, 5));
  CHECK_FALSE(k::isGemmBiasShape({1, 1, 5}, 5));
  CHECK_FALSE(k::isGemmBiasShape({0, 5}, 5));

  const ChannelAffine affine{{2.0, 3.0}, {1.0, -1.0}};
  CHECK_THROWS_AS(k::foldGemmBias({1.0, 2.0, 3.0}, {3}, 1.0, affine), std::invalid_argument);
  CHECK_THROWS_AS(k::foldGemmBias({1.0, 2.0, 3.0}, {2}, 1.0, affine), std::invalid_argument);
}

TEST_CASE("per-input-channel scaling of Gemm B", "[kernels]") {
  constexpr std::int64_t rows = 3, depth = 4, columns = 5;
  unsigned seed = 600;
  for (bool transA : {false, true}) {
    for (bool transB : {false, true}) {
      INFO("transA " << transA << " transB " << transB);
      Random random(seed++);
      const Tensor a = random.tensor(transA ? Dims{depth, rows} : Dims{rows, depth});
      const Tensor b = random.tensor(transB ? Dims{columns, depth} : Dims{depth, columns});
      const Tensor c = random.tensor({columns});
      const std::vector<double> scale = random.vector(depth, -2.0, 2.0);
      const GemmAttributes attributes{transA, transB, 0.5, 1.5};

      // The Mul scales A's K axis: columns of [M, K], rows of [K, M].
      Tensor scaledA = a;
      forEachIndex(a.dims, [&](const Dims& index) {
        scaledA.at(index) *= scale[static_cast<std::size_t>(index[transA ? 0 : 1])];
      });
      const Tensor reference = naiveGemm(scaledA, b, c, attributes);
      requireNonTrivial(naiveGemm(a, b, c, attributes), reference);

      Tensor scaledB = b;
      k::scaleInputChannels({WeightKind::Gemm, 1, transB}, scaledB.data, scaledB.dims, scale);
      CHECK(maxRelativeError(naiveGemm(a, scaledB, c, attributes).data, reference.data) <= kTolerance);
    }
  }
}

TEST_CASE("MatMul (+ bias Add) + BN fold, and MatMul input scaling", "[kernels]") {
  constexpr std::int64_t rows = 4, depth = 3, columns = 6;
  Random random(700);
  const Tensor a = random.tensor({rows, depth});
  const Tensor b = random.tensor({depth, columns});
  const BatchNormParams bn = randomBatchNorm(random, columns);
  const ChannelAffine affine = affineOf(bn);
  const WeightLayout matmul{WeightKind::MatMul, 1, false};
  Tensor foldedB = b;
  k::scaleOutputChannels(matmul, foldedB.data, foldedB.dims, affine.scale);

  SECTION("MatMul -> BN becomes MatMul -> Add(shift)") {
    const Tensor layerOnly = naiveGemm(a, b, std::nullopt, {});
    const Tensor reference = naiveBatchNorm(layerOnly, bn);
    requireNonTrivial(layerOnly, reference);
    const Tensor folded = addColumnBias(naiveGemm(a, foldedB, std::nullopt, {}), k::foldBias(affine));
    CHECK(maxRelativeError(folded.data, reference.data) <= kTolerance);
  }
  SECTION("MatMul -> Add(bias) -> BN becomes MatMul -> Add(folded bias)") {
    const std::vector<double> bias = random.vector(columns);
    const Tensor layerOnly = addColumnBias(naiveGemm(a, b, std::nullopt, {}), bias);
    const Tensor reference = naiveBatchNorm(layerOnly, bn);
    requireNonTrivial(layerOnly, reference);
    const Tensor folded = addColumnBias(naiveGemm(a, foldedB, std::nullopt, {}), k::foldBias(bias, affine));
    CHECK(maxRelativeError(folded.data, reference.data) <= kTolerance);
  }
  SECTION("Mul(per-K scale) -> MatMul becomes MatMul with scaled rows") {
    const std::vector<double> scale = random.vector(depth, -2.0, 2.0);
    Tensor scaledA = a;
    forEachIndex(a.dims, [&](const Dims& index) { scaledA.at(index) *= scale[static_cast<std::size_t>(index[1])]; });
    const Tensor reference = naiveGemm(scaledA, b, std::nullopt, {});
    requireNonTrivial(naiveGemm(a, b, std::nullopt, {}), reference);
    Tensor scaledB = b;
    k::scaleInputChannels(matmul, scaledB.data, scaledB.dims, scale);
    CHECK(maxRelativeError(naiveGemm(a, scaledB, std::nullopt, {}).data, reference.data) <= kTolerance);
  }
  SECTION("bias length mismatch is rejected") {
    CHECK_THROWS_AS(k::foldBias(std::vector<double>(columns + 1), affine), std::invalid_argument);
  }
}

TEST_CASE("per-channel constants under numpy broadcasting", "[kernels]") {
  const std::vector<double> three{1.5, -2.0, 4.0};
  const std::vector<double> one{0.25};
  const std::vector<double> copies(3, 0.25);
  using Values = std::optional<std::vector<double>>;

  SECTION("NCHW output, channel axis 1, C = 3") {
    CHECK(k::perChannelValues(4, 1, 3, {1, 3, 1, 1}, three) == Values(three));
    CHECK(k::perChannelValues(4, 1, 3, {3, 1, 1}, three) == Values(three));
    CHECK(k::perChannelValues(4, 1, 3, {}, one) == Values(copies));
    CHECK(k::perChannelValues(4, 1, 3, {1}, one) == Values(copies));
    CHECK(k::perChannelValues(4, 1, 3, {1, 1, 1, 1}, one) == Values(copies));
    // The trap: [C] lines up with W, not C.
    CHECK_FALSE(k::perChannelValues(4, 1, 3, {3}, three).has_value());
    CHECK_FALSE(k::isPerChannelShape(4, 1, 3, {3}));
    CHECK_FALSE(k::perChannelValues(4, 1, 3, {3, 1}, three).has_value());               // lines up with H
    CHECK_FALSE(k::perChannelValues(4, 1, 4, {1, 3, 1, 1}, three).has_value());         // C mismatch
    CHECK_FALSE(k::perChannelValues(4, 1, 3, {1, 3, 1, 2}, std::vector<double>(6)).has_value());
    CHECK_FALSE(k::perChannelValues(4, 1, 3, {3, 1, 1, 1}, three).has_value());         // batch axis
    CHECK_FALSE(k::perChannelValues(4, 1, 3, {1, 1, 3, 1, 1}, three).has_value());      // would grow the rank
  }
  SECTION("[N, C] output of Gemm / MatMul") {
    CHECK(k::perChannelValues(2, 1, 3, {3}, three) == Values(three));
    CHECK(k::perChannelValues(2, 1, 3, {1, 3}, three) == Values(three));
    CHECK(k::perChannelValues(2, 1, 3, {}, one) == Values(copies));
    CHECK_FALSE(k::perChannelValues(2, 1, 3, {3, 1}, three).has_value());  // broadcasts over rows
    CHECK_FALSE(k::perChannelValues(2, 1, 4, {3}, three).has_value());
  }
  SECTION("[N, C, L] output of a 1-D Conv") {
    CHECK(k::isPerChannelShape(3, 1, 3, {3, 1}));
    CHECK(k::isPerChannelShape(3, 1, 3, {1, 3, 1}));
    CHECK_FALSE(k::isPerChannelShape(3, 1, 3, {3}));
  }
  SECTION("a single channel") {
    CHECK(k::perChannelValues(4, 1, 1, {1}, one) == Values(one));
  }
  SECTION("argument errors") {
    CHECK_THROWS_AS(k::perChannelValues(4, 1, 3, {1, 3, 1, 1}, one), std::invalid_argument);
    CHECK_THROWS_AS(k::isPerChannelShape(4, 4, 3, {}), std::invalid_argument);
    CHECK_THROWS_AS(k::isPerChannelShape(4, -1, 3, {}), std::invalid_argument);
    CHECK_THROWS_AS(k::isPerChannelShape(4, 1, 0, {}), std::invalid_argument);
  }
}

TEST_CASE("training-mode BN statistics and running-stat update", "[kernels]") {
  SECTION("hand-computed batch statistics") {
    // x [2, 2, 2]: channel 0 holds {1, 3, 5, 7} (mean 4, population var 5),
    // channel 1 holds {10, 10, 10, 14} (mean 11, var 3).
    const auto stats = k::batchStatistics({1, 3, 10, 10, 5, 7, 10, 14}, {2, 2, 2});
    CHECK(stats.mean == std::vector<double>{4.0, 11.0});
    CHECK(stats.variance == std::vector<double>{5.0, 3.0});
  }
  SECTION("random [3, 4, 2, 3] against a direct sum, and normalising gives mean 0 / var 1") {
    Random random(800);
    const Tensor x = random.tensor({3, 4, 2, 3});
    const auto stats = k::batchStatistics(x.data, x.dims);
    std::vector<double> sum(4, 0.0), sumSquares(4, 0.0);
    forEachIndex(x.dims, [&](const Dims& index) {
      sum[static_cast<std::size_t>(index[1])] += x.at(index);
      sumSquares[static_cast<std::size_t>(index[1])] += x.at(index) * x.at(index);
    });
    const double count = 3 * 2 * 3;
    std::vector<double> expectedMean(4), expectedVar(4);
    for (std::size_t c = 0; c < 4; ++c) {
      expectedMean[c] = sum[c] / count;
      expectedVar[c] = sumSquares[c] / count - expectedMean[c] * expectedMean[c];
    }
    CHECK(maxRelativeError(stats.mean, expectedMean) <= kTolerance);
    CHECK(maxRelativeError(stats.variance, expectedVar) <= kTolerance);

    const BatchNormParams standardise{std::vector<double>(4, 1.0), std::vector<double>(4, 0.0), stats.mean,
                                      stats.variance, 0.0};
    const std::vector<double> y = k::applyChannelAffine(x.data, x.dims, affineOf(standardise));
    CHECK(maxRelativeError(y, naiveBatchNorm(x, standardise).data) <= kTolerance);
    const auto normalised = k::batchStatistics(y, x.dims);
    CHECK(maxRelativeError(normalised.mean, std::vector<double>(4, 0.0)) <= kTolerance);
    CHECK(maxRelativeError(normalised.variance, std::vector<double>(4, 1.0)) <= kTolerance);
  }
  SECTION("applyChannelAffine with random BN params is BatchNormalization on a 2-D input") {
    Random random(801);
    const Tensor x = random.tensor({5, 3});
    const BatchNormParams bn = randomBatchNorm(random, 3);
    CHECK(maxRelativeError(k::applyChannelAffine(x.data, x.dims, affineOf(bn)), naiveBatchNorm(x, bn).data) <=
          kTolerance);
  }
  SECTION("running update: running * momentum + current * (1 - momentum)") {
    CHECK(k::updateRunningStatistic({1.0, 2.0}, {3.0, -2.0}, 0.75) == std::vector<double>{1.5, 1.0});
    const auto updated = k::updateRunningStatistic({0.0}, {1.0}, 0.9);
    CHECK(updated[0] == Approx(0.1).epsilon(1e-15));
    CHECK_THROWS_AS(k::updateRunningStatistic({1.0}, {1.0, 2.0}, 0.9), std::invalid_argument);
  }
  SECTION("bad inputs") {
    CHECK_THROWS_AS(k::batchStatistics({1.0, 2.0}, {2}), std::invalid_argument);
    CHECK_THROWS_AS(k::batchStatistics({1.0, 2.0}, {1, 3}), std::invalid_argument);
    CHECK_THROWS_AS(k::batchStatistics({}, {0, 3}), std::invalid_argument);
  }
}

namespace {
/// The channel of each element of a weight, worked out from its multi-index as the ONNX layouts define it.
std::vector<std::int64_t> channelsByLayout(const WeightLayout& layout, const Dims& dims, bool output) {
  std::vector<std::int64_t> channels;
  forEachIndex(dims, [&](const Dims& index) {
    const std::int64_t group = dims.size() >= 2 ? index[0] / (dims[0] / layout.group) : 0;
    switch (layout.kind) {
      case WeightKind::Conv:  // [M, C/g, k...]
        channels.push_back(output ? index[0] : group * dims[1] + index[1]);
        break;
      case WeightKind::ConvTranspose:  // [C, M/g, k...]
        channels.push_back(output ? group * dims[1] + index[1] : index[0]);
        break;
      case WeightKind::Gemm:  // [K, N] or, transposed, [N, K]
        channels.push_back(output == layout.transB ? index[0] : index[1]);
        break;
      case WeightKind::MatMul:  // [K, N]
        channels.push_back(output ? index[1] : index[0]);
        break;
    }
  });
  return channels;
}
}  // namespace

TEST_CASE("channel indexing and channel runs agree with the layouts element by element", "[kernels]") {
  using Kind = WeightKind;
  const std::vector<std::pair<WeightLayout, Dims>> cases = {
      {{Kind::Conv, 1, false}, {4, 3, 2, 2}},         {{Kind::Conv, 2, false}, {6, 2, 3}},
      {{Kind::Conv, 4, false}, {4, 1, 3, 3}},         {{Kind::Conv, 1, false}, {3, 2, 1, 1, 1}},
      {{Kind::ConvTranspose, 1, false}, {3, 4, 2}},   {{Kind::ConvTranspose, 3, false}, {6, 2, 2, 2}},
      {{Kind::ConvTranspose, 2, false}, {4, 3, 1}},   {{Kind::Gemm, 1, false}, {5, 3}},
      {{Kind::Gemm, 1, true}, {5, 3}},                {{Kind::MatMul, 1, false}, {4, 7}},
      {{Kind::MatMul, 1, false}, {1, 1}},
  };
  for (const auto& [layout, dims] : cases) {
    for (bool output : {true, false}) {
      INFO("kind " << static_cast<int>(layout.kind) << " group " << layout.group << " transB " << layout.transB
                   << " dims " << dims.size() << "-D first " << dims[0] << (output ? " output" : " input"));
      const auto expected = channelsByLayout(layout, dims, output);
      const auto indexing = output ? k::outputChannelIndexing(layout, dims) : k::inputChannelIndexing(layout, dims);
      REQUIRE(indexing.has_value());
      const auto count = static_cast<std::int64_t>(expected.size());
      for (std::int64_t i = 0; i < count; ++i) REQUIRE(indexing->channel(i) == expected[static_cast<std::size_t>(i)]);
      // Every window [first, first + length) walks as runs that cover it exactly, each with the right channel.
      for (std::int64_t first = 0; first < count; ++first) {
        for (std::int64_t length = 0; first + length <= count; ++length) {
          std::int64_t covered = 0;
          bool right = true;
          k::forEachChannelRun(*indexing, first, length, [&](std::int64_t offset, std::int64_t run, std::int64_t c) {
            right = right && offset == covered && run > 0;
            for (std::int64_t j = offset; j < offset + run; ++j)
              right = right && c == expected[static_cast<std::size_t>(first + j)];
            covered += run;
          });
          REQUIRE(right);
          REQUIRE(covered == length);
        }
      }
    }
  }
  CHECK_FALSE(k::outputChannelIndexing({Kind::Conv, 3, false}, {8, 2, 3}).has_value());
  CHECK_FALSE(k::inputChannelIndexing({Kind::Gemm, 1, false}, {2, 3, 4}).has_value());
}
