// Chain layers for the equalization kernel tests.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/equalize_math.h"

namespace bnfold::kernels::test {

/// A Conv layer holding its weights as doubles.
inline ChainLayer conv(std::vector<double> weights, Dims dims, std::int64_t group = 1) {
  ChainLayer layer;
  layer.layout.kind = WeightKind::Conv;
  layer.layout.group = group;
  layer.weights = std::move(weights);
  layer.dims = std::move(dims);
  return layer;
}

}  // namespace bnfold::kernels::test
