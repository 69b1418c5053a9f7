// Folding math on double vectors. Weight scaling walks the weight in runs of elements that share a channel
// (forEachChannelRun), the same walk the streamed weights of lib/rules/scaled_weight.cpp use, so the two agree
// by construction.
#include "kernels/fold_math.h"

#include "bnfold/dims_text.h"

#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace bnfold::kernels {
namespace {

using ConstVectorView = Eigen::Map<const Eigen::VectorXd, Eigen::Unaligned>;

[[noreturn]] void fail(const char* function, const std::string& problem) {
  throw std::invalid_argument(std::string(function) + ": " + problem);
}

/// Product of dims, or nullopt for a negative dim or an overflow of size_t.
std::optional<std::size_t> elementCount(const Dims& dims) {
  std::size_t count = 1;
  for (std::int64_t d : dims) {
    if (d < 0) return std::nullopt;
    const auto extent = static_cast<std::size_t>(d);
    if (extent != 0 && count > std::numeric_limits<std::size_t>::max() / extent) return std::nullopt;
    count *= extent;
  }
  return count;
}

void requireSameLength(const char* function, std::size_t expected, std::size_t actual, const char* what) {
  if (expected != actual) {
    fail(function, std::string(what) + " has " + std::to_string(actual) + " entries, expected " +
                       std::to_string(expected));
  }
}

/// Checks that dims fit the layout and the data, and that the channel count matches scale.
void requireScalable(const char* function, std::optional<std::int64_t> channels, const WeightLayout& layout,
                     const std::vector<double>& weights, const Dims& dims, const std::vector<double>& scale) {
  if (!channels) {
    fail(function, "weight dims " + formatDims(dims) + " do not fit the layout (group " +
                       std::to_string(layout.group) + ")");
  }
  const auto count = elementCount(dims);
  if (!count || *count != weights.size()) {
    fail(function, "weight dims " + formatDims(dims) + " do not match the " + std::to_string(weights.size()) +
                       " weight values");
  }
  requireSameLength(function, static_cast<std::size_t>(*channels), scale.size(), "scale");
}

/// Multiplies each weight by the scale of its channel.
void scaleByChannel(std::vector<double>& weights, const ChannelIndexing& indexing, const std::vector<double>& scale) {
  forEachChannelRun(indexing, 0, static_cast<std::int64_t>(weights.size()),
                    [&](std::int64_t offset, std::int64_t length, std::int64_t channel) {
                      const double factor = scale[static_cast<std::size_t>(channel)];
                      for (std::int64_t i = offset; i < offset + length; ++i) weights[static_cast<std::size_t>(i)] *= factor;
                    });
}

/// Product of dims[from, to).
std::int64_t dimsProduct(const Dims& dims, std::size_t from, std::size_t to) {
  std::int64_t product = 1;
  for (std::size_t i = from; i < to; ++i) product *= dims[i];
  return product;
}

constexpr std::int64_t kUngrouped = std::numeric_limits<std::int64_t>::max();

/// Rows of a [rows, inner...] weight: channel = index on axis 0.
ChannelIndexing rowsIndexing(const Dims& dims) {
  return {std::max<std::int64_t>(dimsProduct(dims, 1, dims.size()), 1), std::max<std::int64_t>(dims[0], 1), kUngrouped};
}
/// Columns of a [rows, columns] weight: channel = index on axis 1.
ChannelIndexing columnsIndexing(const Dims& dims) { return {1, std::max<std::int64_t>(dims[1], 1), kUngrouped}; }
/// Axis 1 of a [A, B, k...] weight whose axis 0 is split into `group` blocks (ConvTranspose's output channels,
/// Conv's input channels): channel = group of the row * B + index on axis 1.
ChannelIndexing groupedAxis1Indexing(const Dims& dims, std::int64_t group) {
  return {std::max<std::int64_t>(dimsProduct(dims, 2, dims.size()), 1), std::max<std::int64_t>(dims[1], 1),
          std::max<std::int64_t>(dims[0] / group, 1)};
}

bool isConvLike(const WeightLayout& layout) {
  return layout.kind == WeightKind::Conv || layout.kind == WeightKind::ConvTranspose;
}

/// Common dims checks; returns false when the dims cannot belong to the layout.
bool dimsFitLayout(const WeightLayout& layout, const Dims& dims) {
  if (!elementCount(dims)) return false;
  if (isConvLike(layout)) {
    // axis 0 is split into `group` equal blocks in both Conv (M) and ConvTranspose (C).
    return dims.size() >= 3 && layout.group >= 1 && dims[0] % layout.group == 0;
  }
  return dims.size() == 2;
}

}  // namespace

