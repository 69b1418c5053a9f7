// Equalization math against hand-computed values: channel ranges per layout, the int8 error, pairwise scales,
// a triple's convergence to AIMET's closed form, the chain's output-referred noise and the choice it drives.

#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>

#include "chain_layers.h"
#include "kernels/equalize_math.h"

using namespace bnfold::kernels;
using bnfold::kernels::test::conv;

namespace {

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
  // Both weights lie on their int8 grids already; the scales (1, 1/sqrt(127)) would move them off. Only the exact
  // noise sees a grid (the estimate gives every weight above half a step a uniform rounding error).
  const std::vector<ChainLayer> chain{conv({1, 1.0 / 127}, {2, 1, 1, 1}), conv({1, 1}, {1, 2, 1, 1})};
  EqualizeSettings exact;
  exact.noise = NoiseMeasure::Exact;
  const ChainScales result = equalizeChain(chain, {true}, exact);
  CHECK(result.kept == std::vector<bool>{false});
  CHECK(result.scales[0] == std::vector<double>{1, 1});
  CHECK(result.proposed[0][1] == Approx(1 / std::sqrt(127.0)));
  CHECK_THROWS_AS(equalizeChain({chain[0]}, {}), std::invalid_argument);
}

TEST_CASE("equalize math: int8 noise referred to the chain's output", "[equalize][kernels]") {
  // L0 [2, 1]: rows 2 and 1 (output powers 4 and 1 for a unit input); L1 [1, 2] reads both with weight 1, so the
  // chain's signal is 4 + 1 = 5 and both middle channels have gain 1.
  const std::vector<ChainLayer> chain{conv({2, 1}, {2, 1, 1, 1}), conv({1, 1}, {1, 2, 1, 1})};
  // As given: L0's step is 2/127 and its 1 (63.5 steps) rounds to 64 steps, off by 1/127; L1 is on its grid.
  const std::vector<double> given = chainInt8Noise(chain, {{1, 1}});
  REQUIRE(given.size() == 2);
  CHECK(given[0] == Approx(1.0 / (127.0 * 127.0) / 5.0).epsilon(1e-9));
  CHECK(given[1] == 0.0);
  // Scales (1, 1/2): L0 becomes (2, 2), on its grid; L1's second input weight 1/2 rounds to 64/127, off by 1/254,
  // and reads channel 1 at 1/(1/2)^2 = 4 times its power: the same noise, moved to L1.
  const std::vector<double> moved = chainInt8Noise(chain, {{1, 0.5}});
  CHECK(moved[0] == Approx(0.0).margin(1e-15));
  CHECK(moved[1] == Approx(4.0 / (254.0 * 254.0) / 5.0).epsilon(1e-9));
  CHECK_THROWS_AS(chainInt8Noise(chain, {}), std::invalid_argument);
}

TEST_CASE("equalize math: the chosen scales have the least noise of the candidates tried", "[equalize][kernels]") {
  // A Conv -> depthwise Conv -> Conv chain with rows spread over two decades, as BN folding leaves them.
  const std::size_t channels = 6;
  std::vector<double> first, depthwise, last;
  for (std::size_t c = 0; c < channels; ++c) {
    const double magnitude = std::pow(10.0, -1.0 + 2.0 * static_cast<double>((c * 5) % channels) / (channels - 1));
    for (std::size_t i = 0; i < 3; ++i) first.push_back(magnitude * std::sin(1.0 + static_cast<double>(c * 3 + i)));
    for (std::size_t i = 0; i < 9; ++i) depthwise.push_back(std::cos(0.5 + static_cast<double>(c * 9 + i)) / magnitude);
  }
  for (std::size_t i = 0; i < 4 * channels; ++i) last.push_back(std::sin(0.3 + 1.7 * static_cast<double>(i)));
  const std::vector<ChainLayer> chain{conv(first, {6, 3, 1, 1}), conv(depthwise, {6, 1, 3, 3}, 6),
                                      conv(last, {4, 6, 1, 1})};
  const ChainScales result = equalizeChain(chain, {true, true});
  auto total = [&](const std::vector<std::vector<double>>& scales) {
    double sum = 0.0;
    for (double noise : estimatedChainInt8Noise(chain, scales)) sum += noise;
    return sum;
  };
  const std::vector<std::vector<double>> identity(2, std::vector<double>(channels, 1.0));
  CHECK(result.noiseBefore == Approx(total(identity)).epsilon(1e-12));
  CHECK(result.noiseAfter == Approx(total(result.scales)).epsilon(1e-12));
  CHECK(result.noiseAfter < 0.95 * result.noiseBefore);
  // No uniform power of the chosen method's full scales does better than the per-link choice.
  for (double power : {0.5, 1.0}) {
    std::vector<std::vector<double>> uniform = result.proposed;
    for (auto& link : uniform)
      for (double& s : link) s = std::pow(s, power);
    CHECK(result.noiseAfter <= total(uniform) * (1.0 + 1e-12));
  }
  for (std::size_t k = 0; k < 2; ++k) {
    INFO("link " << k);
    CHECK(result.kept[k] == (result.power[k] > 0.0));
    for (std::size_t i = 0; i < channels; ++i)
      CHECK(result.scales[k][i] == Approx(std::pow(result.proposed[k][i], result.power[k])).epsilon(1e-12));
  }
}

