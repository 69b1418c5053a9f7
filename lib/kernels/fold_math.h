// Pure numeric kernels behind the folding rules: BatchNormalization as a per-channel affine map, scaling layer
// weights along their output or input channels, folding biases, and recognising per-channel constants.
//
// No IR or protobuf types here (see STYLE.md: the math is apart from graph surgery). Everything works in double
// precision; the IR layer converts tensors of any float type to double and rounds once when writing back.
// Weights are flat row-major vectors with their ONNX dims.
//
// Errors: the functions throw std::invalid_argument when their arguments do not fit together (dims vs. data
// size, channel counts). Rules must rule these cases out in `match` with the query functions below
// (outputChannelCount, inputChannelCount, isGemmBiasShape, isPerChannelShape, findNonPositiveVariance) so that
// `rewrite` never sees a throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace bnfold::kernels {

/// ONNX tensor dims (row-major, outermost first).
using Dims = std::vector<std::int64_t>;

/// y[c] = x[c] * scale[c] + shift[c] for every channel c.
struct ChannelAffine {
  std::vector<double> scale;
  std::vector<double> shift;
};

/// BatchNormalization in inference mode as an affine map per channel:
/// scale = gamma / sqrt(var + epsilon), shift = beta - mean * scale.
/// All four vectors must have the same length. Exact for gamma = 0 (scale 0, shift = beta). Does not check
/// var + epsilon > 0; use findNonPositiveVariance first.
ChannelAffine batchNormAsAffine(const std::vector<double>& gamma, const std::vector<double>& beta,
                                const std::vector<double>& mean, const std::vector<double>& var, double epsilon);

/// First channel whose var + epsilon is not a finite positive number (the fold would divide by zero or take the
/// root of a negative), or nullopt when every channel is fine.
std::optional<std::size_t> findNonPositiveVariance(const std::vector<double>& var, double epsilon);

/// Which ONNX weight layout a weight tensor has.
enum class WeightKind {
  Conv,           ///< Conv W `[M, C/group, k1, ..., kn]`, n >= 1: output channel on axis 0.
  ConvTranspose,  ///< ConvTranspose W `[C, M/group, k1, ..., kn]`: output channel on axis 1 within each group.
  Gemm,           ///< Gemm B: `[K, N]` when transB = 0, `[N, K]` when transB = 1.
  MatMul,         ///< 2-D MatMul right-hand operand `[K, N]`: output column on axis 1.
};

/// A weight layout plus the attributes that change where its channels live.
struct WeightLayout {
  WeightKind kind = WeightKind::Conv;
  std::int64_t group = 1;  ///< Conv / ConvTranspose `group` attribute; ignored otherwise.
  bool transB = false;     ///< Gemm `transB` attribute; ignored otherwise.
};

/// Number of output channels (M for Conv/ConvTranspose, N for Gemm/MatMul) of a weight with these dims, or
/// nullopt when the dims do not fit the layout (wrong rank, negative dims, group < 1 or not dividing the
/// grouped axis).
std::optional<std::int64_t> outputChannelCount(const WeightLayout& layout, const Dims& dims);

/// Number of input channels (C for Conv/ConvTranspose, K for Gemm/MatMul) of a weight with these dims, or nullopt
/// when the dims do not fit the layout.
std::optional<std::int64_t> inputChannelCount(const WeightLayout& layout, const Dims& dims);

/// Which channel each element of a flat weight belongs to. Element i lies in block q = i / inner; the block's
/// index within its group is q % perGroup, its group (q / perGroup) / rowsPerGroup, and its channel
/// group * perGroup + q % perGroup. One shape of formula covers rows, columns and grouped axes of every layout.
struct ChannelIndexing {
  std::int64_t inner = 1;         ///< consecutive elements sharing a channel (>= 1)
  std::int64_t perGroup = 1;      ///< channels per group (>= 1)
  std::int64_t rowsPerGroup = 1;  ///< blocks of perGroup channels in one group (>= 1)

  std::int64_t channel(std::int64_t element) const {
    const std::int64_t block = element / inner;
    return (block / perGroup / rowsPerGroup) * perGroup + block % perGroup;
  }
};

