#pragma once
// A layer weight multiplied per channel, computed when its bytes are read. Folding a BN into a 100 MB weight
// thus never holds the weight twice: the writer streams the scaled bytes from the original's (which may still
// lie in the model file) chunk by chunk.

#include <memory>
#include <vector>

#include "bnfold/ir/tensor.h"
#include "kernels/equalize_math.h"
#include "kernels/fold_math.h"

namespace bnfold::rules {

/// Bytes of `source` (packed elements of floating `type`) with every element multiplied by the scale of its
/// channel under `indexing`, each computed in double and rounded once to `type`.
std::shared_ptr<const DeferredBytes> scaledChannelBytes(std::shared_ptr<const DeferredBytes> source, DataType type,
                                                        kernels::ChannelIndexing indexing,
                                                        std::vector<double> scale);

/// Bytes of `source` with every element multiplied by the factor of its output channel and then by that of its
/// input channel, in double, rounded once to `type` (kernels::scaleOutputChannels, then scaleInputChannels).
std::shared_ptr<const DeferredBytes> scaledBothSidesBytes(std::shared_ptr<const DeferredBytes> source, DataType type,
                                                          kernels::ChannelIndexing outputIndexing,
                                                          std::vector<double> outputFactors,
                                                          kernels::ChannelIndexing inputIndexing,
                                                          std::vector<double> inputFactors);

/// Reads a floating weight's elements as doubles a piece at a time, straight from its stored bytes (which may
/// still lie in the model file), so equalization never holds a large weight as doubles. The reader keeps the bytes'
/// source alive. Throws std::invalid_argument for a weight that is not float, double, float16 or bfloat16.
kernels::WeightReader weightReader(const Tensor& weight);

}  // namespace bnfold::rules