ChannelAffine batchNormAsAffine(const std::vector<double>& gamma, const std::vector<double>& beta,
                                const std::vector<double>& mean, const std::vector<double>& var, double epsilon) {
  const std::size_t channels = gamma.size();
  requireSameLength("batchNormAsAffine", channels, beta.size(), "beta");
  requireSameLength("batchNormAsAffine", channels, mean.size(), "mean");
  requireSameLength("batchNormAsAffine", channels, var.size(), "var");
  ChannelAffine affine;
  affine.scale.resize(channels);
  affine.shift.resize(channels);
  for (std::size_t c = 0; c < channels; ++c) {
    affine.scale[c] = gamma[c] / std::sqrt(var[c] + epsilon);
    affine.shift[c] = beta[c] - mean[c] * affine.scale[c];
  }
  return affine;
}

std::optional<std::size_t> findNonPositiveVariance(const std::vector<double>& var, double epsilon) {
  for (std::size_t c = 0; c < var.size(); ++c) {
    const double denominator = var[c] + epsilon;
    // Written so that NaN fails too.
    if (!(denominator > 0.0 && std::isfinite(denominator))) return c;
  }
  return std::nullopt;
}

std::optional<std::int64_t> outputChannelCount(const WeightLayout& layout, const Dims& dims) {
  if (!dimsFitLayout(layout, dims)) return std::nullopt;
  switch (layout.kind) {
    case WeightKind::Conv: return dims[0];
    case WeightKind::ConvTranspose: return dims[1] * layout.group;
    case WeightKind::Gemm: return layout.transB ? dims[0] : dims[1];
    case WeightKind::MatMul: return dims[1];
  }
  return std::nullopt;
}

std::optional<std::int64_t> inputChannelCount(const WeightLayout& layout, const Dims& dims) {
  if (!dimsFitLayout(layout, dims)) return std::nullopt;
  switch (layout.kind) {
    case WeightKind::Conv: return dims[1] * layout.group;
    case WeightKind::ConvTranspose: return dims[0];
    case WeightKind::Gemm: return layout.transB ? dims[1] : dims[0];
    case WeightKind::MatMul: return dims[0];
  }
  return std::nullopt;
}

std::optional<ChannelIndexing> outputChannelIndexing(const WeightLayout& layout, const Dims& dims) {
  if (!dimsFitLayout(layout, dims)) return std::nullopt;
  switch (layout.kind) {
    case WeightKind::Conv: return rowsIndexing(dims);
    case WeightKind::ConvTranspose: return groupedAxis1Indexing(dims, layout.group);
    case WeightKind::Gemm: return layout.transB ? rowsIndexing(dims) : columnsIndexing(dims);
    case WeightKind::MatMul: return columnsIndexing(dims);
  }
  return std::nullopt;
}

std::optional<ChannelIndexing> inputChannelIndexing(const WeightLayout& layout, const Dims& dims) {
  if (!dimsFitLayout(layout, dims)) return std::nullopt;
  switch (layout.kind) {
    case WeightKind::Conv: return groupedAxis1Indexing(dims, layout.group);
    case WeightKind::ConvTranspose: return rowsIndexing(dims);
    case WeightKind::Gemm: return layout.transB ? columnsIndexing(dims) : rowsIndexing(dims);
    case WeightKind::MatMul: return rowsIndexing(dims);
  }
  return std::nullopt;
}

void scaleOutputChannels(const WeightLayout& layout, std::vector<double>& weights, const Dims& dims,
                         const std::vector<double>& scale) {
  requireScalable("scaleOutputChannels", outputChannelCount(layout, dims), layout, weights, dims, scale);
  scaleByChannel(weights, *outputChannelIndexing(layout, dims), scale);
}

