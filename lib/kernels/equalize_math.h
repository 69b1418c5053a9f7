// Cross-layer equalization (Nagel et al. 2019) on double vectors: per-channel weight ranges, the per-tensor
// symmetric int8 quantization error of a weight, and the scales that equalize a chain of layers.
//
// A chain is layers L0 .. Ln where L(k+1) reads L(k)'s output through a positively homogeneous activation
// (Relu, LeakyRelu, PRelu, none). Link k scales L(k)'s output channel i by 1/s[k][i] and L(k+1)'s input
// channel i by s[k][i], which leaves the chain's function unchanged. No IR types here (STYLE.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
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

/// Copies elements [first, first + count) of a weight (flat, row-major), as doubles, into `out`. May be called from
/// two threads at once (the noise model reads a large layer in two pieces).
using WeightReader = std::function<void(std::int64_t first, std::int64_t count, double* out)>;

/// One layer of a chain: its weight (flat, row-major) with its layout and dims. The weight is `weights`, or, when
/// `read` is set, read through it a piece at a time (a large weight is then never held as doubles: the noise
/// estimate keeps per-channel summaries, and channel-pair summaries only for layers scaled on both sides).
struct ChainLayer {
  WeightLayout layout;
  std::vector<double> weights;
  Dims dims;
  WeightReader read = nullptr;
};

/// Per channel of a layer on one side (its output channels, or its input channels): the largest |w|, the number of
/// weights and their sum of squares. Read through the layer's reader a piece at a time when it has one.
struct ChannelSummary {
  std::vector<double> largest, count, squares;
};
ChannelSummary channelSummary(const ChainLayer& layer, bool byOutput);

/// channelRelativeInt8Error estimated from a summary, with channel c multiplied by factor[c] (empty: 1): per channel,
/// its rounding noise as estimatedChainInt8Noise estimates a group's, over its sum of squares; the mean over the
/// channels that have weights.
double estimatedChannelRelativeInt8Error(const ChannelSummary& summary, const std::vector<double>& factor);

/// How a chain's noise is measured for choosing its scales.
enum class NoiseMeasure {
  Exact,      ///< chainInt8Noise: every weight rounded (a reference, for tests)
  Estimated,  ///< estimatedChainInt8Noise: from per-group summaries, one term per group of weights
};

struct EqualizeSettings {
  /// Sweeps stop once no scale of a sweep moves by more than this in |log s|.
  double tolerance = 1e-7;
  std::size_t maxSweeps = 200;
  /// Choose each link's scales by the chain's output-referred int8 noise (chainInt8Noise) among the candidates
  /// equalizeChain describes, leaving a link alone when that is lowest (false: plain sweeping to convergence, as a
  /// reference to compare with).
  bool keepOnlyImproving = true;
  /// A chain is rescaled only when that lowers its noise by this share or more (less is not worth rewriting a model
  /// for, and a run on its own output mostly finds less).
  double minimumNoiseReduction = 0.05;
  NoiseMeasure noise = NoiseMeasure::Estimated;
  /// A large chain may use a second thread: the sweep and AIMET's pass chosen at once (and, in equalizeChain
  /// from layers, the noise model read as ChainNoise reads it). The result is the same either way.
  bool concurrent = true;
};

/// Where a chain's scales come from (before the per-link power of ChainScales::power).
enum class ScaleMethod {
  Sweep,         ///< pairwise s = sqrt(r1 / r2) swept to convergence
  AimetOnePass,  ///< AIMET's sets (pairs, and depthwise triples in closed form), each scaled once, in order
};

/// What equalizeChain found.
struct ChainScales {
  /// scales[k][i]: link k's scale of channel i as written (proposed[k] to the power power[k]; 1 for a link left
  /// alone).
  std::vector<std::vector<double>> scales;
  /// Per link: false when it is left alone (not a candidate, or no power of its scales lowered the noise).
  std::vector<bool> kept;
  /// Per link: the full scales of the chosen method (for a link left alone, what it was refused; all 1 when it was
  /// not a candidate).
  std::vector<std::vector<double>> proposed;
  /// Per link: the power (0, 1/2 or 1) of proposed[k] written; 0 for a link left alone.
  std::vector<double> power;
  ScaleMethod method = ScaleMethod::Sweep;
  /// chainInt8Noise summed over the chain's layers: of the weights as given, and as written.
  double noiseBefore = 0.0;
  double noiseAfter = 0.0;
  /// The sweep's: how many sweeps it took, and whether it converged.
  std::size_t sweeps = 0;
  bool converged = false;
};

