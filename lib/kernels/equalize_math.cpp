// The sweep reads each layer's weights once, as the largest |w| per (output, input) channel pair, and rescales
// those as the weights would be rescaled, so its ranges are exactly those of the rescaled weights. The noise of a
// layer under given scales must round every weight; a chain's noise model computes it once per distinct scales.
#include "kernels/equalize_math.h"

#include <Eigen/Core>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <future>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include "kernels/second_thread.h"

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

// std::round (halves away from zero) without a library call per weight; exact: below 2^52 the fraction x - trunc(x)
// is representable.
inline double roundHalfAway(double x) {
  if (!(std::abs(x) < 4503599627370496.0)) return std::round(x);
  const auto truncated = static_cast<double>(static_cast<std::int64_t>(x));
  const double fraction = x - truncated;
  // Selects rather than branches: the fraction's side of 1/2 is random from weight to weight.
  return truncated + (fraction >= 0.5 ? 1.0 : 0.0) - (fraction <= -0.5 ? 1.0 : 0.0);
}

inline double int8Rounded(double w, double step) { return std::clamp(roundHalfAway(w / step), -127.0, 127.0) * step; }

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

// A layer's weight elements in runs that share one output and one input channel, in element order, with the
// largest |w| and the sum of squares of each run. A positive per-channel factor keeps a run's largest element its
// largest, and rounding is monotone, so the largest of the rescaled weights is exactly the rescaled largest: the
// ranges of a rescaled layer come from its runs without touching every weight.
struct LayerPairs {
  std::vector<std::int64_t> start;  // one per run, and the element count last
  std::vector<std::size_t> out, in;
  std::vector<double> largest, squares;
  std::size_t outChannels = 0, inChannels = 0;
  /// Run r is (output r / inChannels, input r % inChannels): a dense layer's pairs, row by row.
  bool grid = false;
  /// Every run's length when they are all equal (a Conv's kernel size), else 0.
  std::int64_t runLength = 0;

  std::size_t runs() const { return out.size(); }
};

using ConstArray = Eigen::Map<const Eigen::ArrayXd>;
using MutableArray = Eigen::Map<Eigen::ArrayXd>;

// The largest of each output (byOutput) or input channel of a grid layer's pair maxima (LayerPairs::grid: rows are
// outputs), each multiplied first by its row's factor and then by its column's (null: 1), as the weights are
// rescaled (so each range equals the largest rescaled weight to the last bit). Rows at a time through Eigen, which
// vectorizes them.
void gridChannelRanges(const double* largest, std::size_t outs, std::size_t ins, const double* rowFactor,
                       const double* columnFactor, bool byOutput, double* ranges) {
  const auto columns = static_cast<Eigen::Index>(ins);
  if (!byOutput) MutableArray(ranges, columns).setZero();
  if (ins == 0) {
    if (byOutput) std::fill(ranges, ranges + outs, 0.0);
    return;
  }
  Eigen::ArrayXd row(columns);
  for (std::size_t o = 0; o < outs; ++o) {
    const ConstArray pairs(largest + o * ins, columns);
    if (rowFactor)
      row = pairs * rowFactor[o];
    else
      row = pairs;
    if (columnFactor) row *= ConstArray(columnFactor, columns);
    if (byOutput)
      ranges[o] = std::max(0.0, row.maxCoeff());
    else
      MutableArray(ranges, columns) = MutableArray(ranges, columns).max(row);
  }
}

// The same for any layer's pairs, one pair at a time (std::max, so a NaN maximum stays out as before).
std::vector<double> runChannelRanges(const LayerPairs& pairs, const std::vector<double>& largest,
                                     const double* rowFactor, const double* columnFactor, bool byOutput) {
  std::vector<double> ranges(byOutput ? pairs.outChannels : pairs.inChannels, 0.0);
  for (std::size_t r = 0; r < largest.size(); ++r) {
    double scaled = largest[r];
    if (rowFactor) scaled *= rowFactor[pairs.out[r]];
    if (columnFactor) scaled *= columnFactor[pairs.in[r]];
    double& range = ranges[byOutput ? pairs.out[r] : pairs.in[r]];
    range = std::max(range, scaled);
  }
  return ranges;
}

// Per-channel maxima of `largest` (one per pair of `pairs`) as gridChannelRanges defines them, row by row when the
// pairs are a grid.
std::vector<double> pairChannelRanges(const LayerPairs& pairs, const std::vector<double>& largest,
                                      const double* rowFactor, const double* columnFactor, bool byOutput) {
  if (!pairs.grid) return runChannelRanges(pairs, largest, rowFactor, columnFactor, byOutput);
  std::vector<double> ranges(byOutput ? pairs.outChannels : pairs.inChannels);
  gridChannelRanges(largest.data(), pairs.outChannels, pairs.inChannels, rowFactor, columnFactor, byOutput,
                    ranges.data());
  return ranges;
}

std::size_t elementCountOf(const ChainLayer& layer) {
  if (!layer.read) return layer.weights.size();
  std::size_t count = 1;
  for (std::int64_t d : layer.dims) count *= static_cast<std::size_t>(d);
  return count;
}

void checkLayerDims(const char* function, const std::optional<ChannelIndexing>& indexing,
                    const std::optional<std::int64_t>& channels, const ChainLayer& layer) {
  if (!indexing || !channels) throw std::invalid_argument(std::string(function) + ": dims do not fit the layout");
  std::size_t count = 1;
  for (std::int64_t d : layer.dims) count *= static_cast<std::size_t>(d);
  if (count != elementCountOf(layer))
    throw std::invalid_argument(std::string(function) + ": dims do not match the " +
                                std::to_string(elementCountOf(layer)) + " weights");
}

// A layer's channel indexing on both sides, checked against its dims and data.
struct LayerShape {
  ChannelIndexing out, in;
  std::size_t outChannels = 0, inChannels = 0;
  std::int64_t count = 0;
};

