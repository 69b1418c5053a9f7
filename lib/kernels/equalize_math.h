// Cross-layer equalization (Nagel et al. 2019) on double vectors: per-channel weight ranges, the per-tensor
// symmetric int8 quantization error of a weight, and the scales that equalize a chain of layers.
//
// A chain is layers L0 .. Ln where L(k+1) reads L(k)'s output through a positively homogeneous activation
// (Relu, LeakyRelu, PRelu, none). Link k scales L(k)'s output channel i by 1/s[k][i] and L(k+1)'s input
// channel i by s[k][i], which leaves the chain's function unchanged. No IR types here (STYLE.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/fold_math.h"

namespace bnfold::kernels {

/// max |w| over the weights feeding each output channel (see scaleOutputChannels for the layouts).
/// Throws std::invalid_argument when dims do not fit the layout or the data.
std::vector<double> outputChannelRanges(const WeightLayout& layout, const std::vector<double>& weights,
                                        const Dims& dims);
/// max |w| over the weights reading each input channel (see scaleInputChannels).
std::vector<double> inputChannelRanges(const WeightLayout& layout, const std::vector<double>& weights,
                                       const Dims& dims);

/// ||W - Q(W)||^2 / ||W||^2 where Q quantizes per tensor to symmetric int8 (step max|W| / 127, values rounded
/// to the nearest step, ties away from zero). 0 for an all-zero weight.
double relativeInt8Error(const std::vector<double>& weights);

/// The per-tensor int8 error as each channel sees it: the mean over the output channels (byOutput) or input
/// channels of ||W_c - Q(W_c)||^2 / ||W_c||^2, with Q quantizing the whole tensor (one step, max|W| / 127); channels
/// of all zeros are not counted. Unlike relativeInt8Error, which the largest channels dominate, this counts the small
/// channels a shared step leaves with few levels, which is what equalization repairs.
double channelRelativeInt8Error(const WeightLayout& layout, const std::vector<double>& weights, const Dims& dims,
                                bool byOutput);

/// One layer of a chain: its weight (flat, row-major) with its layout and dims.
struct ChainLayer {
  WeightLayout layout;
  std::vector<double> weights;
  Dims dims;
};

struct EqualizeSettings {
  /// Sweeps stop once no scale of a sweep moves by more than this in |log s|.
  double tolerance = 1e-7;
  std::size_t maxSweeps = 200;
  /// Leave a link alone when its scales do not lower its two layers' int8 error (false: plain sweeping, as a
  /// reference to compare with).
  bool keepOnlyImproving = true;
};

/// What equalizeChain found.
struct ChainScales {
  /// scales[k][i]: link k's scale of channel i (1 for a link left alone).
  std::vector<std::vector<double>> scales;
  /// Per link: false when its scales would not lower the summed relative int8 error of the two layers it joins.
  std::vector<bool> kept;
  /// Per link: the scales it was given by the last sweep it took part in (for a link left alone, what it was
  /// refused; all 1 when it was not a candidate).
  std::vector<std::vector<double>> proposed;
  std::size_t sweeps = 0;
  bool converged = false;
};

/// Equalizes the chain by pairwise sweeps (link 0, 1, ... n-1, repeated) to convergence, s = sqrt(r1 / r2) per
/// channel (1 when either range is 0); a depthwise triple needs no special case, the sweep converges to the
/// equal ranges AIMET's closed form gives. Then a link whose scales do not lower relativeInt8Error of its two
/// layers (summed, with every other kept link applied) is left alone, and the remaining links are swept again,
/// until no further link is dropped. `candidate[k]` false: link k is left alone from the start.
/// Throws std::invalid_argument when the layers' channel counts do not fit together.
ChainScales equalizeChain(const std::vector<ChainLayer>& layers, const std::vector<bool>& candidate,
                          const EqualizeSettings& settings = {});

/// The weights of layer k of the chain with the scales applied: output channels divided by scales[k] (when k is
/// not the last layer), input channels multiplied by scales[k-1] (when k is not the first).
std::vector<double> equalizedWeights(const std::vector<ChainLayer>& layers,
                                     const std::vector<std::vector<double>>& scales, std::size_t k);

}  // namespace bnfold::kernels
