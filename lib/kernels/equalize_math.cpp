// Equalization runs on working copies of the chain's weights: each pairwise step rescales them, so the ranges
// the next step reads are those of the weights as they would be written.
#include "kernels/equalize_math.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace bnfold::kernels {
namespace {

std::vector<double> channelRanges(const char* function, const std::optional<ChannelIndexing>& indexing,
                                  const std::optional<std::int64_t>& channels, const std::vector<double>& weights,
                                  const Dims& dims) {
  if (!indexing || !channels) throw std::invalid_argument(std::string(function) + ": dims do not fit the layout");
  std::size_t count = 1;
  for (std::int64_t d : dims) count *= static_cast<std::size_t>(d);
  if (count != weights.size())
    throw std::invalid_argument(std::string(function) + ": dims do not match the " + std::to_string(weights.size()) +
                                " weights");
  std::vector<double> ranges(static_cast<std::size_t>(*channels), 0.0);
  forEachChannelRun(*indexing, 0, static_cast<std::int64_t>(weights.size()),
                    [&](std::int64_t offset, std::int64_t length, std::int64_t channel) {
                      double& range = ranges.at(static_cast<std::size_t>(channel));
                      for (std::int64_t i = offset; i < offset + length; ++i)
                        range = std::max(range, std::abs(weights[static_cast<std::size_t>(i)]));
                    });
  return ranges;
}

std::vector<double> inverse(const std::vector<double>& scale) {
  std::vector<double> result(scale.size());
  for (std::size_t i = 0; i < scale.size(); ++i) result[i] = 1.0 / scale[i];
  return result;
}

// s = sqrt(r1 / r2) per channel, 1 where either range is 0 (a dead channel has nothing to balance).
std::vector<double> pairScales(const std::vector<double>& r1, const std::vector<double>& r2) {
  std::vector<double> s(r1.size(), 1.0);
  for (std::size_t i = 0; i < r1.size(); ++i)
    if (r1[i] > 0.0 && r2[i] > 0.0 && std::isfinite(r1[i]) && std::isfinite(r2[i])) s[i] = std::sqrt(r1[i] / r2[i]);
  return s;
}

struct SweepResult {
  std::vector<std::vector<double>> scales;
  std::size_t sweeps = 0;
  bool converged = false;
};

SweepResult sweep(const std::vector<ChainLayer>& layers, const std::vector<bool>& active,
                  const EqualizeSettings& settings) {
  const std::size_t links = layers.size() - 1;
  std::vector<std::vector<double>> work;
  work.reserve(layers.size());
  for (const ChainLayer& layer : layers) work.push_back(layer.weights);
  SweepResult result;
  for (std::size_t k = 0; k < links; ++k) {
    const auto channels = outputChannelCount(layers[k].layout, layers[k].dims);
    result.scales.emplace_back(static_cast<std::size_t>(channels.value_or(0)), 1.0);
  }
  while (result.sweeps < settings.maxSweeps) {
    ++result.sweeps;
    double largestStep = 0.0;
    for (std::size_t k = 0; k < links; ++k) {
      if (!active[k]) continue;
      const auto s = pairScales(outputChannelRanges(layers[k].layout, work[k], layers[k].dims),
                                inputChannelRanges(layers[k + 1].layout, work[k + 1], layers[k + 1].dims));
      scaleOutputChannels(layers[k].layout, work[k], layers[k].dims, inverse(s));
      scaleInputChannels(layers[k + 1].layout, work[k + 1], layers[k + 1].dims, s);
      for (std::size_t i = 0; i < s.size(); ++i) {
        result.scales[k][i] *= s[i];
        largestStep = std::max(largestStep, std::abs(std::log(s[i])));
      }
    }
    if (largestStep < settings.tolerance) {
      result.converged = true;
      break;
    }
  }
  return result;
}

double int8Rounded(double w, double step) { return std::clamp(std::round(w / step), -127.0, 127.0) * step; }

// The data-free noise model of chainInt8Noise: per layer, the power of each input channel and the gain of each
// output channel to the chain's output, in the coordinates of the weights as given.
class ChainNoiseModel {
 public:
  explicit ChainNoiseModel(const std::vector<ChainLayer>& layers) : layers_(layers) {
    const std::size_t n = layers.size();
    for (const ChainLayer& layer : layers) {
      outIndexing_.push_back(*outputChannelIndexing(layer.layout, layer.dims));
      inIndexing_.push_back(*inputChannelIndexing(layer.layout, layer.dims));
    }
    power_.resize(n);
    power_[0].assign(static_cast<std::size_t>(*inputChannelCount(layers[0].layout, layers[0].dims)), 1.0);
    for (std::size_t k = 0; k < n; ++k) {
      std::vector<double> out(static_cast<std::size_t>(*outputChannelCount(layers[k].layout, layers[k].dims)), 0.0);
      for (std::size_t e = 0; e < layers[k].weights.size(); ++e)
        out[outChannel(k, e)] += layers[k].weights[e] * layers[k].weights[e] * power_[k][inChannel(k, e)];
      if (k + 1 < n)
        power_[k + 1] = std::move(out);
      else
        for (double p : out) signal_ += p;
    }
    gain_.resize(n);
    gain_[n - 1].assign(static_cast<std::size_t>(*outputChannelCount(layers[n - 1].layout, layers[n - 1].dims)), 1.0);
    for (std::size_t k = n - 1; k > 0; --k) {
      gain_[k - 1].assign(power_[k].size(), 0.0);
      for (std::size_t e = 0; e < layers[k].weights.size(); ++e)
        gain_[k - 1][inChannel(k, e)] += layers[k].weights[e] * layers[k].weights[e] * gain_[k][outChannel(k, e)];
    }
  }