void scaleInputChannels(const WeightLayout& layout, std::vector<double>& weights, const Dims& dims,
                        const std::vector<double>& scale) {
  requireScalable("scaleInputChannels", inputChannelCount(layout, dims), layout, weights, dims, scale);
  scaleByChannel(weights, *inputChannelIndexing(layout, dims), scale);
}

std::vector<double> foldBias(const ChannelAffine& affine) {
  requireSameLength("foldBias", affine.scale.size(), affine.shift.size(), "shift");
  return affine.shift;
}

std::vector<double> foldBias(const std::vector<double>& oldBias, const ChannelAffine& affine) {
  requireSameLength("foldBias", affine.scale.size(), affine.shift.size(), "shift");
  requireSameLength("foldBias", affine.scale.size(), oldBias.size(), "bias");
  std::vector<double> bias(oldBias.size());
  for (std::size_t c = 0; c < bias.size(); ++c) bias[c] = oldBias[c] * affine.scale[c] + affine.shift[c];
  return bias;
}

bool isGemmBiasShape(const Dims& cDims, std::int64_t columns) {
  if (cDims.size() > 2) return false;
  for (std::int64_t d : cDims) {
    if (d < 1) return false;
  }
  const std::int64_t cColumns = cDims.empty() ? 1 : cDims.back();
  return cColumns == 1 || cColumns == columns;
}

GemmBiasFold foldGemmBias(const ChannelAffine& affine) {
  return GemmBiasFold{foldBias(affine), Dims{static_cast<std::int64_t>(affine.shift.size())}, 1.0};
}

GemmBiasFold foldGemmBias(const std::vector<double>& c, const Dims& cDims, double beta,
                          const ChannelAffine& affine) {
  const char* const function = "foldGemmBias";
  requireSameLength(function, affine.scale.size(), affine.shift.size(), "shift");
  const auto columns = static_cast<std::int64_t>(affine.scale.size());
  if (!isGemmBiasShape(cDims, columns)) {
    fail(function, "C dims " + formatDims(cDims) + " do not broadcast to [M, " + std::to_string(columns) + "]");
  }
  const auto count = elementCount(cDims);
  if (!count || *count != c.size()) {
    fail(function, "C dims " + formatDims(cDims) + " do not match the " + std::to_string(c.size()) + " C values");
  }
  // beta == 0: C never contributed (the absent-C fold is exactly right).
  if (beta == 0.0) return foldGemmBias(affine);

  // Rows of C' are the rows of C (1 unless C is [M, 1] or [M, N]); columns always become N.
  const std::int64_t rows = cDims.size() == 2 ? cDims[0] : 1;
  const std::int64_t cColumns = cDims.empty() ? 1 : cDims.back();
  GemmBiasFold folded;
  folded.beta = 1.0;
  folded.dims = cDims.size() == 2 ? Dims{rows, columns} : Dims{columns};
  folded.values.resize(static_cast<std::size_t>(rows * columns));
  for (std::int64_t m = 0; m < rows; ++m) {
    for (std::int64_t n = 0; n < columns; ++n) {
      const double old = c[static_cast<std::size_t>(m * cColumns + (cColumns == 1 ? 0 : n))];
      folded.values[static_cast<std::size_t>(m * columns + n)] =
          beta * old * affine.scale[static_cast<std::size_t>(n)] + affine.shift[static_cast<std::size_t>(n)];
    }
  }
  return folded;
}

bool isPerChannelShape(std::int64_t outputRank, std::int64_t channelAxis, std::int64_t channels,
                       const Dims& constDims) {
  if (channelAxis < 0 || channelAxis >= outputRank) {
    fail("isPerChannelShape", "channel axis " + std::to_string(channelAxis) + " is outside an output of rank " +
                                  std::to_string(outputRank));
  }
  if (channels < 1) fail("isPerChannelShape", "channel count " + std::to_string(channels) + " is below 1");
  const auto constRank = static_cast<std::int64_t>(constDims.size());
  // A higher-rank constant would grow the output's rank: not a per-channel operation.
  if (constRank > outputRank) return false;
  const std::int64_t offset = outputRank - constRank;  // constant axis i lines up with output axis i + offset
  for (std::int64_t i = 0; i < constRank; ++i) {
    const std::int64_t d = constDims[static_cast<std::size_t>(i)];
    if (d == 1) continue;
    if (i + offset != channelAxis || d != channels) return false;
  }
  return true;
}