TEST_CASE("equalize math: a gain below the minimum leaves the chain alone", "[equalize][kernels]") {
  // The sweep's s = (sqrt 2, 1) puts both layers on values whose noise is well below the chain's as given.
  const std::vector<ChainLayer> chain{conv({2, 1}, {2, 1, 1, 1}), conv({1, 1}, {1, 2, 1, 1})};
  const ChainScales kept = equalizeChain(chain, {true});
  CHECK(kept.kept == std::vector<bool>{true});
  CHECK(kept.scales[0][0] == Approx(std::sqrt(2.0)));
  const double reduction = 1.0 - kept.noiseAfter / kept.noiseBefore;
  CHECK(reduction > 0.05);
  // Asking for more than it gains leaves the chain as it is.
  EqualizeSettings demanding;
  demanding.minimumNoiseReduction = reduction + 0.01;
  const ChainScales left = equalizeChain(chain, {true}, demanding);
  CHECK(left.kept == std::vector<bool>{false});
  CHECK(left.power == std::vector<double>{0.0});
  CHECK(left.scales[0] == std::vector<double>{1, 1});
  CHECK(left.noiseAfter == left.noiseBefore);
  CHECK(left.proposed[0][0] == Approx(std::sqrt(2.0)));
}

namespace {

// Weights whose output channels spread over two decades, as BN folding leaves them; deterministic.
std::vector<double> spreadWeights(std::size_t count, std::size_t perChannel, double phase) {
  std::vector<double> weights(count);
  for (std::size_t e = 0; e < count; ++e) {
    const double magnitude = std::pow(10.0, std::sin(phase + static_cast<double>(e / perChannel)));
    weights[e] = magnitude * std::cos(phase * 3.0 + 1.3 * static_cast<double>(e));
  }
  return weights;
}

// The sweep as the definition states it: each step reads both layers' ranges from the full weights as rescaled so
// far and rescales them.
std::vector<std::vector<double>> referenceSweep(const std::vector<ChainLayer>& chain, std::size_t sweeps) {
  std::vector<std::vector<double>> work, scales;
  for (const ChainLayer& layer : chain) work.push_back(layer.weights);
  for (std::size_t k = 0; k + 1 < chain.size(); ++k)
    scales.emplace_back(static_cast<std::size_t>(*outputChannelCount(chain[k].layout, chain[k].dims)), 1.0);
  for (std::size_t sweep = 0; sweep < sweeps; ++sweep)
    for (std::size_t k = 0; k + 1 < chain.size(); ++k) {
      const auto r1 = outputChannelRanges(chain[k].layout, work[k], chain[k].dims);
      const auto r2 = inputChannelRanges(chain[k + 1].layout, work[k + 1], chain[k + 1].dims);
      std::vector<double> s(r1.size(), 1.0), inverse(r1.size(), 1.0);
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (r1[i] > 0.0 && r2[i] > 0.0) s[i] = std::sqrt(r1[i] / r2[i]);
        inverse[i] = 1.0 / s[i];
        scales[k][i] *= s[i];
      }
      scaleOutputChannels(chain[k].layout, work[k], chain[k].dims, inverse);
      scaleInputChannels(chain[k + 1].layout, work[k + 1], chain[k + 1].dims, s);
    }
  return scales;
}

