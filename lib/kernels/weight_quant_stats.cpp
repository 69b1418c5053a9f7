// The per-tensor figure is equalize's own error measure (relativeInt8Error) in dB, so info and equalize agree.
#include "kernels/weight_quant_stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "kernels/equalize_math.h"

namespace bnfold::kernels {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

double decibelsOfRelativeError(double relativeError) {
  return relativeError > 0.0 ? -10.0 * std::log10(relativeError) : kInfinity;
}

}  // namespace

double WeightQuantStats::gapDb() const {
  if (std::isinf(perChannelSqnrDb) && std::isinf(perTensorSqnrDb)) return 0.0;
  return perChannelSqnrDb - perTensorSqnrDb;
}

double perChannelInt8SqnrDb(const WeightLayout& layout, const std::vector<double>& weights, const Dims& dims) {
  // Checks dims against the layout and the data.
  const std::vector<double> ranges = outputChannelRanges(layout, weights, dims);
  const auto indexing = outputChannelIndexing(layout, dims);
  double noise = 0.0, energy = 0.0;
  forEachChannelRun(*indexing, 0, static_cast<std::int64_t>(weights.size()),
                    [&](std::int64_t offset, std::int64_t length, std::int64_t channel) {
                      const double range = ranges[static_cast<std::size_t>(channel)];
                      const double step = range / 127.0;
                      for (std::int64_t i = offset; i < offset + length; ++i) {
                        const double w = weights[static_cast<std::size_t>(i)];
                        energy += w * w;
                        if (step == 0.0 || !std::isfinite(step)) continue;
                        const double q = std::clamp(std::round(w / step), -127.0, 127.0) * step;
                        noise += (w - q) * (w - q);
                      }
                    });
  return energy > 0.0 ? decibelsOfRelativeError(noise / energy) : kInfinity;
}

WeightQuantStats weightQuantStats(const WeightLayout& layout, const std::vector<double>& weights, const Dims& dims) {
  WeightQuantStats stats;
  const std::vector<double> ranges = outputChannelRanges(layout, weights, dims);
  stats.channels = static_cast<std::int64_t>(ranges.size());
  double largest = 0.0, smallest = kInfinity;
  for (double range : ranges) {
    if (range == 0.0) {
      ++stats.deadChannels;
      continue;
    }
    largest = std::max(largest, range);
    smallest = std::min(smallest, range);
  }
  stats.rangeSpread = largest > 0.0 ? largest / smallest : 0.0;
  stats.perTensorSqnrDb = decibelsOfRelativeError(relativeInt8Error(weights));
  stats.perChannelSqnrDb = perChannelInt8SqnrDb(layout, weights, dims);
  return stats;
}

}  // namespace bnfold::kernels
