// What symmetric int8 quantization does to one layer weight, per tensor against per channel: the figures
// `bnfold info --weights` prints. Weight domain only (no activations): SQNR = 10 log10(||W||^2 / ||W - Q(W)||^2)
// with Q rounding to the nearest step (ties away from zero), step = max|W| / 127 over the whole tensor (per
// tensor) or over each output channel's weights (per channel). No IR types here (STYLE.md).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/fold_math.h"

namespace bnfold::kernels {

/// One weight's int8 figures. SQNRs are +infinity when quantization loses nothing (an all-zero weight too).
struct WeightQuantStats {
  std::int64_t channels = 0;      ///< output channels
  std::int64_t deadChannels = 0;  ///< output channels whose weights are all zero
  /// max / min over the live output channels of max|W_c|; 1 with a single live channel, 0 with none.
  double rangeSpread = 0.0;
  double perTensorSqnrDb = 0.0;
  double perChannelSqnrDb = 0.0;
  /// perChannelSqnrDb - perTensorSqnrDb: what one step for the whole tensor costs (0 when both are infinite).
  double gapDb() const;
};

/// 10 log10(||W||^2 / ||W - Q(W)||^2) with one int8 step per output channel (max|W_c| / 127).
/// Throws std::invalid_argument when dims do not fit the layout or the data.
double perChannelInt8SqnrDb(const WeightLayout& layout, const std::vector<double>& weights, const Dims& dims);

/// Every figure of WeightQuantStats. Throws std::invalid_argument when dims do not fit the layout or the data.
WeightQuantStats weightQuantStats(const WeightLayout& layout, const std::vector<double>& weights, const Dims& dims);

}  // namespace bnfold::kernels
