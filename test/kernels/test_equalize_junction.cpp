// Junction equalization against hand-computed values: producers covering the channels in segments (a Concat),
// the largest range over several readers (a fan-out), a reader taking a block of features per channel (Flatten).

#include <catch2/catch.hpp>
#include <cmath>
#include <memory>

#include "chain_layers.h"
#include "kernels/equalize_junction.h"

using namespace bnfold::kernels;
using bnfold::kernels::test::conv;

namespace {

ChainLayer matMul(std::vector<double> weights, Dims dims) {
  ChainLayer layer;
  layer.layout.kind = WeightKind::MatMul;
  layer.weights = std::move(weights);
  layer.dims = std::move(dims);
  return layer;
}

}  // namespace

TEST_CASE("equalize junction: segments, the largest reader range, and blocks", "[equalize][kernels]") {
  // Producers (MatMul [K, N]: columns are outputs): channels 0-1 with ranges 4 and 1, channel 2 with range 9.
  const std::vector<JunctionProducer> producers{{matMul({4, -1}, {1, 2}), 0}, {matMul({-9}, {1, 1}), 2}};
  // Readers (rows are inputs): ranges {1, 4, 1} and {2, 1, 1}: the larger is {2, 4, 1}.
  const std::vector<JunctionReader> readers{{matMul({1, 4, -1}, {3, 1}), 1}, {matMul({-2, 1, 1}, {3, 1}), 1}};
  const JunctionScales result = equalizeJunction(producers, readers, 3);
  CHECK(result.producerRanges == std::vector<double>{4, 1, 9});
  CHECK(result.readerRanges == std::vector<double>{2, 4, 1});
  REQUIRE(result.scales.size() == 3);
  CHECK(result.scales[0] == Approx(std::sqrt(2.0)));
  CHECK(result.scales[1] == Approx(0.5));
  CHECK(result.scales[2] == Approx(3.0));
  const auto first = scaledProducerWeights(producers[0], result.scales);
  CHECK(first[0] == Approx(4 / std::sqrt(2.0)));
  CHECK(first[1] == Approx(-2.0));
  CHECK(scaledProducerWeights(producers[1], result.scales)[0] == Approx(-3.0));
  const auto reader = scaledReaderWeights(readers[1], result.scales);
  CHECK(reader[0] == Approx(-2 * std::sqrt(2.0)));
  CHECK(reader[1] == Approx(0.5));
  CHECK(reader[2] == Approx(3.0));

  // A reader with two features per channel: channel i is rows 2i and 2i+1.
  const std::vector<JunctionReader> flat{{matMul({1, -8, 2, 0.5, 1, 1}, {6, 1}), 2}};
  const JunctionScales blocks = equalizeJunction(producers, flat, 3);
  CHECK(blocks.readerRanges == std::vector<double>{8, 2, 1});
  const auto flatAfter = scaledReaderWeights(flat[0], blocks.scales);
  CHECK(flatAfter[0] == Approx(1 * blocks.scales[0]));
  CHECK(flatAfter[1] == Approx(-8 * blocks.scales[0]));
  CHECK(flatAfter[3] == Approx(0.5 * blocks.scales[1]));

  CHECK_THROWS_AS(equalizeJunction(producers, readers, 4), std::invalid_argument);
  CHECK_THROWS_AS(equalizeJunction({{matMul({4, -1}, {1, 2}), 1}}, readers, 3), std::invalid_argument);
  CHECK_THROWS_AS(equalizeJunction(producers, {{matMul({1, 2}, {2, 1}), 1}}, 3), std::invalid_argument);
}

TEST_CASE("equalize junction: scales that would not lower the int8 error are said so", "[equalize][kernels]") {
  // Every weight on the int8 grid of its tensor's step: no error to lower, and the scales would move them off it.
  const std::vector<JunctionProducer> producers{{matMul({1, 1.0 / 127}, {1, 2}), 0}};
  const std::vector<JunctionReader> readers{{matMul({1, 1}, {2, 1}), 1}, {matMul({1, 1}, {2, 1}), 1}};
  const JunctionScales result = equalizeJunction(producers, readers, 2);
  CHECK(result.producerErrorBefore + result.readerErrorBefore == Approx(0.0).margin(1e-15));
  CHECK_FALSE(result.improves);
  // Spread producer channels with room to gain: it improves.
  const std::vector<JunctionProducer> spread{{matMul({1, 0.0123}, {1, 2}), 0}};
  const std::vector<JunctionReader> flat{{matMul({0.5, 1}, {2, 1}), 1}};
  CHECK(equalizeJunction(spread, flat, 2).improves);
}