  // Layer k's noise with its output channels divided by `outScale` and input channels multiplied by `inScale`
  // (null: 1), relative to the chain's signal.
  double layerNoise(std::size_t k, const std::vector<double>* inScale, const std::vector<double>* outScale) const {
    const std::vector<double>& weights = layers_[k].weights;
    auto factor = [&](std::size_t e) {
      return (inScale ? (*inScale)[inChannel(k, e)] : 1.0) / (outScale ? (*outScale)[outChannel(k, e)] : 1.0);
    };
    double largest = 0.0;
    for (std::size_t e = 0; e < weights.size(); ++e) largest = std::max(largest, std::abs(weights[e] * factor(e)));
    if (largest == 0.0 || !std::isfinite(largest) || !(signal_ > 0.0)) return 0.0;
    const double step = largest / 127.0;
    double noise = 0.0;
    for (std::size_t e = 0; e < weights.size(); ++e) {
      // The element's error in the scaled coordinates, carried back to the given ones (times 1 / factor) where
      // the powers and gains are.
      const double f = factor(e);
      const double scaled = weights[e] * f;
      const double error = (scaled - int8Rounded(scaled, step)) / f;
      noise += error * error * gain_[k][outChannel(k, e)] * power_[k][inChannel(k, e)];
    }
    return noise / signal_;
  }

  double layerNoise(std::size_t k, const std::vector<std::vector<double>>& scales) const {
    return layerNoise(k, k > 0 ? &scales[k - 1] : nullptr, k + 1 < layers_.size() ? &scales[k] : nullptr);
  }

 private:
  std::size_t outChannel(std::size_t k, std::size_t e) const {
    return static_cast<std::size_t>(outIndexing_[k].channel(static_cast<std::int64_t>(e)));
  }
  std::size_t inChannel(std::size_t k, std::size_t e) const {
    return static_cast<std::size_t>(inIndexing_[k].channel(static_cast<std::int64_t>(e)));
  }