// Two noise models of one chain give the same per-layer noise and channel ranges, to the last bit.
void checkSameFigures(const ChainNoise& first, const ChainNoise& second, std::size_t layers,
                      const std::vector<std::vector<double>>& scales) {
  CHECK(first.perLayer(scales) == second.perLayer(scales));
  for (std::size_t k = 0; k < layers; ++k) {
    INFO("layer " << k);
    CHECK(first.outputRanges(k, scales) == second.outputRanges(k, scales));
    CHECK(first.inputRanges(k, scales) == second.inputRanges(k, scales));
  }
}

// The chain with each layer's weights read through a reader, as the rule reads them; `reads` (when given) counts
// the reads, from any thread.
std::vector<ChainLayer> readThrough(const std::vector<ChainLayer>& held, std::atomic<std::size_t>* reads = nullptr) {
  std::vector<ChainLayer> read;
  for (const ChainLayer& layer : held) {
    ChainLayer viaReader = layer;
    viaReader.weights.clear();
    viaReader.read = [&layer, reads](std::int64_t first, std::int64_t count, double* out) {
      if (reads) ++*reads;
      std::copy_n(layer.weights.begin() + first, count, out);
    };
    read.push_back(std::move(viaReader));
  }
  return read;
}

}  // namespace

TEST_CASE("equalize math: the sweep on channel-pair maxima gives the scales of rescaling the full weights",
          "[equalize][kernels]") {
  // Dense 3x3 -> depthwise 3x3 -> grouped 1x1 (2 groups) -> dense 2x2: every layer of the middle is rescaled on
  // both sides, the ends on one.
  const std::vector<ChainLayer> convs{conv(spreadWeights(6 * 3 * 9, 27, 0.1), {6, 3, 3, 3}),
                                      conv(spreadWeights(6 * 9, 9, 0.7), {6, 1, 3, 3}, 6),
                                      conv(spreadWeights(4 * 3, 3, 1.9), {4, 3, 1, 1}, 2),
                                      conv(spreadWeights(5 * 4 * 4, 16, 2.3), {5, 4, 2, 2})};
  // Gemm (B [N, K]) -> MatMul [K, N] -> Gemm (B [K, N]).
  ChainLayer gemmRows{{WeightKind::Gemm, 1, true}, spreadWeights(5 * 4, 4, 0.4), {5, 4}};
  ChainLayer matmul{{WeightKind::MatMul, 1, false}, spreadWeights(5 * 3, 3, 1.1), {5, 3}};
  ChainLayer gemmColumns{{WeightKind::Gemm, 1, false}, spreadWeights(3 * 2, 2, 2.9), {3, 2}};
  const std::vector<ChainLayer> dense{gemmRows, matmul, gemmColumns};
  // 1x1 -> dense 3x3 -> 1x1, a bottleneck: the middle layer's pairs come row by row (LayerPairs::grid).
  const std::vector<ChainLayer> bottleneck{conv(spreadWeights(7 * 5, 5, 0.6), {7, 5, 1, 1}),
                                           conv(spreadWeights(6 * 7 * 9, 63, 1.7), {6, 7, 3, 3}),
                                           conv(spreadWeights(4 * 6, 6, 2.6), {4, 6, 1, 1})};
  for (const auto* chain : {&convs, &dense, &bottleneck}) {
    EqualizeSettings plain;
    plain.keepOnlyImproving = false;
    plain.tolerance = 0.0;
    plain.maxSweeps = 7;
    const ChainScales result = equalizeChain(*chain, std::vector<bool>(chain->size() - 1, true), plain);
    CHECK(result.sweeps == 7);
    // Equal to the last bit: the maxima are rescaled in the order the weights would be.
    CHECK(result.scales == referenceSweep(*chain, 7));
  }
}

TEST_CASE("equalize math: a chain's noise model gives chainInt8Noise's figures, asked again or not",
          "[equalize][kernels]") {
  const std::vector<ChainLayer> chain{conv(spreadWeights(6 * 3, 3, 0.2), {6, 3, 1, 1}),
                                      conv(spreadWeights(6 * 9, 9, 0.8), {6, 1, 3, 3}, 6),
                                      conv(spreadWeights(4 * 6, 6, 1.5), {4, 6, 1, 1})};
  const ChainNoise noise(chain, NoiseMeasure::Exact);
  EqualizeSettings exact;
  exact.noise = NoiseMeasure::Exact;
  const ChainScales chosen = equalizeChain(noise, {true, true});
  CHECK(chosen.scales == equalizeChain(chain, {true, true}, exact).scales);
  for (const auto& scales : {chosen.scales, chosen.proposed}) {
    const std::vector<double> expected = chainInt8Noise(chain, scales);
    CHECK(noise.perLayer(scales) == expected);
    CHECK(noise.perLayer(scales) == expected);
    CHECK(noise.layer(1, scales) == expected[1]);
  }
  CHECK_THROWS_AS(noise.perLayer({}), std::invalid_argument);
  CHECK_THROWS_AS(ChainNoise({conv({1, 2}, {2, 1, 1, 1}), conv({1, 2, 3}, {1, 3, 1, 1})}), std::invalid_argument);
}

