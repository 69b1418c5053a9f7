#include "kernels/high_bias_math.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace bnfold::kernels {

std::vector<double> absorbableBias(const std::vector<double>& gamma, const std::vector<double>& beta) {
  if (gamma.size() != beta.size()) throw std::invalid_argument("absorbableBias: gamma and beta differ in length");
  std::vector<double> c(gamma.size());
  for (std::size_t i = 0; i < c.size(); ++i) c[i] = std::max(0.0, beta[i] - 3.0 * std::abs(gamma[i]));
  return c;
}

std::vector<double> outputShiftOfInputShift(const WeightLayout& layout, const std::vector<double>& weights,
                                            const Dims& dims, const std::vector<double>& shift) {
  // A ConvTranspose's output near the border, or between strides, sees fewer input positions than elsewhere.
  if (layout.kind == WeightKind::ConvTranspose)
    throw std::invalid_argument("outputShiftOfInputShift: a ConvTranspose does not add one value per channel");
  const auto outputs = outputChannelCount(layout, dims);
  const auto inputs = inputChannelCount(layout, dims);
  const auto byOutput = outputChannelIndexing(layout, dims);
  const auto byInput = inputChannelIndexing(layout, dims);
  if (!outputs || !inputs || !byOutput || !byInput)
    throw std::invalid_argument("outputShiftOfInputShift: dims do not fit the layout");
  if (static_cast<std::int64_t>(shift.size()) != *inputs)
    throw std::invalid_argument("outputShiftOfInputShift: one shift per input channel expected");
  std::int64_t count = 1;
  for (std::int64_t d : dims) count *= d;
  if (static_cast<std::int64_t>(weights.size()) != count)
    throw std::invalid_argument("outputShiftOfInputShift: the weights do not fit their dims");
  std::vector<double> out(static_cast<std::size_t>(*outputs), 0.0);
  for (std::int64_t e = 0; e < count; ++e) {
    const auto i = static_cast<std::size_t>(byInput->channel(e));
    if (shift[i] != 0.0) out[static_cast<std::size_t>(byOutput->channel(e))] += weights[static_cast<std::size_t>(e)] * shift[i];
  }
  return out;
}

}  // namespace bnfold::kernels