std::optional<std::vector<double>> perChannelValues(std::int64_t outputRank, std::int64_t channelAxis,
                                                    std::int64_t channels, const Dims& constDims,
                                                    const std::vector<double>& values) {
  const auto count = elementCount(constDims);
  if (!count || *count != values.size()) {
    fail("perChannelValues", "constant dims " + formatDims(constDims) + " do not match its " +
                                 std::to_string(values.size()) + " values");
  }
  if (!isPerChannelShape(outputRank, channelAxis, channels, constDims)) return std::nullopt;
  if (values.size() == 1) return std::vector<double>(static_cast<std::size_t>(channels), values[0]);
  return values;  // exactly `channels` values along the channel axis
}

BatchStatistics batchStatistics(const std::vector<double>& x, const Dims& dims) {
  const char* const function = "batchStatistics";
  if (dims.size() < 2) fail(function, "input dims " + formatDims(dims) + " have rank below 2");
  const auto count = elementCount(dims);
  if (!count || *count != x.size()) {
    fail(function, "input dims " + formatDims(dims) + " do not match the " + std::to_string(x.size()) + " values");
  }
  const auto batch = static_cast<std::size_t>(dims[0]);
  const auto channels = static_cast<std::size_t>(dims[1]);
  if (channels == 0) return {};
  if (batch == 0 || x.empty()) fail(function, "input dims " + formatDims(dims) + " give a channel no elements");
  const std::size_t inner = x.size() / (batch * channels);
  const auto perChannel = static_cast<double>(batch * inner);

  // Two passes (mean, then squared deviations) avoid the cancellation of E[x^2] - E[x]^2.
  BatchStatistics stats{std::vector<double>(channels, 0.0), std::vector<double>(channels, 0.0)};
  for (std::size_t n = 0; n < batch; ++n) {
    for (std::size_t c = 0; c < channels; ++c) {
      stats.mean[c] += ConstVectorView(x.data() + (n * channels + c) * inner, static_cast<Eigen::Index>(inner)).sum();
    }
  }
  for (double& m : stats.mean) m /= perChannel;
  for (std::size_t n = 0; n < batch; ++n) {
    for (std::size_t c = 0; c < channels; ++c) {
      const ConstVectorView slice(x.data() + (n * channels + c) * inner, static_cast<Eigen::Index>(inner));
      stats.variance[c] += (slice.array() - stats.mean[c]).square().sum();
    }
  }
  for (double& v : stats.variance) v /= perChannel;
  return stats;
}

std::vector<double> updateRunningStatistic(const std::vector<double>& running, const std::vector<double>& current,
                                           double momentum) {
  requireSameLength("updateRunningStatistic", running.size(), current.size(), "current statistic");
  std::vector<double> updated(running.size());
  for (std::size_t c = 0; c < updated.size(); ++c) {
    updated[c] = running[c] * momentum + current[c] * (1.0 - momentum);
  }
  return updated;
}

std::vector<double> applyChannelAffine(const std::vector<double>& x, const Dims& dims, const ChannelAffine& affine) {
  const char* const function = "applyChannelAffine";
  if (dims.size() < 2) fail(function, "input dims " + formatDims(dims) + " have rank below 2");
  const auto count = elementCount(dims);
  if (!count || *count != x.size()) {
    fail(function, "input dims " + formatDims(dims) + " do not match the " + std::to_string(x.size()) + " values");
  }
  const auto channels = static_cast<std::size_t>(dims[1]);
  requireSameLength(function, channels, affine.scale.size(), "scale");
  requireSameLength(function, channels, affine.shift.size(), "shift");
  std::vector<double> y(x.size());
  if (x.empty()) return y;
  const std::size_t inner = x.size() / (static_cast<std::size_t>(dims[0]) * channels);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t c = (i / inner) % channels;
    y[i] = x[i] * affine.scale[c] + affine.shift[c];
  }
  return y;
}

}  // namespace bnfold::kernels