  const std::vector<ChainLayer>& layers_;
  std::vector<ChannelIndexing> outIndexing_, inIndexing_;
  std::vector<std::vector<double>> power_, gain_;
  double signal_ = 0.0;
};

bool isDepthwise(const ChainLayer& layer) {
  if (layer.layout.kind != WeightKind::Conv || layer.layout.group <= 1) return false;
  return inputChannelCount(layer.layout, layer.dims) == layer.layout.group &&
         outputChannelCount(layer.layout, layer.dims) == layer.layout.group;
}

bool isDense(const ChainLayer& layer) {
  const bool grouped = layer.layout.kind == WeightKind::Conv || layer.layout.kind == WeightKind::ConvTranspose;
  return !grouped || layer.layout.group == 1;
}

// AIMET's one pass on working copies: dense -> depthwise -> dense as a triple in closed form, other candidate
// links as pairs, each once, in chain order.
std::vector<std::vector<double>> aimetOnePassScales(const std::vector<ChainLayer>& layers,
                                                    const std::vector<bool>& active,
                                                    std::vector<std::vector<double>> scales) {
  std::vector<std::vector<double>> work;
  for (const ChainLayer& layer : layers) work.push_back(layer.weights);
  auto apply = [&](std::size_t k, const std::vector<double>& s) {
    scaleOutputChannels(layers[k].layout, work[k], layers[k].dims, inverse(s));
    scaleInputChannels(layers[k + 1].layout, work[k + 1], layers[k + 1].dims, s);
    for (std::size_t i = 0; i < s.size(); ++i) scales[k][i] *= s[i];
  };
  const std::size_t links = layers.size() - 1;
  for (std::size_t k = 0; k < links; ++k) {
    if (!active[k]) continue;
    if (k + 1 < links && active[k + 1] && isDense(layers[k]) && isDepthwise(layers[k + 1]) &&
        isDense(layers[k + 2])) {
      const auto r1 = outputChannelRanges(layers[k].layout, work[k], layers[k].dims);
      const auto r2 = outputChannelRanges(layers[k + 1].layout, work[k + 1], layers[k + 1].dims);
      const auto r3 = inputChannelRanges(layers[k + 2].layout, work[k + 2], layers[k + 2].dims);
      std::vector<double> s12(r1.size(), 1.0), s23(r1.size(), 1.0);
      for (std::size_t i = 0; i < r1.size(); ++i) {
        if (!(r1[i] > 0.0 && r2[i] > 0.0 && r3[i] > 0.0) || !std::isfinite(r1[i] * r2[i] * r3[i])) continue;
        const double geometric = std::cbrt(r1[i] * r2[i] * r3[i]);
        s12[i] = r1[i] / geometric;
        s23[i] = geometric / r3[i];
      }
      apply(k, s12);
      apply(k + 1, s23);
      ++k;
      continue;
    }
    apply(k, pairScales(outputChannelRanges(layers[k].layout, work[k], layers[k].dims),
                        inputChannelRanges(layers[k + 1].layout, work[k + 1], layers[k + 1].dims)));
  }
  return scales;
}

std::vector<double> toPower(const std::vector<double>& scale, double power) {
  std::vector<double> result(scale.size());
  for (std::size_t i = 0; i < scale.size(); ++i) result[i] = std::pow(scale[i], power);
  return result;
}

struct PoweredScales {
  std::vector<double> power;
  std::vector<std::vector<double>> scales;
  double noise = 0.0;
};

// Coordinate descent over each candidate link's power of `full`, on the chain's summed noise; a link's power
// changes only its two layers' noise. Starts from the full step everywhere.
PoweredScales choosePowers(const ChainNoiseModel& model, const std::vector<std::vector<double>>& full,
                           const std::vector<bool>& active) {
  static constexpr double kPowers[] = {1.0, 0.5, 0.0};
  static constexpr int kMaxRounds = 4;
  const std::size_t links = full.size();
  PoweredScales result;
  result.power.assign(links, 0.0);
  result.scales.reserve(links);
  for (std::size_t k = 0; k < links; ++k) {
    if (active[k]) result.power[k] = 1.0;
    result.scales.push_back(toPower(full[k], result.power[k]));
  }
  std::vector<double> layerNoise(links + 1);
  for (std::size_t k = 0; k <= links; ++k) layerNoise[k] = model.layerNoise(k, result.scales);
  for (int round = 0; round < kMaxRounds; ++round) {
    bool moved = false;
    for (std::size_t k = 0; k < links; ++k) {
      if (!active[k]) continue;
      for (double power : kPowers) {
        if (power == result.power[k]) continue;
        std::vector<double> trial = toPower(full[k], power);
        const double first = model.layerNoise(k, k > 0 ? &result.scales[k - 1] : nullptr, &trial);
        const double second = model.layerNoise(k + 1, &trial, k + 1 < links ? &result.scales[k + 1] : nullptr);
        // Strictly lower, by more than rounding, so the descent ends.
        if (first + second < (layerNoise[k] + layerNoise[k + 1]) * (1.0 - 1e-12)) {
          result.power[k] = power;
          result.scales[k] = std::move(trial);
          layerNoise[k] = first;
          layerNoise[k + 1] = second;
          moved = true;
        }
      }
    }
    if (!moved) break;
  }
  for (double noise : layerNoise) result.noise += noise;
  return result;
}

void checkChain(const std::vector<ChainLayer>& layers) {
  if (layers.empty()) throw std::invalid_argument("equalize: a chain needs a layer");
  for (const ChainLayer& layer : layers) {
    // Checks dims against the layout and the data.
    outputChannelRanges(layer.layout, layer.weights, layer.dims);
    inputChannelRanges(layer.layout, layer.weights, layer.dims);
  }
  for (std::size_t k = 0; k + 1 < layers.size(); ++k) {
    const auto out = outputChannelCount(layers[k].layout, layers[k].dims);
    const auto in = inputChannelCount(layers[k + 1].layout, layers[k + 1].dims);
    if (!out || !in || *out != *in)
      throw std::invalid_argument("equalize: layer " + std::to_string(k) + "'s output channels do not match layer " +
                                  std::to_string(k + 1) + "'s input channels");
  }
}

}  // namespace