LayerShape layerShape(const ChainLayer& layer) {
  const auto outIndexing = outputChannelIndexing(layer.layout, layer.dims);
  const auto inIndexing = inputChannelIndexing(layer.layout, layer.dims);
  const auto outChannels = outputChannelCount(layer.layout, layer.dims);
  const auto inChannels = inputChannelCount(layer.layout, layer.dims);
  checkLayerDims("outputChannelRanges", outIndexing, outChannels, layer);
  checkLayerDims("inputChannelRanges", inIndexing, inChannels, layer);
  return {*outIndexing, *inIndexing, static_cast<std::size_t>(*outChannels), static_cast<std::size_t>(*inChannels),
          static_cast<std::int64_t>(elementCountOf(layer))};
}

// A layer's weights in element order, a piece at a time: in place when held as doubles, else read through the
// layer's reader into a small buffer (a large weight is never copied whole).
class WeightStream {
 public:
  WeightStream(const ChainLayer& layer, std::int64_t count) : layer_(layer), count_(count) {}

  // Elements [first, first + count) contiguous; asked for in increasing order. Valid until the next call.
  const double* span(std::int64_t first, std::int64_t count) {
    if (!layer_.read) return layer_.weights.data() + first;
    if (first < bufferFirst_ || first + count > bufferFirst_ + bufferCount_) {
      bufferFirst_ = first;
      bufferCount_ = std::min(std::max(kPiece, count), count_ - first);
      if (buffer_.size() < static_cast<std::size_t>(bufferCount_)) buffer_.resize(static_cast<std::size_t>(bufferCount_));
      layer_.read(first, bufferCount_, buffer_.data());
    }
    return buffer_.data() + (first - bufferFirst_);
  }

 private:
  static constexpr std::int64_t kPiece = 8192;
  const ChainLayer& layer_;
  std::int64_t count_;
  std::vector<double> buffer_;
  std::int64_t bufferFirst_ = 0, bufferCount_ = 0;
};

// One run of weight elements that share an output and an input channel, with its largest |w| and sum of squares.
struct ChannelPair {
  std::size_t in = 0;
  std::int64_t first = 0, length = 0;
  double largest = 0.0, squares = 0.0;
};

// The channel pairs of one output run (elements [offset, offset + length), all feeding one output channel), in
// element order.
class OutputRunPairs {
 public:
  OutputRunPairs(const LayerShape& shape, std::int64_t offset, std::int64_t length, const double* weights)
      : runs_(shape.in, offset, length), offset_(offset), weights_(weights) {}

  bool next(ChannelPair& pair) {
    std::int64_t inner = 0, length = 0, in = 0;
    if (!runs_.next(inner, length, in)) return false;
    double largest = 0.0, squares = 0.0;
    for (std::int64_t e = inner; e < inner + length; ++e) {
      const double w = weights_[e];
      const double magnitude = std::abs(w);
      largest = largest < magnitude ? magnitude : largest;  // std::max, by value
      squares += w * w;
    }
    pair = {static_cast<std::size_t>(in), offset_ + inner, length, largest, squares};
    return true;
  }

 private:
  ChannelRuns runs_;
  std::int64_t offset_;
  const double* weights_;
};

// onRun(out, offset, length, weights) per run of elements feeding one output channel among elements [first, first +
// count) (first on a run's boundary), in element order, with the run's weights (valid during the call). Consumers
// loop over OutputRunPairs with their sums in locals.
template <typename OnRun>
void forEachOutputRun(const ChainLayer& layer, const LayerShape& shape, std::int64_t first, std::int64_t count,
                      OnRun&& onRun) {
  WeightStream stream(layer, shape.count);
  ChannelRuns runs(shape.out, first, count);
  std::int64_t offset = 0, length = 0, out = 0;
  while (runs.next(offset, length, out))
    onRun(static_cast<std::size_t>(out), first + offset, length, stream.span(first + offset, length));
}

// How many runs layerPairs records for elements [first, first + count), without reading a weight: forEachChannelRun
// gives one run per block of `inner` elements an output run touches.
std::size_t channelPairCount(const LayerShape& shape, std::int64_t first, std::int64_t count) {
  std::size_t runs = 0;
  forEachChannelRun(shape.out, first, count, [&](std::int64_t offset, std::int64_t length, std::int64_t) {
    const std::int64_t at = first + offset;
    runs += static_cast<std::size_t>((at + length - 1) / shape.in.inner - at / shape.in.inner + 1);
  });
  return runs;
}

// The shape's channel counts, no runs yet.
LayerPairs emptyPairs(const LayerShape& shape) {
  LayerPairs pairs;
  pairs.outChannels = shape.outChannels;
  pairs.inChannels = shape.inChannels;
  return pairs;
}

// A layer's pairs with room for all its runs, none filled yet.
LayerPairs sizedPairs(const LayerShape& shape) {
  LayerPairs pairs = emptyPairs(shape);
  const std::size_t runs = channelPairCount(shape, 0, shape.count);
  pairs.start.resize(runs + 1);
  pairs.out.resize(runs);
  pairs.in.resize(runs);
  pairs.largest.resize(runs);
  pairs.squares.resize(runs);
  return pairs;
}

// Fills runs [r, end) of `pairs` from elements [first, first + count), whole output runs.
void fillPairs(const ChainLayer& layer, const LayerShape& shape, std::int64_t first, std::int64_t count,
               LayerPairs& pairs, std::size_t r, std::size_t end) {
  forEachOutputRun(layer, shape, first, count,
                   [&](std::size_t out, std::int64_t offset, std::int64_t length, const double* weights) {
                     OutputRunPairs runPairs(shape, offset, length, weights);
                     ChannelPair pair;
                     while (runPairs.next(pair)) {
                       if (r == end) throw std::logic_error("equalize: channel pairs miscounted");
                       pairs.start[r] = pair.first;
                       pairs.out[r] = out;
                       pairs.in[r] = pair.in;
                       pairs.largest[r] = pair.largest;
                       pairs.squares[r] = pair.squares;
                       ++r;
                     }
                   });
  if (r != end) throw std::logic_error("equalize: channel pairs miscounted");
}