namespace {

// Deterministic weights with per-row magnitudes spread over two decades.
std::vector<double> spreadWeights(std::size_t count, std::size_t rowLength, double seed) {
  std::vector<double> out(count);
  for (std::size_t i = 0; i < count; ++i)
    out[i] = std::sin(seed + 1.7 * static_cast<double>(i)) *
             std::pow(10.0, std::fmod(seed + 0.37 * static_cast<double>(i / rowLength), 2.0) - 1.0);
  return out;
}

// The same layer read through a WeightReader, a piece at a time.
ChainLayer readThrough(const ChainLayer& held) {
  ChainLayer read = held;
  auto values = std::make_shared<std::vector<double>>(held.weights);
  read.weights.clear();
  read.read = [values](std::int64_t first, std::int64_t count, double* out) {
    std::copy(values->begin() + first, values->begin() + first + count, out);
  };
  return read;
}

}  // namespace

TEST_CASE("equalize junction: channel summaries on either side, held or read", "[equalize][kernels]") {
  // A dense Conv [6, 5, 3, 3] (output runs of 45, input runs of 9), a 1x1 Conv [7, 300] (input channels change every
  // element, rows of 300 over several reader pieces), a grouped Conv (3 groups of 2 channels in, 4 out).
  const std::vector<ChainLayer> layers{conv(spreadWeights(6 * 5 * 9, 45, 0.3), {6, 5, 3, 3}),
                                       conv(spreadWeights(7 * 300, 300, 1.1), {7, 300, 1, 1}),
                                       conv(spreadWeights(12 * 2 * 4, 8, 2.9), {12, 2, 2, 2}, 3)};
  for (const ChainLayer& layer : layers)
    for (bool byOutput : {true, false}) {
      const ChannelSummary summary = channelSummary(layer, byOutput);
      const ChannelSummary read = channelSummary(readThrough(layer), byOutput);
      const auto ranges = byOutput ? outputChannelRanges(layer.layout, layer.weights, layer.dims)
                                   : inputChannelRanges(layer.layout, layer.weights, layer.dims);
      CHECK(summary.largest == ranges);
      CHECK(read.largest == summary.largest);
      CHECK(read.squares == summary.squares);
      CHECK(read.count == summary.count);
      double count = 0.0, squares = 0.0, expectedSquares = 0.0;
      for (std::size_t c = 0; c < ranges.size(); ++c) {
        count += summary.count[c];
        squares += summary.squares[c];
      }
      for (double w : layer.weights) expectedSquares += w * w;
      CHECK(count == static_cast<double>(layer.weights.size()));
      CHECK(squares == Approx(expectedSquares).epsilon(1e-12));
    }
  // Per channel: the input channel 0 of the 1x1 Conv is every 300th weight.
  const ChannelSummary inputs = channelSummary(layers[1], false);
  double channel0 = 0.0;
  for (std::size_t o = 0; o < 7; ++o) channel0 += layers[1].weights[o * 300] * layers[1].weights[o * 300];
  CHECK(inputs.squares[0] == Approx(channel0).epsilon(1e-12));
  CHECK(inputs.count[0] == 7.0);
}

TEST_CASE("equalize junction: the estimated per-channel int8 error follows the computed one", "[equalize][kernels]") {
  const ChainLayer layer = conv(spreadWeights(16 * 8 * 9, 72, 0.7), {16, 8, 3, 3});
  for (bool byOutput : {true, false}) {
    const ChannelSummary summary = channelSummary(layer, byOutput);
    const double computed = channelRelativeInt8Error(layer.layout, layer.weights, layer.dims, byOutput);
    const double estimated = estimatedChannelRelativeInt8Error(summary, {});
    CHECK(estimated == Approx(computed).epsilon(0.5));
    // A factor that evens the channels out lowers both.
    std::vector<double> factor(summary.largest.size());
    for (std::size_t c = 0; c < factor.size(); ++c) factor[c] = 1.0 / summary.largest[c];
    std::vector<double> evened = layer.weights;
    if (byOutput)
      scaleOutputChannels(layer.layout, evened, layer.dims, factor);
    else
      scaleInputChannels(layer.layout, evened, layer.dims, factor);
    const double computedEvened = channelRelativeInt8Error(layer.layout, evened, layer.dims, byOutput);
    const double estimatedEvened = estimatedChannelRelativeInt8Error(summary, factor);
    CHECK(computedEvened < computed);
    CHECK(estimatedEvened < estimated);
    CHECK(estimatedEvened == Approx(computedEvened).epsilon(0.5));
  }
}