std::vector<double> outputChannelRanges(const WeightLayout& layout, const std::vector<double>& weights,
                                        const Dims& dims) {
  return channelRanges("outputChannelRanges", outputChannelIndexing(layout, dims), outputChannelCount(layout, dims),
                       weights, dims);
}

std::vector<double> inputChannelRanges(const WeightLayout& layout, const std::vector<double>& weights,
                                       const Dims& dims) {
  return channelRanges("inputChannelRanges", inputChannelIndexing(layout, dims), inputChannelCount(layout, dims),
                       weights, dims);
}

double relativeInt8Error(const std::vector<double>& weights) {
  double largest = 0.0, energy = 0.0;
  for (double w : weights) {
    largest = std::max(largest, std::abs(w));
    energy += w * w;
  }
  if (largest == 0.0 || !std::isfinite(largest)) return 0.0;
  const double step = largest / 127.0;
  double noise = 0.0;
  for (double w : weights) {
    const double q = std::clamp(std::round(w / step), -127.0, 127.0) * step;
    noise += (w - q) * (w - q);
  }
  return noise / energy;
}

double channelRelativeInt8Error(const WeightLayout& layout, const std::vector<double>& weights, const Dims& dims,
                                bool byOutput) {
  const auto indexing = byOutput ? outputChannelIndexing(layout, dims) : inputChannelIndexing(layout, dims);
  const auto channels = byOutput ? outputChannelCount(layout, dims) : inputChannelCount(layout, dims);
  // Checks dims against the data too.
  channelRanges("channelRelativeInt8Error", indexing, channels, weights, dims);
  double largest = 0.0;
  for (double w : weights) largest = std::max(largest, std::abs(w));
  if (largest == 0.0 || !std::isfinite(largest)) return 0.0;
  const double step = largest / 127.0;
  std::vector<double> noise(static_cast<std::size_t>(*channels), 0.0), energy(noise.size(), 0.0);
  forEachChannelRun(*indexing, 0, static_cast<std::int64_t>(weights.size()),
                    [&](std::int64_t offset, std::int64_t length, std::int64_t channel) {
                      for (std::int64_t i = offset; i < offset + length; ++i) {
                        const double w = weights[static_cast<std::size_t>(i)];
                        const double q = std::clamp(std::round(w / step), -127.0, 127.0) * step;
                        noise[static_cast<std::size_t>(channel)] += (w - q) * (w - q);
                        energy[static_cast<std::size_t>(channel)] += w * w;
                      }
                    });
  double sum = 0.0;
  std::size_t counted = 0;
  for (std::size_t c = 0; c < noise.size(); ++c)
    if (energy[c] > 0.0) {
      sum += noise[c] / energy[c];
      ++counted;
    }
  return counted ? sum / static_cast<double>(counted) : 0.0;
}