// What the filled runs say about the layer as a whole (LayerPairs::grid, LayerPairs::runLength).
void finishPairs(LayerPairs& pairs, const LayerShape& shape) {
  const std::size_t runs = pairs.runs();
  pairs.start[runs] = shape.count;
  pairs.grid = runs == pairs.outChannels * pairs.inChannels;
  for (std::size_t p = 0; p < runs && pairs.grid; ++p)
    pairs.grid = pairs.out[p] == p / pairs.inChannels && pairs.in[p] == p % pairs.inChannels;
  pairs.runLength = runs > 0 ? pairs.start[1] - pairs.start[0] : 0;
  for (std::size_t p = 1; p < runs && pairs.runLength > 0; ++p)
    if (pairs.start[p + 1] - pairs.start[p] != pairs.runLength) pairs.runLength = 0;
}

LayerPairs layerPairs(const ChainLayer& layer, const LayerShape& shape) {
  LayerPairs pairs = sizedPairs(shape);
  fillPairs(layer, shape, 0, shape.count, pairs, 0, pairs.runs());
  finishPairs(pairs, shape);
  return pairs;
}

// out[o] = sum over the pairs (o, i), in order, of their sum of squares times power[i].
std::vector<double> forwardPower(const LayerPairs& runs, const std::vector<double>& power) {
  std::vector<double> out(runs.outChannels, 0.0);
  for (std::size_t r = 0; r < runs.runs(); ++r) out[runs.out[r]] += runs.squares[r] * power[runs.in[r]];
  return out;
}

// The squared int8 rounding error of a group of `count` weights with the given largest magnitude and sum of
// squares, for a given half step (in the group's coordinates): all of them round to zero and cost their squares
// when the largest lies below it; otherwise each costs the smaller of its square and step^2 / 12 = halfStep^2 / 3,
// the uniform rounding error, summed here as the smaller of the sums (the weights are not seen one by one).
inline double groupRoundingNoise(double largest, double count, double squares, double halfStep) {
  if (largest < halfStep) return squares;
  return std::min(squares, count * halfStep * halfStep / 3.0);
}

// The weights of a chain's first layer are never scaled on their input side, nor the last layer's on their
// output side: the estimate sums those per output (input) channel, a group every candidate scales by one factor.
struct ChannelGroups {
  std::vector<double> largest, count, squares;

  explicit ChannelGroups(std::size_t channels) : largest(channels, 0.0), count(channels, 0.0), squares(channels, 0.0) {}
  explicit ChannelGroups(ChannelSummary&& summary)
      : largest(std::move(summary.largest)), count(std::move(summary.count)), squares(std::move(summary.squares)) {}

  void add(std::size_t c, std::int64_t length, double runLargest, double runSquares) {
    largest[c] = std::max(largest[c], runLargest);
    count[c] += static_cast<double>(length);
    squares[c] += runSquares;
  }

  ChannelGroups(const LayerPairs& pairs, bool byOutput) {
    const std::vector<std::size_t>& channelOf = byOutput ? pairs.out : pairs.in;
    const std::size_t channels = byOutput ? pairs.outChannels : pairs.inChannels;
    largest.assign(channels, 0.0);
    count.assign(channels, 0.0);
    squares.assign(channels, 0.0);
    for (std::size_t r = 0; r < pairs.runs(); ++r) {
      const std::size_t c = channelOf[r];
      largest[c] = std::max(largest[c], pairs.largest[r]);
      count[c] += static_cast<double>(pairs.start[r + 1] - pairs.start[r]);
      squares[c] += pairs.squares[r];
    }
  }
};

}  // namespace

// The data-free noise model of chainInt8Noise: per layer, the power of each input channel and the gain of each
// output channel to the chain's output, in the coordinates of the weights as given.
struct ChainNoise::Model {
  Model(const std::vector<ChainLayer>& chain, NoiseMeasure noiseMeasure, bool concurrent)
      : layers(chain), measure(noiseMeasure), byChannel(noiseMeasure == NoiseMeasure::Estimated && chain.size() >= 2) {
    if (layers.empty()) throw std::invalid_argument("equalize: a chain needs a layer");
    for (const ChainLayer& layer : layers) {
      if (measure == NoiseMeasure::Exact && layer.read)
        throw std::invalid_argument("equalize: the exact noise needs every weight as a double");
      shapes.push_back(layerShape(layer));
    }
    for (std::size_t k = 0; k + 1 < layers.size(); ++k)
      if (shapes[k].outChannels != shapes[k + 1].inChannels)
        throw std::invalid_argument("equalize: layer " + std::to_string(k) + "'s output channels do not match layer " +
                                    std::to_string(k + 1) + "'s input channels");
    for (std::size_t k = 0; k < layers.size(); ++k) {
      const bool summarisedByChannel = byChannel && (k == 0 || k + 1 == layers.size());
      pairs.push_back(summarisedByChannel ? emptyPairs(shapes[k]) : sizedPairs(shapes[k]));
      pairsBuilt.push_back(!summarisedByChannel);
    }
    readLayers(concurrent);
    for (std::size_t k = 0; k < layers.size(); ++k)
      if (pairsBuilt[k]) finishPairs(pairs[k], shapes[k]);
    if (byChannel) propagateFromEnds();
    remembered.resize(layers.size());
  }

  // Layer k's channel pairs, read now if only its channel summaries were kept.
  const LayerPairs& fullPairs(std::size_t k) const {
    if (!pairsBuilt[k]) {
      pairs[k] = layerPairs(layers[k], shapes[k]);
      pairsBuilt[k] = true;
    }
    return pairs[k];
  }

  // One piece of reading the chain: the first layer's summary by output (kFirstEnd), the last's by input
  // (kLastEnd), or the pairs of elements [first, first + count) of layer `layer`, runs [r, end) of its pairs.
  struct ReadPiece {
    std::size_t layer = 0;
    std::int64_t first = 0, count = 0;
    std::size_t r = 0, end = 0;
  };
  static constexpr std::size_t kFirstEnd = static_cast<std::size_t>(-1), kLastEnd = static_cast<std::size_t>(-2);