TEST_CASE("equalize math: the noise estimate against hand-computed values", "[equalize][kernels]") {
  // L0 [2, 1] rows 2 and 0.001, L1 reads both with weight 1: signal 4 + 1e-6, gains 1, L1's input powers 4, 1e-6.
  const std::vector<ChainLayer> chain{conv({2, 0.001}, {2, 1, 1, 1}), conv({1, 1}, {1, 2, 1, 1})};
  const double signal = 4.0 + 1e-6;
  // As given: L0's half step is 2 / 254; 0.001 lies below it and rounds to zero, costing its square; 2 costs the
  // uniform error halfStep^2 / 3. L1's half step 1 / 254; both weights cost the uniform error.
  const double firstHalf = 2.0 / 254.0, secondHalf = 1.0 / 254.0;
  const std::vector<double> given = estimatedChainInt8Noise(chain, {{1, 1}});
  REQUIRE(given.size() == 2);
  CHECK(given[0] == Approx((firstHalf * firstHalf / 3.0 + 1e-6) / signal).epsilon(1e-12));
  CHECK(given[1] == Approx((4.0 + 1e-6) * secondHalf * secondHalf / 3.0 / signal).epsilon(1e-12));
  // Scales (1, 0.001): L0's second row becomes 1, above its half step: the uniform error, carried back to the
  // given coordinates (divided by the factor 1000 squared). L1's second input weight becomes 0.001, below its half
  // step: it rounds to zero and costs all of its signal (weight 1 squared times power 1e-6).
  const std::vector<double> scaled = estimatedChainInt8Noise(chain, {{1, 0.001}});
  CHECK(scaled[0] == Approx((firstHalf * firstHalf / 3.0 * (1.0 + 1e-6)) / signal).epsilon(1e-12));
  CHECK(scaled[1] == Approx((4.0 * secondHalf * secondHalf / 3.0 + 1e-6) / signal).epsilon(1e-12));
  // A model built once gives the same figures, and chooses scales as equalizeChain does.
  const ChainNoise noise(chain);
  CHECK(noise.perLayer({{1, 0.001}}) == scaled);
  CHECK(equalizeChain(noise, {true}).scales == equalizeChain(chain, {true}).scales);
}

TEST_CASE("equalize math: the noise estimate ranks candidate scales as the exact noise does",
          "[equalize][kernels]") {
  // Conv -> depthwise 3x3 -> Conv with rows spread over two decades: the per-link powers {0, 1/2, 1} of the
  // sweep's scales, every combination.
  const std::vector<ChainLayer> chain{conv(spreadWeights(8 * 4, 4, 0.3), {8, 4, 1, 1}),
                                      conv(spreadWeights(8 * 9, 9, 1.1), {8, 1, 3, 3}, 8),
                                      conv(spreadWeights(5 * 8, 8, 2.2), {5, 8, 1, 1})};
  EqualizeSettings plain;
  plain.keepOnlyImproving = false;
  const ChainScales swept = equalizeChain(chain, {true, true}, plain);
  std::vector<std::pair<double, double>> noises;  // (exact, estimated) per candidate, the chain's sum
  for (double p0 : {0.0, 0.5, 1.0})
    for (double p1 : {0.0, 0.5, 1.0}) {
      std::vector<std::vector<double>> scales = swept.scales;
      for (double& s : scales[0]) s = std::pow(s, p0);
      for (double& s : scales[1]) s = std::pow(s, p1);
      double exact = 0.0, estimated = 0.0;
      for (double n : chainInt8Noise(chain, scales)) exact += n;
      for (double n : estimatedChainInt8Noise(chain, scales)) estimated += n;
      INFO("powers " << p0 << ", " << p1);
      CHECK(estimated == Approx(exact).epsilon(0.5));
      noises.emplace_back(exact, estimated);
    }
  // Every pair of candidates whose exact noises differ by more than the estimate's error is ordered alike.
  std::size_t compared = 0;
  for (std::size_t a = 0; a < noises.size(); ++a)
    for (std::size_t b = 0; b < noises.size(); ++b) {
      if (noises[a].first >= noises[b].first * 0.5) continue;
      INFO("candidates " << a << ", " << b);
      CHECK(noises[a].second < noises[b].second);
      ++compared;
    }
  CHECK(compared >= 5);
}