TEST_CASE("equalize junction: a residual stream's summed producers take the largest range", "[equalize][kernels]") {
  // Two producers writing the same 3 channels (MatMul [K, N]: columns are outputs), ranges {4, 1, 2} and {1, 3, 2};
  // readers with ranges {2, 1, 8} and {1, 1, 2} (rows are inputs): the larger {2, 1, 8}.
  const std::vector<ChainLayer> producers{matMul({4, -1, 2}, {1, 3}), matMul({1, 3, -2}, {1, 3})};
  const std::vector<JunctionReader> readers{{matMul({2, 1, -8}, {3, 1}), 1}, {matMul({1, -1, 2}, {3, 1}), 1}};
  const JunctionScales result = equalizeSummedJunction(producers, readers, 3);
  CHECK(result.producerRanges == std::vector<double>{4, 3, 2});
  CHECK(result.readerRanges == std::vector<double>{2, 1, 8});
  REQUIRE(result.scales.size() == 3);
  // sqrt(r1 / r2), or its square root where that half step leaves less estimated error.
  const std::vector<double> full{std::sqrt(2.0), std::sqrt(3.0), 0.5};
  std::vector<double> half(3);
  for (std::size_t i = 0; i < 3; ++i) half[i] = std::sqrt(full[i]);
  auto estimatedError = [&](const std::vector<double>& scales) {
    std::vector<double> inverse(3);
    for (std::size_t i = 0; i < 3; ++i) inverse[i] = 1.0 / scales[i];
    double error = 0.0;
    for (const ChainLayer& producer : producers)
      error += estimatedChannelRelativeInt8Error(channelSummary(producer, true), inverse);
    for (const JunctionReader& reader : readers)
      error += estimatedChannelRelativeInt8Error(channelSummary(reader.layer, false), scales);
    return error;
  };
  CHECK(result.power == (estimatedError(half) < estimatedError(full) ? 0.5 : 1.0));
  for (std::size_t i = 0; i < 3; ++i) CHECK(result.scales[i] == Approx(std::pow(full[i], result.power)));
  CHECK(result.producerErrorAfter + result.readerErrorAfter ==
        Approx(std::min(estimatedError(half), estimatedError(full))));
  for (std::size_t i = 0; i < 3; ++i) {
    CHECK(result.producerRangesAfter[i] == Approx(result.producerRanges[i] / result.scales[i]));
    CHECK(result.readerRangesAfter[i] == Approx(result.readerRanges[i] * result.scales[i]));
  }
  // Read through readers, the same; a producer or reader of other channel counts is refused.
  const JunctionScales read = equalizeSummedJunction({readThrough(producers[0]), readThrough(producers[1])},
                                                     {{readThrough(readers[0].layer), 1}, readers[1]}, 3);
  CHECK(read.scales == result.scales);
  CHECK(read.improves == result.improves);
  // Large enough for a second thread: the same result as on one.
  const std::vector<ChainLayer> large{readThrough(conv(spreadWeights(256 * 512, 512, 0.4), {256, 512, 1, 1})),
                                      readThrough(conv(spreadWeights(256 * 512, 512, 1.4), {256, 512, 1, 1}))};
  const std::vector<JunctionReader> largeReaders{
      {readThrough(conv(spreadWeights(512 * 256, 256, 2.4), {512, 256, 1, 1})), 1}};
  const JunctionScales oneThread = equalizeSummedJunction(large, largeReaders, 256, false);
  const JunctionScales twoThreads = equalizeSummedJunction(large, largeReaders, 256, true);
  CHECK(twoThreads.scales == oneThread.scales);
  CHECK(twoThreads.producerErrorAfter == oneThread.producerErrorAfter);
  CHECK(twoThreads.readerErrorAfter == oneThread.readerErrorAfter);
  CHECK_THROWS_AS(equalizeSummedJunction({matMul({4, -1}, {1, 2})}, readers, 3), std::invalid_argument);
  CHECK_THROWS_AS(equalizeSummedJunction(producers, {{matMul({1, 2}, {2, 1}), 1}}, 3), std::invalid_argument);
}