  // The end layers' summaries (channelSummary, which reads a 1x1 layer's weights a row at a time) and the other
  // layers' pairs. In pieces, the largest first, that this thread and a second one take from one counter when the
  // chain is large: a large layer in two halves of its output runs. Each piece is computed as one thread alone
  // computes it, so the figures do not depend on the threads.
  void readLayers(bool concurrent) {
    std::vector<ReadPiece> pieces;
    std::int64_t total = 0;
    if (byChannel) {
      pieces.push_back({kFirstEnd, 0, shapes.front().count, 0, 0});
      pieces.push_back({kLastEnd, 0, shapes.back().count, 0, 0});
    }
    for (std::size_t k = 0; k < layers.size(); ++k) {
      if (!pairsBuilt[k]) continue;
      const LayerShape& shape = shapes[k];
      const std::size_t runs = pairs[k].runs();
      const std::int64_t half = shape.count / shape.out.inner / 2 * shape.out.inner;  // on an output run's boundary
      if (concurrent && half >= kElementsWorthAThread) {
        const std::size_t firstHalfRuns = channelPairCount(shape, 0, half);
        pieces.push_back({k, 0, half, 0, firstHalfRuns});
        pieces.push_back({k, half, shape.count - half, firstHalfRuns, runs});
      } else {
        pieces.push_back({k, 0, shape.count, 0, runs});
      }
    }
    for (const ReadPiece& piece : pieces) total += piece.count;
    std::stable_sort(pieces.begin(), pieces.end(),
                     [](const ReadPiece& a, const ReadPiece& b) { return a.count > b.count; });
    std::atomic<std::size_t> nextPiece{0};
    auto read = [&] {
      try {
        for (std::size_t p = nextPiece++; p < pieces.size(); p = nextPiece++) {
          const ReadPiece& piece = pieces[p];
          if (piece.layer == kFirstEnd)
            firstByOutput.emplace(channelSummary(layers.front(), true));
          else if (piece.layer == kLastEnd)
            lastByInput.emplace(channelSummary(layers.back(), false));
          else
            fillPairs(layers[piece.layer], shapes[piece.layer], piece.first, piece.count, pairs[piece.layer], piece.r,
                      piece.end);
        }
      } catch (...) {
        nextPiece = pieces.size();  // the other thread stops after its piece
        throw;
      }
    };
    // A std::async future waits for its thread when destroyed, also when this thread throws.
    std::future<void> helper;
    if (concurrent && pieces.size() > 1 && total >= 2 * kElementsWorthAThread) helper = onSecondThread(read);
    read();
    if (helper.valid()) helper.get();
  }

  // The powers, gains and signal from the end layers' summaries and the middle layers' pairs. The signal is the
  // last layer's output power: each of its pairs' squares times its input's power, summed per input channel.
  void propagateFromEnds() {
    const std::size_t n = layers.size();
    power.resize(n);
    power[0].assign(shapes.front().inChannels, 1.0);
    power[1] = firstByOutput->squares;  // each pair's squares times the unit power of its input
    for (std::size_t k = 1; k + 1 < n; ++k) power[k + 1] = forwardPower(pairs[k], power[k]);
    for (std::size_t i = 0; i < lastByInput->squares.size(); ++i) signal += lastByInput->squares[i] * power[n - 1][i];
    gain.resize(n);
    gain[n - 1].assign(shapes.back().outChannels, 1.0);
    gain[n - 2] = lastByInput->squares;  // each pair's squares times the unit gain of its output
    for (std::size_t k = n - 2; k > 0; --k) gain[k - 1] = backwardGain(k);
    propagated = true;
  }

  // gain[k - 1][i] = sum over layer k's pairs (o, i), in order, of their sum of squares times gain[k][o].
  std::vector<double> backwardGain(std::size_t k) const {
    const LayerPairs& runs = pairs[k];
    std::vector<double> in(power[k].size(), 0.0);
    for (std::size_t r = 0; r < runs.runs(); ++r) in[runs.in[r]] += runs.squares[r] * gain[k][runs.out[r]];
    return in;
  }

  // The powers, gains and signal (from each channel pair's sum of squares); only the noise needs them.
  void propagate() const {
    if (propagated) return;
    propagated = true;
    const std::size_t n = layers.size();
    power.resize(n);
    power[0].assign(pairs[0].inChannels, 1.0);
    for (std::size_t k = 0; k < n; ++k) {
      std::vector<double> out = forwardPower(pairs[k], power[k]);
      if (k + 1 < n)
        power[k + 1] = std::move(out);
      else
        for (double p : out) signal += p;
    }
    gain.resize(n);
    gain[n - 1].assign(pairs[n - 1].outChannels, 1.0);
    for (std::size_t k = n - 1; k > 0; --k) gain[k - 1] = backwardGain(k);
    if (measure == NoiseMeasure::Estimated) {
      firstByOutput.emplace(pairs.front(), true);
      lastByInput.emplace(pairs.back(), false);
    }
  }

  // Layer k's noise with its output channels divided by `outScale` and input channels multiplied by `inScale`
  // (null: 1), relative to the chain's signal; remembered per distinct pair of scales.
  double layerNoise(std::size_t k, const std::vector<double>* inScale, const std::vector<double>* outScale) const {
    static const std::vector<double> kNone;
    const std::vector<double>& in = inScale ? *inScale : kNone;
    const std::vector<double>& out = outScale ? *outScale : kNone;
    {
      const std::lock_guard<std::mutex> lock(rememberedMutex);
      for (const Remembered& entry : remembered[k])
        if (entry.in == in && entry.out == out) return entry.noise;
    }
    propagate();
    const double noise = signal > 0.0 ? (measure == NoiseMeasure::Exact ? exactLayerNoise(k, inScale, outScale)
                                                                        : estimatedLayerNoise(k, inScale, outScale)) /
                                            signal
                                      : 0.0;
    // Two threads may compute the same noise at once: the same value, remembered twice.
    const std::lock_guard<std::mutex> lock(rememberedMutex);
    remembered[k].push_back({in, out, noise});
    return noise;
  }

  // Whether choosing the scales is worth a second thread: the chain's middle layers have this many pairs.
  bool worthAThread() const {
    std::size_t middlePairs = 0;
    for (std::size_t k = 1; k + 1 < pairs.size(); ++k) middlePairs += pairs[k].runs();
    return middlePairs >= kPairsWorthAThread;
  }
  static constexpr std::size_t kPairsWorthAThread = std::size_t{1} << 15;

  // Builds what layerNoise would build on first use, so that two threads may then ask for noises at once (only
  // `remembered` changes after this, under its mutex).
  void prepareConcurrentNoise() const { propagate(); }