std::vector<double> equalizedWeights(const std::vector<ChainLayer>& layers,
                                     const std::vector<std::vector<double>>& scales, std::size_t k) {
  std::vector<double> weights = layers.at(k).weights;
  if (k + 1 < layers.size()) scaleOutputChannels(layers[k].layout, weights, layers[k].dims, inverse(scales.at(k)));
  if (k > 0) scaleInputChannels(layers[k].layout, weights, layers[k].dims, scales.at(k - 1));
  return weights;
}

std::vector<double> chainInt8Noise(const std::vector<ChainLayer>& layers,
                                   const std::vector<std::vector<double>>& scales) {
  checkChain(layers);
  if (scales.size() + 1 != layers.size())
    throw std::invalid_argument("chainInt8Noise: one scale vector per link needed");
  const ChainNoiseModel model(layers);
  std::vector<double> noise;
  for (std::size_t k = 0; k < layers.size(); ++k) noise.push_back(model.layerNoise(k, scales));
  return noise;
}

ChainScales equalizeChain(const std::vector<ChainLayer>& layers, const std::vector<bool>& candidate,
                          const EqualizeSettings& settings) {
  if (layers.size() < 2 || candidate.size() != layers.size() - 1)
    throw std::invalid_argument("equalizeChain: a chain needs two layers or more and one flag per link");
  checkChain(layers);
  const std::size_t links = candidate.size();
  SweepResult swept = sweep(layers, candidate, settings);
  ChainScales result;
  result.sweeps = swept.sweeps;
  result.converged = swept.converged;
  if (!settings.keepOnlyImproving) {
    result.kept = candidate;
    result.proposed = swept.scales;
    result.scales = std::move(swept.scales);
    result.power.assign(links, 0.0);
    for (std::size_t k = 0; k < links; ++k)
      if (candidate[k]) result.power[k] = 1.0;
    return result;
  }
  const ChainNoiseModel model(layers);
  std::vector<std::vector<double>> identity;
  for (const auto& s : swept.scales) identity.emplace_back(s.size(), 1.0);
  for (std::size_t k = 0; k < layers.size(); ++k) result.noiseBefore += model.layerNoise(k, identity);

  const std::vector<std::vector<double>> aimet = aimetOnePassScales(layers, candidate, identity);
  PoweredScales bySweep = choosePowers(model, swept.scales, candidate);
  PoweredScales byAimet = choosePowers(model, aimet, candidate);
  const bool aimetWins = byAimet.noise < bySweep.noise;
  PoweredScales& chosen = aimetWins ? byAimet : bySweep;
  result.method = aimetWins ? ScaleMethod::AimetOnePass : ScaleMethod::Sweep;
  result.proposed = aimetWins ? aimet : swept.scales;
  // Never worse: the chain as given when no choice lowers its noise enough.
  if (!(chosen.noise < result.noiseBefore * (1.0 - settings.minimumNoiseReduction))) {
    result.scales = identity;
    result.power.assign(links, 0.0);
    result.noiseAfter = result.noiseBefore;
  } else {
    result.scales = std::move(chosen.scales);
    result.power = std::move(chosen.power);
    result.noiseAfter = chosen.noise;
  }
  result.kept.resize(links);
  for (std::size_t k = 0; k < links; ++k) result.kept[k] = result.power[k] > 0.0;
  return result;
}

}  // namespace bnfold::kernels
