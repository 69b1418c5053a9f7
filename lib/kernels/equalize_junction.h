// Cross-layer equalization where a link is not one layer to one layer: a junction of channels written by one or
// more producer layers (the segments of a channel-axis Concat, one layer, or layers whose outputs are summed, each
// writing every channel: a residual stream) and read by one or more reader layers
// (a fan-out), each reader reading junction channel i as one input channel or as a block of consecutive input
// features (a Flatten between a Conv and a Gemm: channel c is features [c*block, (c+1)*block)).
//
// One scale per junction channel: producer output channel i is divided by s_i and every reader's input channel
// (block) i multiplied by s_i, which leaves the function unchanged for a positively homogeneous activation. With
// r1_i = the producer's range of channel i and r2_i = the largest range of channel i over the readers,
// s_i = sqrt(r1_i / r2_i) (1 when either is 0; r1_i the largest over the producers that write channel i): the
// producers' largest range and the largest reader range become
// sqrt(r1_i * r2_i); no reader's range of channel i exceeds it. For one producer and one reader this is the pair
// formula of equalize_math.h. No IR types here (STYLE.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/equalize_math.h"

namespace bnfold::kernels {

/// A producer: its output channels are junction channels [first, first + its output channel count).
struct JunctionProducer {
  ChainLayer layer;
  std::size_t first = 0;
};

/// A reader: its input channels (Conv: C, Gemm/MatMul: K) are the junction's channels, `block` consecutive ones
/// per junction channel.
struct JunctionReader {
  ChainLayer layer;
  std::int64_t block = 1;
};

struct JunctionScales {
  std::vector<double> scales;         ///< per junction channel
  std::vector<double> producerRanges; ///< r1 per junction channel, before
  std::vector<double> readerRanges;   ///< r2 (the largest over the readers) per junction channel, before
  std::vector<double> producerRangesAfter, readerRangesAfter;  ///< the same with the scales applied
  /// The power of sqrt(r1 / r2) the scales are: 1, or 1/2 where a residual stream's full step costs more
  /// (equalizeSummedJunction); equalizeJunction always takes 1.
  double power = 1.0;
  double producerErrorBefore = 0.0, readerErrorBefore = 0.0;
  double producerErrorAfter = 0.0, readerErrorAfter = 0.0;
  /// The scales lower the summed int8 error of every weight they touch (channelRelativeInt8Error: the producers
  /// by output channel, the readers by input channel).
  bool improves = false;
};

/// The junction's scales and what they do to the touched weights' int8 error. Throws std::invalid_argument when
/// the producers do not cover [0, channels) exactly or a reader does not read channels * block inputs.
JunctionScales equalizeJunction(const std::vector<JunctionProducer>& producers,
                                const std::vector<JunctionReader>& readers, std::size_t channels);

/// The scales of a residual stream: producers whose outputs are summed (each writes every channel, read through
/// their readers), readers as for equalizeJunction. The scales are equalizeJunction's, or their square roots (a
/// half step) where that leaves the touched weights less int8 error; the errors are estimated from per-channel
/// summaries (estimatedChannelRelativeInt8Error), so no weight is held whole. Throws
/// std::invalid_argument as equalizeJunction does. `concurrent`: large producers are read on a second thread while
/// this one reads the readers (their readers must allow that); the result is the same either way.
JunctionScales equalizeSummedJunction(const std::vector<ChainLayer>& producers,
                                      const std::vector<JunctionReader>& readers, std::size_t channels,
                                      bool concurrent = true);

/// Each junction channel's value repeated `block` times: a reader's per-input-channel factors.
std::vector<double> blockExpanded(const std::vector<double>& perChannel, std::int64_t block);

/// The producer's weights with its output channel j divided by scales[first + j].
std::vector<double> scaledProducerWeights(const JunctionProducer& producer, const std::vector<double>& scales);
/// The reader's weights with its input channels of junction channel i multiplied by scales[i].
std::vector<double> scaledReaderWeights(const JunctionReader& reader, const std::vector<double>& scales);

/// The range per junction channel of the producers' outputs and, over the readers, the largest one.
std::vector<double> junctionProducerRanges(const std::vector<JunctionProducer>& producers,
                                           const std::vector<std::vector<double>>& weights, std::size_t channels);
std::vector<double> junctionReaderRanges(const std::vector<JunctionReader>& readers,
                                         const std::vector<std::vector<double>>& weights, std::size_t channels);

}  // namespace bnfold::kernels