  // Every weight rounded as the definition says.
  double exactLayerNoise(std::size_t k, const std::vector<double>* inScale, const std::vector<double>* outScale) const {
    const LayerPairs& runs = pairs[k];
    auto factor = [&](std::size_t r) {
      return (inScale ? (*inScale)[runs.in[r]] : 1.0) / (outScale ? (*outScale)[runs.out[r]] : 1.0);
    };
    double largest = 0.0;
    for (std::size_t r = 0; r < runs.runs(); ++r) largest = std::max(largest, std::abs(runs.largest[r] * factor(r)));
    if (largest == 0.0 || !std::isfinite(largest)) return 0.0;
    const double step = largest / 127.0;
    const std::vector<double>& weights = layers[k].weights;
    double noise = 0.0;
    for (std::size_t r = 0; r < runs.runs(); ++r) {
      const double f = factor(r);
      const double g = gain[k][runs.out[r]];
      const double p = power[k][runs.in[r]];
      for (auto e = static_cast<std::size_t>(runs.start[r]); e < static_cast<std::size_t>(runs.start[r + 1]); ++e) {
        // The element's error in the scaled coordinates, carried back to the given ones (times 1 / factor) where
        // the powers and gains are.
        const double scaled = weights[e] * f;
        const double error = (scaled - int8Rounded(scaled, step)) / f;
        noise += error * error * g * p;
      }
    }
    return noise;
  }

  // The same estimated per group of weights that share one factor (groupRoundingNoise): per channel pair, per
  // output channel of the first layer (whose input channels all have unit power), per input channel of the last
  // (whose output channels all have unit gain). In the given coordinates a group scaled by f has the half step
  // largest / (254 f).
  double estimatedLayerNoise(std::size_t k, const std::vector<double>* inScale,
                             const std::vector<double>* outScale) const {
    if (k == 0 || k + 1 == layers.size()) {
      const bool first = k == 0;
      const ChannelGroups& groups = first ? *firstByOutput : *lastByInput;
      const std::vector<double>* scale = first ? outScale : inScale;
      const std::vector<double>& weight = first ? gain[k] : power[k];
      auto factor = [&](std::size_t c) { return scale ? (first ? 1.0 / (*scale)[c] : (*scale)[c]) : 1.0; };
      double largest = 0.0;
      for (std::size_t c = 0; c < groups.largest.size(); ++c) largest = std::max(largest, groups.largest[c] * factor(c));
      if (largest == 0.0 || !std::isfinite(largest)) return 0.0;
      const double halfStep = largest / 254.0;
      double noise = 0.0;
      for (std::size_t c = 0; c < groups.largest.size(); ++c)
        noise += weight[c] * groupRoundingNoise(groups.largest[c], groups.count[c], groups.squares[c],
                                                halfStep / factor(c));
      return noise;
    }
    // Per pair r: factor = a[in] / b[out] (a: inScale, b: outScale), half step h = H / factor with H the half step
    // of the rescaled layer, and the term gain[out] * power[in] * groupRoundingNoise(largest, count, squares, h).
    // Products with per-channel reciprocals instead of a division per pair; a grid's rows summed with their
    // inputs' powers and then times their gain, in four sums so that pairs do not wait on each other.
    const LayerPairs& runs = pairs[k];
    const std::size_t outs = runs.outChannels, ins = runs.inChannels;
    std::vector<double> scratch(2 * (outs + ins) + outs, 1.0);  // and the grid path's output ranges
    double* const inScaleOf = scratch.data();
    double* const inverseInScale = inScaleOf + ins;
    double* const outScaleOf = inverseInScale + ins;
    double* const inverseOutScale = outScaleOf + outs;
    if (inScale)
      for (std::size_t i = 0; i < ins; ++i) {
        inScaleOf[i] = (*inScale)[i];
        inverseInScale[i] = 1.0 / inScaleOf[i];
      }
    if (outScale)
      for (std::size_t o = 0; o < outs; ++o) {
        outScaleOf[o] = (*outScale)[o];
        inverseOutScale[o] = 1.0 / outScaleOf[o];
      }
    const std::size_t count = runs.runs();
    const double* const pairLargest = runs.largest.data();
    double largest = 0.0;
    if (runs.grid) {
      double* const outRanges = inverseOutScale + outs;
      gridChannelRanges(pairLargest, outs, ins, inverseOutScale, inScaleOf, true, outRanges);
      for (std::size_t o = 0; o < outs; ++o) largest = largest < outRanges[o] ? outRanges[o] : largest;
    } else {
      for (std::size_t r = 0; r < count; ++r) {
        const double scaled = pairLargest[r] * (inScaleOf[runs.in[r]] * inverseOutScale[runs.out[r]]);
        largest = largest < scaled ? scaled : largest;
      }
    }
    if (largest == 0.0 || !std::isfinite(largest)) return 0.0;
    const double halfStep = largest / 254.0;
    const double* const squares = runs.squares.data();
    const double* const inPower = power[k].data();
    const double* const outGain = gain[k].data();
    // groupRoundingNoise with the pair's count / 3 given
    auto term = [&](std::size_t r, double pairHalfStep, double third) {
      const double spread = std::min(squares[r], third * pairHalfStep * pairHalfStep);
      return pairLargest[r] < pairHalfStep ? squares[r] : spread;
    };
    double sums[4] = {0.0, 0.0, 0.0, 0.0};
    if (runs.grid && runs.runLength > 0) {
      const double third = static_cast<double>(runs.runLength) / 3.0;
      for (std::size_t o = 0, r = 0; o < outs; ++o) {
        const double outHalfStep = halfStep * outScaleOf[o];
        double row[4] = {0.0, 0.0, 0.0, 0.0};
        std::size_t i = 0;
        for (; i + 4 <= ins; i += 4, r += 4)
          for (std::size_t lane = 0; lane < 4; ++lane)
            row[lane] += inPower[i + lane] * term(r + lane, outHalfStep * inverseInScale[i + lane], third);
        for (; i < ins; ++i, ++r) row[0] += inPower[i] * term(r, outHalfStep * inverseInScale[i], third);
        sums[o % 4] += outGain[o] * ((row[0] + row[1]) + (row[2] + row[3]));
      }
    } else {
      for (std::size_t r = 0; r < count; ++r) {
        const std::size_t out = runs.out[r], in = runs.in[r];
        const double third = static_cast<double>(runs.start[r + 1] - runs.start[r]) / 3.0;
        sums[r % 4] += outGain[out] * inPower[in] * term(r, halfStep * outScaleOf[out] * inverseInScale[in], third);
      }
    }
    return (sums[0] + sums[1]) + (sums[2] + sums[3]);
  }