/// The int8 weight noise of each layer of the chain with `scales` applied (one vector per link), referred to the
/// chain's output and relative to its signal there. Each weight is quantized per tensor to symmetric int8 (step
/// max|W| / 127); the squared error of each element is weighted by the power of the input channel it reads and
/// by the gain from the output channel it feeds to the chain's output. Powers and gains are data-free: a white
/// input of unit power per channel, propagated through the squared original weights (a scale moves power
/// between a layer and the next, so the signal is the same for every choice of scales). Unlike a per-channel
/// relative error, this counts a channel by what it carries to the output: a small channel's damage matters as
/// much as its signal, and a larger step on the next layer costs noise on every channel it reads.
std::vector<double> chainInt8Noise(const std::vector<ChainLayer>& layers,
                                   const std::vector<std::vector<double>>& scales);

/// chainInt8Noise estimated without rounding each weight (docs/quantization.md, "The noise estimate"): a weight
/// below half a step rounds to zero and costs its square, a larger one step^2 / 12 (a uniform rounding error).
/// Which weights lie below is read from a summary built once per layer: per group of weights every candidate scales
/// by one factor (a channel pair; an output channel of the chain's first layer, an input channel of its last), the
/// largest |w| and the count and sum of squares per octave of |w| below it. A candidate costs one term per group.
std::vector<double> estimatedChainInt8Noise(const std::vector<ChainLayer>& layers,
                                            const std::vector<std::vector<double>>& scales);

/// A chain's noise model (chainInt8Noise or its estimate), built once from its weights: each layer's noise under
/// given scales is computed once per distinct (layer, scales) and remembered, since choosing the scales and
/// reporting them ask for the same ones again. Keeps a reference to `layers`, which must outlive it. Throws
/// std::invalid_argument as chainInt8Noise does. `concurrent`: a large chain's first and last layers are read on a
/// second thread while this one reads the others, so the readers of different layers must allow that. Asking for
/// noises from two threads at once is safe.
class ChainNoise {
 public:
  explicit ChainNoise(const std::vector<ChainLayer>& layers, NoiseMeasure measure = NoiseMeasure::Estimated,
                      bool concurrent = true);
  ~ChainNoise();
  ChainNoise(const ChainNoise&) = delete;
  ChainNoise& operator=(const ChainNoise&) = delete;

  /// Layer k's noise with `scales` (one vector per link) applied: chainInt8Noise(layers, scales)[k] or its estimate.
  double layer(std::size_t k, const std::vector<std::vector<double>>& scales) const;
  /// Every layer's.
  std::vector<double> perLayer(const std::vector<std::vector<double>>& scales) const;

  /// Layer k's largest |w| per output (input) channel with `scales` applied, from its channel pairs' maxima: equal
  /// to outputChannelRanges (inputChannelRanges) of equalizedWeights(layers, scales, k), without the weights.
  std::vector<double> outputRanges(std::size_t k, const std::vector<std::vector<double>>& scales) const;
  std::vector<double> inputRanges(std::size_t k, const std::vector<std::vector<double>>& scales) const;

  /// The per-layer data behind it (equalize_math.cpp), which equalizeChain sweeps on too.
  struct Model;
  const Model& model() const { return *model_; }

 private:
  std::unique_ptr<Model> model_;
};

/// Chooses the scales of a chain. Candidates: the pairwise sweep to convergence (s = sqrt(r1 / r2) per channel, 1
/// when either range is 0), and AIMET's one pass (a dense layer, a depthwise Conv and a dense layer as a triple
/// in closed form, S12 = r1 / cbrt(r1 r2 r3), S23 = cbrt(r1 r2 r3) / r3; other links as pairs; each set once,
/// in order). For each, every link's power p in {0, 1/2, 1} (s^p: a half step where the full one
/// costs more noise on the next layer than it saves) is chosen by coordinate descent on chainInt8Noise; the
/// method with the lower noise wins, and the chain is left as it is when neither lowers the noise.
/// `candidate[k]` false: link k is left alone. Throws std::invalid_argument when the layers' channel counts do
/// not fit together.
ChainScales equalizeChain(const std::vector<ChainLayer>& layers, const std::vector<bool>& candidate,
                          const EqualizeSettings& settings = {});
/// The same, with the chain's noise model built already (and its remembered noises kept for the caller).
ChainScales equalizeChain(const ChainNoise& noise, const std::vector<bool>& candidate,
                          const EqualizeSettings& settings = {});

/// The weights of layer k of the chain with the scales applied (read whole when the layer has a reader): output channels divided by scales[k] (when k is
/// not the last layer), input channels multiplied by scales[k-1] (when k is not the first).
std::vector<double> equalizedWeights(const std::vector<ChainLayer>& layers,
                                     const std::vector<std::vector<double>>& scales, std::size_t k);

}  // namespace bnfold::kernels
