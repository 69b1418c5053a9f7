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

double linkError(const std::vector<ChainLayer>& layers, const std::vector<std::vector<double>>& scales, std::size_t k) {
  return channelRelativeInt8Error(layers[k].layout, equalizedWeights(layers, scales, k), layers[k].dims, true) +
         channelRelativeInt8Error(layers[k + 1].layout, equalizedWeights(layers, scales, k + 1), layers[k + 1].dims,
                                  false);
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

ChainScales equalizeChain(const std::vector<ChainLayer>& layers, const std::vector<bool>& candidate,
                          const EqualizeSettings& settings) {
  if (layers.size() < 2 || candidate.size() != layers.size() - 1)
    throw std::invalid_argument("equalizeChain: a chain needs two layers or more and one flag per link");
  for (std::size_t k = 0; k + 1 < layers.size(); ++k) {
    const auto out = outputChannelCount(layers[k].layout, layers[k].dims);
    const auto in = inputChannelCount(layers[k + 1].layout, layers[k + 1].dims);
    if (!out || !in || *out != *in)
      throw std::invalid_argument("equalizeChain: layer " + std::to_string(k) +
                                  "'s output channels do not match "
                                  "layer " +
                                  std::to_string(k + 1) + "'s input channels");
  }
  ChainScales result;
  result.kept = candidate;
  for (;;) {
    SweepResult swept = sweep(layers, result.kept, settings);
    result.scales = std::move(swept.scales);
    result.sweeps = swept.sweeps;
    result.converged = swept.converged;
    if (result.proposed.empty()) result.proposed = result.scales;
    for (std::size_t k = 0; k < result.scales.size(); ++k)
      if (result.kept[k]) result.proposed[k] = result.scales[k];
    // Never worse: a link stays only if its scales lower the error of the two layers it touches.
    bool dropped = false;
    if (!settings.keepOnlyImproving) return result;
    for (std::size_t k = 0; k < result.scales.size(); ++k) {
      if (!result.kept[k]) continue;
      const double with = linkError(layers, result.scales, k);
      std::vector<std::vector<double>> without = result.scales;
      std::fill(without[k].begin(), without[k].end(), 1.0);
      if (!(with < linkError(layers, without, k))) {
        result.kept[k] = false;
        dropped = true;
      }
    }
    if (!dropped) return result;
  }
}

}  // namespace bnfold::kernels