  double layerNoise(std::size_t k, const std::vector<std::vector<double>>& scales) const {
    return layerNoise(k, k > 0 ? &scales[k - 1] : nullptr, k + 1 < layers.size() ? &scales[k] : nullptr);
  }

  struct Remembered {
    std::vector<double> in, out;
    double noise;
  };

  const std::vector<ChainLayer>& layers;
  NoiseMeasure measure;
  // The estimate of a chain keeps its first and last layers as channel summaries (firstByOutput, lastByInput),
  // their pairs only when asked for the side no link scales.
  bool byChannel;
  std::vector<LayerShape> shapes;
  mutable std::vector<LayerPairs> pairs;
  mutable std::vector<bool> pairsBuilt;
  mutable bool propagated = false;
  mutable std::vector<std::vector<double>> power, gain;
  mutable std::optional<ChannelGroups> firstByOutput, lastByInput;
  mutable double signal = 0.0;
  mutable std::vector<std::vector<Remembered>> remembered;
  mutable std::mutex rememberedMutex;
};

ChainNoise::ChainNoise(const std::vector<ChainLayer>& layers, NoiseMeasure measure, bool concurrent)
    : model_(std::make_unique<Model>(layers, measure, concurrent)) {}
ChainNoise::~ChainNoise() = default;

double ChainNoise::layer(std::size_t k, const std::vector<std::vector<double>>& scales) const {
  if (scales.size() + 1 != model_->layers.size())
    throw std::invalid_argument("chainInt8Noise: one scale vector per link needed");
  return model_->layerNoise(k, scales);
}

std::vector<double> ChainNoise::perLayer(const std::vector<std::vector<double>>& scales) const {
  std::vector<double> noise;
  for (std::size_t k = 0; k < model_->layers.size(); ++k) noise.push_back(layer(k, scales));
  return noise;
}

namespace {

// A rescaled layer's channel ranges from its pairs' maxima, multiplied as equalizedWeights multiplies the weights
// (by the output channel's inverse, then by the input channel's scale), so that each equals the largest rescaled
// weight to the last bit.
std::vector<double> rescaledRanges(const ChainNoise::Model& model, std::size_t k,
                                   const std::vector<std::vector<double>>& scales, bool byOutput) {
  if (scales.size() + 1 != model.layers.size())
    throw std::invalid_argument("equalize: one scale vector per link needed");
  const bool last = k + 1 == model.layers.size();
  const std::vector<double> outputInverse = last ? std::vector<double>() : inverse(scales[k]);
  if (model.byChannel && ((k == 0 && byOutput) || (last && !byOutput))) {
    // A channel's largest times a positive factor, rounded, is the largest of its pairs' rescaled maxima.
    std::vector<double> ranges = k == 0 ? model.firstByOutput->largest : model.lastByInput->largest;
    for (std::size_t c = 0; c < ranges.size(); ++c) ranges[c] *= k == 0 ? outputInverse[c] : scales[k - 1][c];
    return ranges;
  }
  const LayerPairs& runs = model.fullPairs(k);
  return pairChannelRanges(runs, runs.largest, last ? nullptr : outputInverse.data(),
                           k > 0 ? scales[k - 1].data() : nullptr, byOutput);
}

}  // namespace

std::vector<double> ChainNoise::outputRanges(std::size_t k, const std::vector<std::vector<double>>& scales) const {
  return rescaledRanges(*model_, k, scales, true);
}

std::vector<double> ChainNoise::inputRanges(std::size_t k, const std::vector<std::vector<double>>& scales) const {
  return rescaledRanges(*model_, k, scales, false);
}

namespace {

using NoiseModel = ChainNoise::Model;

// A layer's channel ranges as a sweep rescales it. A side no link scales keeps its ranges, and the ranges of the
// other side then follow each rescaling channel by channel (the largest of a channel times its factor); a layer
// scaled on both sides keeps its runs' largest values, rescaled in the same order as the weights would be, and
// takes both sides' ranges from them in the same pass.
class SweptLayer {
 public:
  SweptLayer(const LayerPairs& pairs, bool inputScaled, bool outputScaled)
      : pairs_(pairs), bothScaled_(inputScaled && outputScaled) {
    if (bothScaled_) largest_ = pairs.largest;
    outRanges_ = pairChannelRanges(pairs, pairs.largest, nullptr, nullptr, true);
    inRanges_ = pairChannelRanges(pairs, pairs.largest, nullptr, nullptr, false);
  }

  // A layer scaled on one side, given as that side's channel ranges (the other side left empty).
  SweptLayer(const LayerPairs& pairs, std::vector<double> outRanges, std::vector<double> inRanges)
      : pairs_(pairs), bothScaled_(false), outRanges_(std::move(outRanges)), inRanges_(std::move(inRanges)) {}

  // Asked only for a side a link scales.
  const std::vector<double>& outputRanges() const { return outRanges_; }
  const std::vector<double>& inputRanges() const { return inRanges_; }

  void scaleOutputs(const std::vector<double>& factor) { scale(factor, true); }
  void scaleInputs(const std::vector<double>& factor) { scale(factor, false); }