TEST_CASE("equalize math: a chain's rescaled channel ranges equal those of the rescaled weights",
          "[equalize][kernels]") {
  const std::vector<ChainLayer> depthwise{conv(spreadWeights(6 * 3 * 4, 12, 0.2), {6, 3, 2, 2}),
                                          conv(spreadWeights(6 * 9, 9, 0.8), {6, 1, 3, 3}, 6),
                                          conv(spreadWeights(4 * 6 * 4, 24, 1.5), {4, 6, 2, 2})};
  // A dense middle layer, whose pairs come row by row (LayerPairs::grid).
  const std::vector<ChainLayer> dense{conv(spreadWeights(6 * 3 * 4, 12, 0.3), {6, 3, 2, 2}),
                                      conv(spreadWeights(5 * 6 * 9, 54, 0.9), {5, 6, 3, 3}),
                                      conv(spreadWeights(4 * 5 * 4, 20, 1.6), {4, 5, 2, 2})};
  for (const auto* chain : {&depthwise, &dense}) {
    const ChainNoise noise(*chain);
    const ChainScales chosen = equalizeChain(noise, {true, true});
    CHECK(chosen.kept == std::vector<bool>{true, true});
    for (const auto& scales : {chosen.scales, chosen.proposed})
      for (std::size_t k = 0; k < chain->size(); ++k) {
        INFO((chain == &dense ? "dense" : "depthwise") << " middle, layer " << k);
        const ChainLayer& layer = (*chain)[k];
        const std::vector<double> weights = equalizedWeights(*chain, scales, k);
        // To the last bit: the pairs' maxima are multiplied in the order the weights are.
        CHECK(noise.outputRanges(k, scales) == outputChannelRanges(layer.layout, weights, layer.dims));
        CHECK(noise.inputRanges(k, scales) == inputChannelRanges(layer.layout, weights, layer.dims));
      }
  }
  const ChainNoise noise(depthwise);
  CHECK_THROWS_AS(noise.outputRanges(0, {}), std::invalid_argument);
}

TEST_CASE("equalize math: a chain read through weight readers gives the figures of its weights held as doubles",
          "[equalize][kernels]") {
  // More weights per layer than the reader is asked for at once, so channel pairs straddle its pieces; a dense
  // first layer, a 3x3 middle one and a Gemm-like 1x1 last one.
  const std::vector<ChainLayer> held{conv(spreadWeights(96 * 100, 100, 0.4), {96, 25, 2, 2}),
                                     conv(spreadWeights(40 * 96 * 9, 9, 1.2), {40, 96, 3, 3}),
                                     conv(spreadWeights(300 * 40, 40, 2.1), {300, 40, 1, 1})};
  std::atomic<std::size_t> reads{0};
  const std::vector<ChainLayer> read = readThrough(held, &reads);
  const ChainNoise fromHeld(held);
  const ChainNoise fromReader(read);
  CHECK(reads > held.size());  // read a piece at a time
  const ChainScales chosen = equalizeChain(fromReader, {true, true});
  CHECK(chosen.scales == equalizeChain(fromHeld, {true, true}).scales);
  CHECK(chosen.kept == std::vector<bool>{true, true});
  for (const auto& scales : {chosen.scales, chosen.proposed}) {
    // The sides no link scales too (the first layer's inputs, the last one's outputs), read again when asked.
    checkSameFigures(fromReader, fromHeld, held.size(), scales);
    for (std::size_t k = 0; k < held.size(); ++k)
      CHECK(equalizedWeights(read, scales, k) == equalizedWeights(held, scales, k));
  }
  EqualizeSettings exact;
  exact.noise = NoiseMeasure::Exact;
  CHECK_THROWS_AS(equalizeChain(read, {true, true}, exact), std::invalid_argument);
}

