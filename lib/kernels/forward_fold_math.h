// Folding a per-channel affine map that sits BEFORE a layer (BatchNormalization in front of a Conv or Gemm):
// the scale goes into the weights' input channels (fold_math.h: scaleInputChannels), and the shift becomes a
// constant added to every output, which this file computes. Pure math on double vectors, like fold_math.h.
#pragma once

#include <vector>

#include "kernels/fold_math.h"

namespace bnfold::kernels {

/// What the layer adds to output channel o when every element of input channel c is raised by shift[c]:
/// the sum of all weights that read input channel c, times shift[c], over c (alpha and bias not included).
/// layer(x + shift) = layer(x) + response holds for Gemm and MatMul, and for Conv only when it does no zero
/// padding (a padded border sees 0, not the shift) — the caller checks that.
/// - Conv `[M, C/group, k...]`: output channel o of group g = o / (M/group) reads input channels g*C/group + j.
/// - Gemm `[K, N]` (transB 0) / `[N, K]` (transB 1), MatMul `[K, N]`.
/// Throws std::invalid_argument for ConvTranspose (its border outputs see fewer inputs, so a constant input does
/// not give a constant output), when dims do not fit the layout or the data, or shift has the wrong length.
std::vector<double> inputShiftResponse(const WeightLayout& layout, const std::vector<double>& weights,
                                       const Dims& dims, const std::vector<double>& shift);

}  // namespace bnfold::kernels