 private:
  // The scaled side's ranges follow channel by channel (a positive factor keeps each channel's largest its
  // largest, and rounding is monotone); the pairs' maxima are rescaled, and the other side's ranges taken from
  // them, in one pass.
  void scale(const std::vector<double>& factor, bool outputs) {
    std::vector<double>& scaledSide = outputs ? outRanges_ : inRanges_;
    bool positive = true;
    for (std::size_t c = 0; c < scaledSide.size(); ++c) {
      positive = positive && factor[c] > 0.0 && std::isfinite(factor[c]);
      scaledSide[c] *= factor[c];
    }
    if (!bothScaled_) return;
    const std::size_t ins = pairs_.inChannels;
    if (pairs_.grid && ins > 0) {
      const auto columns = static_cast<Eigen::Index>(ins);
      double* largest = largest_.data();
      if (outputs) {
        MutableArray inRanges(inRanges_.data(), columns);
        inRanges.setZero();
        for (std::size_t o = 0; o < pairs_.outChannels; ++o, largest += ins) {
          MutableArray row(largest, columns);
          row *= factor[o];
          inRanges = inRanges.max(row);
        }
      } else {
        const ConstArray inFactor(factor.data(), columns);
        for (std::size_t o = 0; o < pairs_.outChannels; ++o, largest += ins) {
          MutableArray row(largest, columns);
          row *= inFactor;
          outRanges_[o] = std::max(0.0, row.maxCoeff());
        }
      }
    } else {
      const std::vector<std::size_t>& channel = outputs ? pairs_.out : pairs_.in;
      for (std::size_t r = 0; r < largest_.size(); ++r) largest_[r] *= factor[channel[r]];
      (outputs ? inRanges_ : outRanges_) = runChannelRanges(pairs_, largest_, nullptr, nullptr, !outputs);
    }
    // A zero, infinite or NaN factor breaks the channel-by-channel rule: that side from the pairs too.
    if (!positive) scaledSide = runChannelRanges(pairs_, largest_, nullptr, nullptr, outputs);
  }