/// Which output channel (see scaleOutputChannels) each weight element feeds, or nullopt when dims do not fit
/// the layout.
std::optional<ChannelIndexing> outputChannelIndexing(const WeightLayout& layout, const Dims& dims);
/// Which input channel (see scaleInputChannels) each weight element reads, or nullopt when dims do not fit.
std::optional<ChannelIndexing> inputChannelIndexing(const WeightLayout& layout, const Dims& dims);

/// The consecutive runs of elements [first, first + count) that share a channel, one at a time, for a plain loop
/// (a lambda's captured sums can end up in memory, one store per element). One division on construction, none per
/// run.
class ChannelRuns {
 public:
  ChannelRuns(const ChannelIndexing& indexing, std::int64_t first, std::int64_t count)
      : indexing_(indexing), count_(count) {
    if (count <= 0) return;
    const std::int64_t block = first / indexing.inner;
    withinGroup_ = block % indexing.perGroup;
    const std::int64_t row = block / indexing.perGroup;
    rowInGroup_ = row % indexing.rowsPerGroup;
    group_ = row / indexing.rowsPerGroup;
    runLength_ = (block + 1) * indexing.inner - first;
  }

  /// The next run: offset relative to `first`, its length and channel; false after the last.
  bool next(std::int64_t& offset, std::int64_t& length, std::int64_t& channel) {
    if (done_ >= count_) return false;
    offset = done_;
    length = runLength_ < count_ - done_ ? runLength_ : count_ - done_;
    channel = group_ * indexing_.perGroup + withinGroup_;
    done_ += length;
    runLength_ = indexing_.inner;
    if (++withinGroup_ == indexing_.perGroup) {
      withinGroup_ = 0;
      if (++rowInGroup_ == indexing_.rowsPerGroup) {
        rowInGroup_ = 0;
        ++group_;
      }
    }
    return true;
  }

 private:
  const ChannelIndexing& indexing_;
  std::int64_t count_;
  std::int64_t done_ = 0, runLength_ = 0, withinGroup_ = 0, rowInGroup_ = 0, group_ = 0;
};

/// Calls run(offset, length, channel) for consecutive runs of elements [first, first + count) that share a
/// channel (ChannelRuns); offset is relative to `first`.
template <typename Run>
void forEachChannelRun(const ChannelIndexing& indexing, std::int64_t first, std::int64_t count, Run&& run) {
  ChannelRuns runs(indexing, first, count);
  std::int64_t offset = 0, length = 0, channel = 0;
  while (runs.next(offset, length, channel)) run(offset, length, channel);
}

/// Multiplies every weight that feeds output channel o by scale[o], in place, so that the layer output channel o
/// becomes scale[o] times what it was (the bias is handled separately by foldBias / foldGemmBias).
/// - Conv: rows of axis 0 (also depthwise, any kernel rank).
/// - ConvTranspose: output channel g*(M/group)+j is axis-1 index j of the rows [g*C/group, (g+1)*C/group).
/// - Gemm: columns of `[K, N]` (transB 0) or rows of `[N, K]` (transB 1). Gemm's alpha stays unchanged.
/// - MatMul: columns of `[K, N]`.
/// Throws std::invalid_argument when dims do not fit the layout, the data size, or scale.size().
void scaleOutputChannels(const WeightLayout& layout, std::vector<double>& weights, const Dims& dims,
                         const std::vector<double>& scale);

/// Multiplies every weight that reads input channel c by scale[c], in place, so that the layer applied to the
/// unscaled input equals the original layer applied to the input with channel c multiplied by scale[c]
/// (a per-input-channel Mul in front of the layer, folded into it).
/// - Conv: input channel c belongs to group c / (C/group) and is axis-1 index c % (C/group) of that group's rows.
/// - ConvTranspose: rows of axis 0.
/// - Gemm: the K axis of B — rows of `[K, N]` (transB 0), columns of `[N, K]` (transB 1). Which axis of A holds K
///   (transA) is the caller's concern: the Mul must scale A's K axis.
/// - MatMul: rows of `[K, N]`.
/// Throws std::invalid_argument when dims do not fit the layout, the data size, or scale.size().
void scaleInputChannels(const WeightLayout& layout, std::vector<double>& weights, const Dims& dims,
                        const std::vector<double>& scale);

/// Folded per-channel bias when the layer had none: the shift itself.
std::vector<double> foldBias(const ChannelAffine& affine);

