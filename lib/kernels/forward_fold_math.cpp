#include "kernels/forward_fold_math.h"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace bnfold::kernels {

std::vector<double> inputShiftResponse(const WeightLayout& layout, const std::vector<double>& weights,
                                       const Dims& dims, const std::vector<double>& shift) {
  const char* const function = "inputShiftResponse: ";
  if (layout.kind == WeightKind::ConvTranspose)
    throw std::invalid_argument(std::string(function) + "a constant input to ConvTranspose does not give a "
                                                        "constant output");
  const auto outputs = outputChannelCount(layout, dims);
  const auto inputs = inputChannelCount(layout, dims);
  if (!outputs || !inputs) throw std::invalid_argument(std::string(function) + "weight dims do not fit the layout");
  std::size_t count = 1;
  for (std::int64_t d : dims) count *= static_cast<std::size_t>(d);
  if (count != weights.size())
    throw std::invalid_argument(std::string(function) + "weight dims do not match the number of weights");
  if (shift.size() != static_cast<std::size_t>(*inputs))
    throw std::invalid_argument(std::string(function) + "shift has " + std::to_string(shift.size()) +
                                " entries, expected " + std::to_string(*inputs));

  const auto outputChannels = static_cast<std::size_t>(*outputs);
  std::vector<double> response(outputChannels, 0.0);
  if (layout.kind == WeightKind::Conv) {
    const auto channelsPerGroup = static_cast<std::size_t>(dims[1]);
    const std::size_t outputsPerGroup = outputChannels / static_cast<std::size_t>(layout.group);
    const std::size_t kernelSize = channelsPerGroup == 0 || outputChannels == 0
                                       ? 0
                                       : weights.size() / (outputChannels * channelsPerGroup);
    for (std::size_t o = 0; o < outputChannels; ++o) {
      const std::size_t firstInput = (o / outputsPerGroup) * channelsPerGroup;
      double sum = 0.0;
      for (std::size_t j = 0; j < channelsPerGroup; ++j) {
        const double* kernel = weights.data() + (o * channelsPerGroup + j) * kernelSize;
        double kernelSum = 0.0;
        for (std::size_t k = 0; k < kernelSize; ++k) kernelSum += kernel[k];
        sum += kernelSum * shift[firstInput + j];
      }
      response[o] = sum;
    }
    return response;
  }
  // Gemm / MatMul: a 2-D weight with K and N on the axes the layout says.
  const bool rowsAreOutputs = layout.kind == WeightKind::Gemm && layout.transB;  // [N, K]
  const auto inputChannels = static_cast<std::size_t>(*inputs);
  for (std::size_t n = 0; n < outputChannels; ++n) {
    double sum = 0.0;
    for (std::size_t k = 0; k < inputChannels; ++k) {
      const double w = rowsAreOutputs ? weights[n * inputChannels + k] : weights[k * outputChannels + n];
      sum += w * shift[k];
    }
    response[n] = sum;
  }
  return response;
}

}  // namespace bnfold::kernels