  const LayerPairs& pairs_;
  bool bothScaled_;
  std::vector<double> largest_, outRanges_, inRanges_;
};

std::vector<SweptLayer> sweptLayers(const NoiseModel& model, const std::vector<bool>& active) {
  std::vector<SweptLayer> layers;
  const std::size_t links = active.size();
  const std::size_t n = model.pairs.size();
  for (std::size_t k = 0; k < n; ++k) {
    if (model.byChannel && k == 0)
      layers.emplace_back(model.pairs[k], model.firstByOutput->largest, std::vector<double>());
    else if (model.byChannel && k + 1 == n)
      layers.emplace_back(model.pairs[k], std::vector<double>(), model.lastByInput->largest);
    else
      layers.emplace_back(model.pairs[k], k > 0 && active[k - 1], k < links && active[k]);
  }
  return layers;
}

struct SweepResult {
  std::vector<std::vector<double>> scales;
  std::size_t sweeps = 0;
  bool converged = false;
};

SweepResult sweep(const NoiseModel& model, const std::vector<bool>& active, const EqualizeSettings& settings) {
  const std::size_t links = active.size();
  std::vector<SweptLayer> work = sweptLayers(model, active);
  SweepResult result;
  for (std::size_t k = 0; k < links; ++k) result.scales.emplace_back(model.pairs[k].outChannels, 1.0);
  while (result.sweeps < settings.maxSweeps) {
    ++result.sweeps;
    double largestStep = 0.0;
    for (std::size_t k = 0; k < links; ++k) {
      if (!active[k]) continue;
      const auto s = pairScales(work[k].outputRanges(), work[k + 1].inputRanges());
      work[k].scaleOutputs(inverse(s));
      work[k + 1].scaleInputs(s);
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

bool isDepthwise(const ChainLayer& layer) {
  if (layer.layout.kind != WeightKind::Conv || layer.layout.group <= 1) return false;
  return inputChannelCount(layer.layout, layer.dims) == layer.layout.group &&
         outputChannelCount(layer.layout, layer.dims) == layer.layout.group;
}

bool isDense(const ChainLayer& layer) {
  const bool grouped = layer.layout.kind == WeightKind::Conv || layer.layout.kind == WeightKind::ConvTranspose;
  return !grouped || layer.layout.group == 1;
}

// AIMET's one pass on the layers' ranges (as the sweep's): dense -> depthwise -> dense as a triple in closed form,
// other candidate links as pairs, each once, in chain order.
std::vector<std::vector<double>> aimetOnePassScales(const NoiseModel& model, const std::vector<bool>& active,
                                                    std::vector<std::vector<double>> scales) {
  const std::vector<ChainLayer>& layers = model.layers;
  std::vector<SweptLayer> work = sweptLayers(model, active);
  auto apply = [&](std::size_t k, const std::vector<double>& s) {
    work[k].scaleOutputs(inverse(s));
    work[k + 1].scaleInputs(s);
    for (std::size_t i = 0; i < s.size(); ++i) scales[k][i] *= s[i];
  };
  const std::size_t links = layers.size() - 1;
  for (std::size_t k = 0; k < links; ++k) {
    if (!active[k]) continue;
    if (k + 1 < links && active[k + 1] && isDense(layers[k]) && isDepthwise(layers[k + 1]) &&
        isDense(layers[k + 2])) {
      const auto r1 = work[k].outputRanges();
      const auto r2 = work[k + 1].outputRanges();
      const auto r3 = work[k + 2].inputRanges();
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
    apply(k, pairScales(work[k].outputRanges(), work[k + 1].inputRanges()));
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
PoweredScales choosePowers(const NoiseModel& model, const std::vector<std::vector<double>>& full,
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

}  // namespace

ChannelSummary channelSummary(const ChainLayer& layer, bool byOutput) {
  const LayerShape shape = layerShape(layer);
  const ChannelIndexing& indexing = byOutput ? shape.out : shape.in;
  const std::size_t channels = byOutput ? shape.outChannels : shape.inChannels;
  ChannelGroups groups(channels);
  WeightStream stream(layer, shape.count);
  // Rows of one element per channel (a dense layer's input side): a loop over the row, no run per element.
  const bool rows = indexing.inner == 1 && static_cast<std::size_t>(indexing.perGroup) == channels;
  const std::int64_t piece =
      rows ? std::max<std::int64_t>(indexing.perGroup, 8192 / indexing.perGroup * indexing.perGroup) : 8192;
  for (std::int64_t first = 0; first < shape.count; first += piece) {
    const std::int64_t count = std::min(piece, shape.count - first);
    const double* weights = stream.span(first, count);
    if (rows) {
      for (std::int64_t row = 0; row < count; row += indexing.perGroup)
        for (std::size_t c = 0; c < channels; ++c) {
          const double w = weights[row + static_cast<std::int64_t>(c)];
          const double magnitude = std::abs(w);
          groups.largest[c] = groups.largest[c] < magnitude ? magnitude : groups.largest[c];
          groups.squares[c] += w * w;
        }
      continue;
    }
    ChannelRuns runs(indexing, first, count);
    std::int64_t offset = 0, length = 0, channel = 0;
    while (runs.next(offset, length, channel)) {
      double largest = 0.0, squares = 0.0;
      for (std::int64_t e = offset; e < offset + length; ++e) {
        const double magnitude = std::abs(weights[e]);
        largest = largest < magnitude ? magnitude : largest;
        squares += weights[e] * weights[e];
      }
      groups.add(static_cast<std::size_t>(channel), length, largest, squares);
    }
  }
  if (rows) std::fill(groups.count.begin(), groups.count.end(), static_cast<double>(shape.count / indexing.perGroup));
  return {std::move(groups.largest), std::move(groups.count), std::move(groups.squares)};
}

double estimatedChannelRelativeInt8Error(const ChannelSummary& summary, const std::vector<double>& factor) {
  const std::size_t channels = summary.largest.size();
  auto factorOf = [&](std::size_t c) { return factor.empty() ? 1.0 : factor[c]; };
  double largest = 0.0;
  for (std::size_t c = 0; c < channels; ++c) largest = std::max(largest, summary.largest[c] * factorOf(c));
  if (largest == 0.0 || !std::isfinite(largest)) return 0.0;
  const double halfStep = largest / 254.0;  // in the scaled coordinates; channel c's own is halfStep / factor
  double sum = 0.0;
  std::size_t counted = 0;
  for (std::size_t c = 0; c < channels; ++c) {
    if (!(summary.squares[c] > 0.0)) continue;
    sum += groupRoundingNoise(summary.largest[c], summary.count[c], summary.squares[c], halfStep / factorOf(c)) /
           summary.squares[c];
    ++counted;
  }
  return counted ? sum / static_cast<double>(counted) : 0.0;
}

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
    const double q = int8Rounded(w, step);
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
                        const double q = int8Rounded(w, step);
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
  const ChainLayer& layer = layers.at(k);
  std::vector<double> weights = layer.weights;
  if (layer.read) {
    weights.resize(elementCountOf(layer));
    layer.read(0, static_cast<std::int64_t>(weights.size()), weights.data());
  }
  if (k + 1 < layers.size()) scaleOutputChannels(layers[k].layout, weights, layers[k].dims, inverse(scales.at(k)));
  if (k > 0) scaleInputChannels(layers[k].layout, weights, layers[k].dims, scales.at(k - 1));
  return weights;
}

std::vector<double> chainInt8Noise(const std::vector<ChainLayer>& layers,
                                   const std::vector<std::vector<double>>& scales) {
  return ChainNoise(layers, NoiseMeasure::Exact).perLayer(scales);
}

std::vector<double> estimatedChainInt8Noise(const std::vector<ChainLayer>& layers,
                                            const std::vector<std::vector<double>>& scales) {
  return ChainNoise(layers, NoiseMeasure::Estimated).perLayer(scales);
}

ChainScales equalizeChain(const std::vector<ChainLayer>& layers, const std::vector<bool>& candidate,
                          const EqualizeSettings& settings) {
  if (layers.size() < 2 || candidate.size() != layers.size() - 1)
    throw std::invalid_argument("equalizeChain: a chain needs two layers or more and one flag per link");
  return equalizeChain(ChainNoise(layers, settings.noise, settings.concurrent), candidate, settings);
}

ChainScales equalizeChain(const ChainNoise& noise, const std::vector<bool>& candidate,
                          const EqualizeSettings& settings) {
  const NoiseModel& model = noise.model();
  const std::vector<ChainLayer>& layers = model.layers;
  if (layers.size() < 2 || candidate.size() != layers.size() - 1)
    throw std::invalid_argument("equalizeChain: a chain needs two layers or more and one flag per link");
  const std::size_t links = candidate.size();
  std::vector<std::vector<double>> identity;
  for (std::size_t k = 0; k < links; ++k) identity.emplace_back(model.pairs[k].outChannels, 1.0);
  if (!settings.keepOnlyImproving) {
    SweepResult swept = sweep(model, candidate, settings);
    ChainScales result;
    result.sweeps = swept.sweeps;
    result.converged = swept.converged;
    result.kept = candidate;
    result.proposed = swept.scales;
    result.scales = std::move(swept.scales);
    result.power.assign(links, 0.0);
    for (std::size_t k = 0; k < links; ++k)
      if (candidate[k]) result.power[k] = 1.0;
    return result;
  }
  // The sweep and its powers on a second thread while this one takes AIMET's scales and theirs (the future waits
  // when destroyed, also when this thread throws).
  struct SweepChoice {
    SweepResult swept;
    PoweredScales powered;
  };
  auto chooseSweep = [&model, &candidate, &settings] {
    SweepChoice choice;
    choice.swept = sweep(model, candidate, settings);
    choice.powered = choosePowers(model, choice.swept.scales, candidate);
    return choice;
  };
  std::future<SweepChoice> sweepLater;
  if (settings.concurrent && model.worthAThread()) {
    model.prepareConcurrentNoise();
    sweepLater = onSecondThread(chooseSweep);
  }
  ChainScales result;
  for (std::size_t k = 0; k < layers.size(); ++k) result.noiseBefore += model.layerNoise(k, identity);
  const std::vector<std::vector<double>> aimet = aimetOnePassScales(model, candidate, identity);
  PoweredScales byAimet = choosePowers(model, aimet, candidate);
  SweepChoice sweepChoice = sweepLater.valid() ? sweepLater.get() : chooseSweep();
  SweepResult& swept = sweepChoice.swept;
  PoweredScales& bySweep = sweepChoice.powered;
  result.sweeps = swept.sweeps;
  result.converged = swept.converged;
  // Lower by more than rounding: on a pair both methods give sqrt(r1 / r2), up to the sweep's last bits.
  const bool aimetWins = byAimet.noise < bySweep.noise * (1.0 - 1e-12);
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
