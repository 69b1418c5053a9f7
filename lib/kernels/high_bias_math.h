// High-bias absorption (Nagel et al. 2019, section 4.2) on double vectors. A layer whose output channel has mean
// beta and standard deviation |gamma| (a folded BatchNormalization's) stays above beta - 3|gamma| on nearly all
// inputs; that much can leave the channel through a Relu and be added back by the next layer's bias. No IR types
// here (STYLE.md).
#pragma once

#include <vector>

#include "kernels/fold_math.h"

namespace bnfold::kernels {

/// c[i] = max(0, beta[i] - 3|gamma[i]|): what channel i can give up while a Relu after it still cuts nothing on
/// inputs within three standard deviations of its mean. Throws std::invalid_argument when the lengths differ.
std::vector<double> absorbableBias(const std::vector<double>& gamma, const std::vector<double>& beta);

/// What a layer adds to each output channel o when every element of its input channel i is shifted by shift[i]:
/// the sum over the weights w that read channel i and feed channel o of w * shift[i] (a Conv's kernel positions
/// included, so its input must not be padded). Layouts Conv (grouped too), Gemm and MatMul; throws
/// std::invalid_argument for ConvTranspose, or when dims do not fit the layout, the data or shift.size().
std::vector<double> outputShiftOfInputShift(const WeightLayout& layout, const std::vector<double>& weights,
                                            const Dims& dims, const std::vector<double>& shift);

}  // namespace bnfold::kernels