namespace {

// A chain large enough for every second-thread path: its 3x3 middle layer is read in two halves of its output
// runs, and the sweep runs beside AIMET's pass.
std::vector<ChainLayer> largeChain() {
  return {conv(spreadWeights(256 * 128, 128, 0.5), {256, 128, 1, 1}),
          conv(spreadWeights(256 * 256 * 9, 256 * 9, 1.4), {256, 256, 3, 3}),
          conv(spreadWeights(512 * 256, 256, 2.4), {512, 256, 1, 1})};
}

// The chain read through readers as the rule reads weights, on two threads and on one: every figure the same.
// Returns the one-thread scales.
ChainScales checkSameOnTwoThreads(const std::vector<ChainLayer>& held) {
  const std::vector<ChainLayer> read = readThrough(held);
  EqualizeSettings oneThread;
  oneThread.concurrent = false;
  const ChainNoise alone(read, NoiseMeasure::Estimated, false);
  const ChainNoise together(read, NoiseMeasure::Estimated, true);
  const std::vector<bool> links(held.size() - 1, true);
  const ChainScales one = equalizeChain(alone, links, oneThread);
  const ChainScales two = equalizeChain(together, links);
  CHECK(two.scales == one.scales);
  CHECK(two.proposed == one.proposed);
  CHECK(two.power == one.power);
  CHECK(two.kept == one.kept);
  CHECK(two.method == one.method);
  CHECK(two.sweeps == one.sweeps);
  CHECK(two.noiseBefore == one.noiseBefore);
  CHECK(two.noiseAfter == one.noiseAfter);
  for (const auto& scales : {one.scales, one.proposed}) checkSameFigures(together, alone, held.size(), scales);
  return one;
}

}  // namespace

TEST_CASE("equalize math: a large chain gives the same figures on two threads as on one", "[equalize][kernels]") {
  const std::vector<ChainLayer> held = largeChain();
  const ChainScales one = checkSameOnTwoThreads(held);
  // And the figures of the weights held as doubles (no reader).
  CHECK(equalizeChain(held, {true, true}).scales == one.scales);
}

TEST_CASE("equalize math: a reader's error reaches the caller from either thread", "[equalize][kernels]") {
  // The middle layer is read in two halves; the reader fails in the second (a truncated file, say), whichever
  // thread reads it, and the other pieces stop.
  const std::vector<ChainLayer> held = largeChain();
  std::vector<ChainLayer> read = readThrough(held);
  constexpr std::int64_t kFailFrom = 256 * 256 * 9 * 3 / 4;
  read[1].read = [&middle = held[1]](std::int64_t first, std::int64_t count, double* out) {
    if (first + count > kFailFrom) throw std::runtime_error("cannot read tensor data: the file is shorter than it was");
    std::copy_n(middle.weights.begin() + first, count, out);
  };
  for (const bool concurrent : {false, true}) {
    INFO("concurrent " << concurrent);
    CHECK_THROWS_WITH(ChainNoise(read, NoiseMeasure::Estimated, concurrent),
                      "cannot read tensor data: the file is shorter than it was");
  }
}

TEST_CASE("equalize math: large middle layers of every layout read in halves give the one-thread figures",
          "[equalize][kernels]") {
  // Each middle layer has 2^18 elements or more, so it is read in two halves of its output runs: ConvTranspose
  // (output channels the second axis), a grouped Conv, and a Gemm whose output channels are columns (transB 0,
  // one element per output run).
  ChainLayer transposed{{WeightKind::ConvTranspose, 1, false}, spreadWeights(256 * 256 * 4, 4, 0.9), {256, 256, 2, 2}};
  ChainLayer columns{{WeightKind::Gemm, 1, false}, spreadWeights(512 * 640, 640, 1.7), {512, 640}};
  const std::vector<ChainLayer> held{conv(spreadWeights(256 * 64, 64, 0.5), {256, 64, 1, 1}), transposed,
                                     conv(spreadWeights(512 * 128 * 9, 128 * 9, 1.2), {512, 128, 3, 3}, 2), columns,
                                     conv(spreadWeights(8 * 640, 640, 2.2), {8, 640, 1, 1})};
  const ChainScales one = checkSameOnTwoThreads(held);
  // And against the weights held as doubles, whose pairs are filled in one piece.
  CHECK(ChainNoise(held, NoiseMeasure::Estimated, true).perLayer(one.scales) ==
        ChainNoise(readThrough(held), NoiseMeasure::Estimated, false).perLayer(one.scales));
}