/// Folded per-channel bias `[C]`: oldBias * scale + shift. Throws std::invalid_argument on a length mismatch.
std::vector<double> foldBias(const std::vector<double>& oldBias, const ChannelAffine& affine);

/// Gemm's C after folding, with the beta attribute to set alongside it.
struct GemmBiasFold {
  std::vector<double> values;
  Dims dims;
  double beta = 1.0;
};

/// Whether cDims is a C shape that Gemm accepts for N output columns (unidirectionally broadcastable to
/// `[M, N]`): `[]`, `[1]`, `[N]`, `[1, 1]`, `[1, N]`, `[M, 1]`, `[M, N]` with M >= 1.
bool isGemmBiasShape(const Dims& cDims, std::int64_t columns);

/// Folded C for a Gemm without C (or with beta = 0): C' = shift, shape `[N]`, beta 1.
GemmBiasFold foldGemmBias(const ChannelAffine& affine);

/// Folded C for `Y = alpha*A'*B' + beta*C` followed by the affine map on Y's columns, given the weights were
/// scaled with scaleOutputChannels. Produces C' = beta*C*scale + shift and always returns beta = 1, so the
/// layer computes alpha*A'*B'' + C' with no division by beta (beta may be tiny) and no extra rounding.
/// When beta == 0, C is ignored (it never contributed) and C' = shift.
/// Shapes: C absent / `[]` / `[1]` / `[N]` give C' `[N]`, and `[1, 1]` / `[1, N]` give `[1, N]` — these stay
/// per-channel. `[M, 1]` and `[M, N]` vary per row and give `[M, N]`.
/// Throws std::invalid_argument when cDims is not a Gemm C shape for N = affine.scale.size() or does not match
/// c.size().
GemmBiasFold foldGemmBias(const std::vector<double>& c, const Dims& cDims, double beta, const ChannelAffine& affine);

/// Whether a constant of constDims, combined element-wise with an output of rank outputRank under ONNX (numpy)
/// broadcasting — shapes aligned from the LAST axis — acts per channel on channelAxis (with `channels` channels):
/// every dim must be 1 except the one aligned with channelAxis, which may be 1 or `channels`; the constant may not
/// have a higher rank than the output. So for NCHW (rank 4, axis 1): scalar, `[1]`, `[C,1,1]`, `[1,C,1,1]`,
/// `[1,1,1,1]` are per-channel, `[C]` is not (it runs along W). For `[N, C]` outputs `[C]`, `[1,C]` are, `[C,1]`
/// is not (it runs along the rows). Throws std::invalid_argument if channelAxis is outside [0, outputRank) or
/// channels < 1.
bool isPerChannelShape(std::int64_t outputRank, std::int64_t channelAxis, std::int64_t channels,
                       const Dims& constDims);

/// The constant's values expanded to one per channel (a broadcast single value becomes `channels` copies) when
/// isPerChannelShape holds, nullopt otherwise. Throws std::invalid_argument when values.size() does not match
/// constDims (or on the isPerChannelShape argument errors).
std::optional<std::vector<double>> perChannelValues(std::int64_t outputRank, std::int64_t channelAxis,
                                                    std::int64_t channels, const Dims& constDims,
                                                    const std::vector<double>& values);

/// Per-channel statistics of a batch.
struct BatchStatistics {
  std::vector<double> mean;
  std::vector<double> variance;  ///< population variance (divides by the count, as ONNX training-mode BN does)
};

/// Mean and population variance of x (dims `[N, C, D1, ...]`, rank >= 2) over every axis except axis 1, as
/// BatchNormalization computes them in training mode. Throws std::invalid_argument when dims do not match x, the
/// rank is below 2, or a channel has no elements.
BatchStatistics batchStatistics(const std::vector<double>& x, const Dims& dims);

/// ONNX running-statistic update: running * momentum + current * (1 - momentum), element-wise.
/// Throws std::invalid_argument on a length mismatch.
std::vector<double> updateRunningStatistic(const std::vector<double>& running, const std::vector<double>& current,
                                           double momentum);

/// Applies the per-channel affine map on axis 1 of x (dims `[N, C, D1, ...]`, rank >= 2), returning a new tensor.
/// With batchNormAsAffine this is BatchNormalization. Throws std::invalid_argument on size mismatches.
std::vector<double> applyChannelAffine(const std::vector<double>& x, const Dims& dims, const ChannelAffine& affine);

}  // namespace bnfold::kernels
