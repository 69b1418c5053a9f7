#include "kernels/equalize_junction.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/second_thread.h"

namespace bnfold::kernels {
namespace {

std::size_t outputCount(const ChainLayer& layer) {
  const auto count = outputChannelCount(layer.layout, layer.dims);
  if (!count) throw std::invalid_argument("equalizeJunction: a producer's dims do not fit its layout");
  return static_cast<std::size_t>(*count);
}

std::size_t inputCount(const ChainLayer& layer) {
  const auto count = inputChannelCount(layer.layout, layer.dims);
  if (!count) throw std::invalid_argument("equalizeJunction: a reader's dims do not fit its layout");
  return static_cast<std::size_t>(*count);
}

std::vector<double> inverse(const std::vector<double>& values) {
  std::vector<double> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = 1.0 / values[i];
  return out;
}

double producerError(const std::vector<JunctionProducer>& producers, const std::vector<std::vector<double>>& weights) {
  double sum = 0.0;
  for (std::size_t p = 0; p < producers.size(); ++p)
    sum += channelRelativeInt8Error(producers[p].layer.layout, weights[p], producers[p].layer.dims, true);
  return sum;
}

double readerError(const std::vector<JunctionReader>& readers, const std::vector<std::vector<double>>& weights) {
  double sum = 0.0;
  for (std::size_t r = 0; r < readers.size(); ++r)
    sum += channelRelativeInt8Error(readers[r].layer.layout, weights[r], readers[r].layer.dims, false);
  return sum;
}

}  // namespace

std::vector<double> blockExpanded(const std::vector<double>& perChannel, std::int64_t block) {
  std::vector<double> out;
  out.reserve(perChannel.size() * static_cast<std::size_t>(block));
  for (double value : perChannel) out.insert(out.end(), static_cast<std::size_t>(block), value);
  return out;
}

std::vector<double> junctionProducerRanges(const std::vector<JunctionProducer>& producers,
                                           const std::vector<std::vector<double>>& weights, std::size_t channels) {
  std::vector<double> ranges(channels, 0.0);
  for (std::size_t p = 0; p < producers.size(); ++p) {
    const auto own = outputChannelRanges(producers[p].layer.layout, weights[p], producers[p].layer.dims);
    std::copy(own.begin(), own.end(), ranges.begin() + static_cast<std::ptrdiff_t>(producers[p].first));
  }
  return ranges;
}

std::vector<double> junctionReaderRanges(const std::vector<JunctionReader>& readers,
                                         const std::vector<std::vector<double>>& weights, std::size_t channels) {
  std::vector<double> ranges(channels, 0.0);
  for (std::size_t r = 0; r < readers.size(); ++r) {
    const auto own = inputChannelRanges(readers[r].layer.layout, weights[r], readers[r].layer.dims);
    const auto block = static_cast<std::size_t>(readers[r].block);
    for (std::size_t f = 0; f < own.size(); ++f) ranges[f / block] = std::max(ranges[f / block], own[f]);
  }
  return ranges;
}

std::vector<double> scaledProducerWeights(const JunctionProducer& producer, const std::vector<double>& scales) {
  const std::size_t count = outputCount(producer.layer);
  const auto first = scales.begin() + static_cast<std::ptrdiff_t>(producer.first);
  std::vector<double> weights = producer.layer.weights;
  scaleOutputChannels(producer.layer.layout, weights, producer.layer.dims,
                      inverse(std::vector<double>(first, first + static_cast<std::ptrdiff_t>(count))));
  return weights;
}

std::vector<double> scaledReaderWeights(const JunctionReader& reader, const std::vector<double>& scales) {
  std::vector<double> weights = reader.layer.weights;
  scaleInputChannels(reader.layer.layout, weights, reader.layer.dims, blockExpanded(scales, reader.block));
  return weights;
}

JunctionScales equalizeJunction(const std::vector<JunctionProducer>& producers,
                                const std::vector<JunctionReader>& readers, std::size_t channels) {
  if (producers.empty() || readers.empty())
    throw std::invalid_argument("equalizeJunction: a junction needs a producer and a reader");
  std::size_t covered = 0;
  for (const JunctionProducer& producer : producers) {
    if (producer.first != covered)
      throw std::invalid_argument("equalizeJunction: the producers do not cover the channels in order");
    covered += outputCount(producer.layer);
  }
  if (covered != channels)
    throw std::invalid_argument("equalizeJunction: the producers write " + std::to_string(covered) +
                                " channels, not " + std::to_string(channels));
  for (const JunctionReader& reader : readers)
    if (reader.block < 1 || inputCount(reader.layer) != channels * static_cast<std::size_t>(reader.block))
      throw std::invalid_argument("equalizeJunction: a reader does not read " + std::to_string(channels) +
                                  " channels of " + std::to_string(reader.block) + " inputs");

  std::vector<std::vector<double>> producerWeights, readerWeights;
  for (const JunctionProducer& producer : producers) producerWeights.push_back(producer.layer.weights);
  for (const JunctionReader& reader : readers) readerWeights.push_back(reader.layer.weights);

  JunctionScales result;
  result.producerRanges = junctionProducerRanges(producers, producerWeights, channels);
  result.readerRanges = junctionReaderRanges(readers, readerWeights, channels);
  result.scales.assign(channels, 1.0);
  for (std::size_t i = 0; i < channels; ++i) {
    const double r1 = result.producerRanges[i], r2 = result.readerRanges[i];
    if (r1 > 0.0 && r2 > 0.0 && std::isfinite(r1) && std::isfinite(r2)) result.scales[i] = std::sqrt(r1 / r2);
  }
  result.producerErrorBefore = producerError(producers, producerWeights);
  result.readerErrorBefore = readerError(readers, readerWeights);
  for (std::size_t p = 0; p < producers.size(); ++p)
    producerWeights[p] = scaledProducerWeights(producers[p], result.scales);
  for (std::size_t r = 0; r < readers.size(); ++r) readerWeights[r] = scaledReaderWeights(readers[r], result.scales);
  result.producerRangesAfter = junctionProducerRanges(producers, producerWeights, channels);
  result.readerRangesAfter = junctionReaderRanges(readers, readerWeights, channels);
  result.producerErrorAfter = producerError(producers, producerWeights);
  result.readerErrorAfter = readerError(readers, readerWeights);
  result.improves = result.producerErrorAfter + result.readerErrorAfter <
                    result.producerErrorBefore + result.readerErrorBefore;
  return result;
}

JunctionScales equalizeSummedJunction(const std::vector<ChainLayer>& producers,
                                      const std::vector<JunctionReader>& readers, std::size_t channels,
                                      bool concurrent) {
  if (producers.empty() || readers.empty())
    throw std::invalid_argument("equalizeSummedJunction: a junction needs a producer and a reader");
  for (const ChainLayer& producer : producers)
    if (outputCount(producer) != channels)
      throw std::invalid_argument("equalizeSummedJunction: a producer does not write " + std::to_string(channels) +
                                  " channels");
  for (const JunctionReader& reader : readers)
    if (reader.block < 1 || inputCount(reader.layer) != channels * static_cast<std::size_t>(reader.block))
      throw std::invalid_argument("equalizeSummedJunction: a reader does not read " + std::to_string(channels) +
                                  " channels of " + std::to_string(reader.block) + " inputs");
  // The producers' summaries by output and the readers' by input, shared out a layer at a time (the largest first)
  // between this thread and a second one when there is enough to read; each summary is the same either way.
  auto elementsOf = [](const ChainLayer& layer) {
    std::int64_t count = 1;
    for (std::int64_t d : layer.dims) count *= d;
    return count;
  };
  auto layerOf = [&](std::size_t t) -> const ChainLayer& {
    return t < producers.size() ? producers[t] : readers[t - producers.size()].layer;
  };
  const std::size_t layerCount = producers.size() + readers.size();
  std::vector<std::size_t> largestFirst(layerCount);
  std::vector<std::int64_t> elements(layerCount);
  std::int64_t totalElements = 0;
  for (std::size_t t = 0; t < layerCount; ++t) {
    largestFirst[t] = t;
    elements[t] = elementsOf(layerOf(t));
    totalElements += elements[t];
  }
  std::stable_sort(largestFirst.begin(), largestFirst.end(),
                   [&](std::size_t a, std::size_t b) { return elements[a] > elements[b]; });
  std::vector<ChannelSummary> summaries(layerCount);
  std::atomic<std::size_t> nextLayer{0};
  auto summarise = [&] {
    for (std::size_t next = nextLayer++; next < layerCount; next = nextLayer++) {
      const std::size_t t = largestFirst[next];
      summaries[t] = channelSummary(layerOf(t), t < producers.size());
    }
  };
  {
    std::future<void> helper;
    if (concurrent && layerCount > 1 && totalElements >= 2 * kElementsWorthAThread) helper = onSecondThread(summarise);
    summarise();
    if (helper.valid()) helper.get();
  }
  const std::vector<ChannelSummary> producerSummaries(std::make_move_iterator(summaries.begin()),
                                                      std::make_move_iterator(summaries.begin() + producers.size()));
  const std::vector<ChannelSummary> readerSummaries(std::make_move_iterator(summaries.begin() + producers.size()),
                                                    std::make_move_iterator(summaries.end()));
  JunctionScales result;
  result.producerRanges.assign(channels, 0.0);
  result.readerRanges.assign(channels, 0.0);
  for (std::size_t r = 0; r < readers.size(); ++r) {
    const auto block = static_cast<std::size_t>(readers[r].block);
    const std::vector<double>& largest = readerSummaries[r].largest;
    for (std::size_t f = 0; f < largest.size(); ++f)
      result.readerRanges[f / block] = std::max(result.readerRanges[f / block], largest[f]);
  }
  for (const ChannelSummary& summary : producerSummaries)
    for (std::size_t i = 0; i < channels; ++i)
      result.producerRanges[i] = std::max(result.producerRanges[i], summary.largest[i]);
  std::vector<double> full(channels, 1.0);
  for (std::size_t i = 0; i < channels; ++i) {
    const double r1 = result.producerRanges[i], r2 = result.readerRanges[i];
    if (r1 > 0.0 && r2 > 0.0 && std::isfinite(r1) && std::isfinite(r2)) full[i] = std::sqrt(r1 / r2);
  }
  // The full step, or half of it (s^1/2) where the full one costs the readers more than it saves the writers.
  auto errorWith = [&](const std::vector<double>& scales) {
    const std::vector<double> inverseScales = inverse(scales);
    double error = 0.0;
    for (const ChannelSummary& summary : producerSummaries)
      error += estimatedChannelRelativeInt8Error(summary, inverseScales);
    for (std::size_t r = 0; r < readers.size(); ++r)
      error += estimatedChannelRelativeInt8Error(readerSummaries[r], blockExpanded(scales, readers[r].block));
    return error;
  };
  std::vector<double> half(channels);
  for (std::size_t i = 0; i < channels; ++i) half[i] = std::sqrt(full[i]);
  const bool halfStep = errorWith(half) < errorWith(full);
  result.scales = halfStep ? half : full;
  result.power = halfStep ? 0.5 : 1.0;
  const std::vector<double> inverseScales = inverse(result.scales);
  result.producerRangesAfter.assign(channels, 0.0);
  result.readerRangesAfter.assign(channels, 0.0);
  for (std::size_t i = 0; i < channels; ++i) {
    result.producerRangesAfter[i] = result.producerRanges[i] * inverseScales[i];
    result.readerRangesAfter[i] = result.readerRanges[i] * result.scales[i];
  }
  for (const ChannelSummary& summary : producerSummaries) {
    result.producerErrorBefore += estimatedChannelRelativeInt8Error(summary, {});
    result.producerErrorAfter += estimatedChannelRelativeInt8Error(summary, inverseScales);
  }
  for (std::size_t r = 0; r < readers.size(); ++r) {
    result.readerErrorBefore += estimatedChannelRelativeInt8Error(readerSummaries[r], {});
    result.readerErrorAfter +=
        estimatedChannelRelativeInt8Error(readerSummaries[r], blockExpanded(result.scales, readers[r].block));
  }
  result.improves =
      result.producerErrorAfter + result.readerErrorAfter < result.producerErrorBefore + result.readerErrorBefore;
  return result;
}

}  // namespace bnfold::kernels
