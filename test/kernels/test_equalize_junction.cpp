// Junction equalization against hand-computed values: producers covering the channels in segments (a Concat),
// the largest range over several readers (a fan-out), a reader taking a block of features per channel (Flatten).

#include <catch2/catch.hpp>
#include <cmath>

#include "kernels/equalize_junction.h"

using namespace bnfold::kernels;

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
