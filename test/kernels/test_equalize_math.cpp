// Equalization math against hand-computed values: channel ranges per layout, the int8 error, pairwise scales,
// a triple's convergence to AIMET's closed form, and the never-worse check.

#include <catch2/catch.hpp>
#include <cmath>

#include "kernels/equalize_math.h"

using namespace bnfold::kernels;

namespace {

ChainLayer conv(std::vector<double> weights, Dims dims, std::int64_t group = 1) {
  ChainLayer layer;
  layer.layout.kind = WeightKind::Conv;
  layer.layout.group = group;
  layer.weights = std::move(weights);
  layer.dims = std::move(dims);
  return layer;
}

}  // namespace

TEST_CASE("equalize math: channel ranges per layout", "[equalize][kernels]") {
  const ChainLayer c = conv({1, -3, 0.5, 2}, {2, 2, 1, 1});
  CHECK(outputChannelRanges(c.layout, c.weights, c.dims) == std::vector<double>{3, 2});
  CHECK(inputChannelRanges(c.layout, c.weights, c.dims) == std::vector<double>{1, 3});
  WeightLayout gemm{WeightKind::Gemm, 1, true};  // B [N, K]: rows are outputs
  CHECK(outputChannelRanges(gemm, {1, -5, 2, 0.5, 4, -1}, {2, 3}) == std::vector<double>{5, 4});
  CHECK(inputChannelRanges(gemm, {1, -5, 2, 0.5, 4, -1}, {2, 3}) == std::vector<double>{1, 5, 2});
  // Depthwise Conv [4, 1, 1, 1], group 4: row c reads input channel c only.
  const ChainLayer depthwise = conv({1, -2, 3, -4}, {4, 1, 1, 1}, 4);
  CHECK(inputChannelRanges(depthwise.layout, depthwise.weights, depthwise.dims) == std::vector<double>{1, 2, 3, 4});
  CHECK_THROWS_AS(outputChannelRanges(c.layout, c.weights, {3, 2, 1, 1}), std::invalid_argument);
}

TEST_CASE("equalize math: relative int8 error", "[equalize][kernels]") {
  CHECK(relativeInt8Error({0, 0}) == 0.0);
  CHECK(relativeInt8Error({1, -1, 0}) == 0.0);
  // Step 1/127: 0.5 is 63.5 steps and rounds to 64 (away from zero).
  const double q = 64.0 / 127.0;
  CHECK(relativeInt8Error({1, 0.5}) == Approx((0.5 - q) * (0.5 - q) / 1.25).epsilon(1e-12));
}

TEST_CASE("equalize math: per-channel relative int8 error with one step for the tensor", "[equalize][kernels]") {
  // Rows {1} and {0.5}: the step is 1/127; row 0 is exact, row 1 rounds 63.5 steps to 64.
  const ChainLayer c = conv({1, 0.5}, {2, 1, 1, 1});
  const double q = 64.0 / 127.0;
  CHECK(channelRelativeInt8Error(c.layout, c.weights, c.dims, true) ==
        Approx((0.5 - q) * (0.5 - q) / 0.25 / 2).epsilon(1e-12));
  // By input channel the one column holds both rows.
  CHECK(channelRelativeInt8Error(c.layout, c.weights, c.dims, false) ==
        Approx((0.5 - q) * (0.5 - q) / 1.25).epsilon(1e-12));
  // An all-zero channel is not counted.
  CHECK(channelRelativeInt8Error(c.layout, {1, 0}, c.dims, true) == 0.0);
}

TEST_CASE("equalize math: a pair gets sqrt(r1 / r2) and equal ranges", "[equalize][kernels]") {
  const std::vector<ChainLayer> chain{conv({4, 1}, {2, 1, 1, 1}), conv({1, 4}, {1, 2, 1, 1})};
  const ChainScales result = equalizeChain(chain, {true});
  CHECK(result.kept == std::vector<bool>{true});
  CHECK(result.converged);
  REQUIRE(result.scales[0].size() == 2);
  CHECK(result.scales[0][0] == Approx(2.0));
  CHECK(result.scales[0][1] == Approx(0.5));
  CHECK(equalizedWeights(chain, result.scales, 0) == std::vector<double>{2, 2});
  CHECK(equalizedWeights(chain, result.scales, 1) == std::vector<double>{2, 2});
}

TEST_CASE("equalize math: a triple converges to AIMET's closed form", "[equalize][kernels]") {
  // Ranges 8, 1, 1 for one channel: S12 = r1 / cbrt(r1 r2 r3) = 4, S23 = cbrt(r1 r2 r3) / r3 = 2.
  const std::vector<ChainLayer> chain{conv({8, 3}, {1, 2, 1, 1}), conv({1}, {1, 1, 1, 1}), conv({1}, {1, 1, 1, 1})};
  EqualizeSettings plain;
  plain.keepOnlyImproving = false;  // one-weight channels have no int8 error to lower
  const ChainScales result = equalizeChain(chain, {true, true}, plain);
  CHECK(result.kept == std::vector<bool>{true, true});
  CHECK(result.converged);
  CHECK(result.sweeps > 2);
  CHECK(result.proposed[0][0] == Approx(4.0).epsilon(1e-6));
  CHECK(result.proposed[1][0] == Approx(2.0).epsilon(1e-6));
  CHECK(equalizedWeights(chain, result.scales, 0)[0] == Approx(2.0).epsilon(1e-6));
  CHECK(equalizedWeights(chain, result.scales, 1)[0] == Approx(2.0).epsilon(1e-6));
  CHECK(equalizedWeights(chain, result.scales, 2)[0] == Approx(2.0).epsilon(1e-6));
}

TEST_CASE("equalize math: a link that would raise the int8 error is left alone", "[equalize][kernels]") {
  // Both weights lie on their int8 grids already; the scales (1, 1/sqrt(127)) would move them off.
  const std::vector<ChainLayer> chain{conv({1, 1.0 / 127}, {2, 1, 1, 1}), conv({1, 1}, {1, 2, 1, 1})};
  const ChainScales result = equalizeChain(chain, {true});
  CHECK(result.kept == std::vector<bool>{false});
  CHECK(result.scales[0] == std::vector<double>{1, 1});
  CHECK(result.proposed[0][1] == Approx(1 / std::sqrt(127.0)));
  CHECK_THROWS_AS(equalizeChain({chain[0]}, {}), std::invalid_argument);
}
