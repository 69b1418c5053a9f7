// Reference implementations of the ONNX ops that `bnfold fold --verify` evaluates: the original and the rewritten
// subgraph run through these on random inputs and must agree (issue 15).
//
// Semantics follow ONNX Runtime's CPU kernels where ORT and the spec differ (noted at each function); the test
// test/verify/test_reference_kernels.cpp checks every op against ORT on a seeded table of random cases.
//
// Errors: every function throws std::invalid_argument with a short message when shapes or attributes do not fit
// (the operands may come from a malformed model), and never reads out of bounds. Sizes use checked arithmetic.
// Conv, ConvTranspose, Gemm and MatMul are GEMM-based (Eigen products on mapped buffers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bnfold::verify {

using Dims = std::vector<int64_t>;

/// A dense row-major array.
template <typename T>
struct Array {
  Dims dims;
  std::vector<T> data;
};

/// Number of elements of dims (throws std::invalid_argument on negative dims or overflow).
int64_t elementCount(const Dims& dims);

/// numpy broadcast of two shapes, or throws std::invalid_argument.
Dims broadcastDims(const Dims& a, const Dims& b);

struct ConvAttributes {
  std::vector<int64_t> kernelShape;    // empty: taken from W
  std::vector<int64_t> strides;        // empty: all 1
  std::vector<int64_t> dilations;      // empty: all 1
  std::vector<int64_t> pads;           // empty: all 0; [begin_1..begin_n, end_1..end_n]
  std::vector<int64_t> outputPadding;  // ConvTranspose only; empty: 0
  std::vector<int64_t> outputShape;    // ConvTranspose only; empty: not given (spatial dims, or N, C, spatial...)
  int64_t group = 1;
  std::string autoPad = "NOTSET";      // NOTSET, SAME_UPPER, SAME_LOWER, VALID
};

/// Conv: x `[N, C, D1..Dn]`, w `[M, C/group, k1..kn]`, bias `[M]` or null; n >= 1.
/// auto_pad SAME_*: output ceil(D / stride), total pad max(0, (out-1)*stride + (k-1)*dilation + 1 - D), the odd
/// one at the end (SAME_UPPER) or the beginning (SAME_LOWER); explicit pads must then be absent or zero. (ORT 1.30
/// refuses SAME_* with a dilation other than 1; we compute the spec's formula for it.)
template <typename T>
Array<T> conv(const Array<T>& x, const Array<T>& w, const Array<T>* bias, const ConvAttributes& a);

/// ConvTranspose: x `[N, C, D1..Dn]`, w `[C, M/group, k1..kn]`, bias `[M]` or null; n >= 1.
/// Output size per axis: (D-1)*stride + output_padding + (k-1)*dilation + 1 - pad_begin - pad_end. As in ORT:
/// - output_shape (spatial dims, or N, C and the spatial dims) replaces the explicit pads: the total pad is
///   max(0, natural size - output_shape) and is split as for auto_pad below (NOTSET and VALID split like
///   SAME_LOWER: the extra one at the beginning). Output positions beyond what the input reaches hold the bias
///   only. ORT's shape inference refuses the N, C, spatial form at load; its kernel, and ours, accept it.
/// - auto_pad SAME_UPPER / SAME_LOWER pad until the output is D*stride (total max(0, natural - D*stride)); an odd
///   total puts the extra one at the end for SAME_UPPER, at the beginning for SAME_LOWER (ORT 1.30, checked).
/// - auto_pad VALID: no padding.
template <typename T>
Array<T> convTranspose(const Array<T>& x, const Array<T>& w, const Array<T>* bias, const ConvAttributes& a);

/// MaxPool: x `[N, C, D1..Dn]`, the largest value of each window (kernel_shape, strides, dilations, pads or auto_pad
/// as for Conv; positions in the padding are skipped); ceil_mode 0 only (the caller refuses other values). ORT 1.30
/// refuses auto_pad SAME_* where the stride exceeds the window's reach; this computes it with no padding, as Conv.
template <typename T>
Array<T> maxPool(const Array<T>& x, const ConvAttributes& a);

/// AveragePool: x `[N, C, D1..Dn]`, the mean of each window (geometry as maxPool, ceil_mode 0 only), over the
/// window's positions inside x, or over all of its positions with `countIncludePad` (the padding counts as zeros).
template <typename T>
Array<T> averagePool(const Array<T>& x, const ConvAttributes& a, bool countIncludePad);

/// Y = alpha * op(A) * op(B) + beta * C; A, B 2-D; c (null = absent) unidirectionally broadcast to [M, N].
/// With beta == 0, C is not read (as BLAS and ORT do).
template <typename T>
Array<T> gemm(const Array<T>& a, const Array<T>& b, const Array<T>* c, double alpha, double beta, bool transA,
              bool transB);

/// numpy matmul: a 1-D operand is promoted (and the added axis removed again), batch dims broadcast.
template <typename T>
Array<T> matMul(const Array<T>& a, const Array<T>& b);

/// Inference BatchNormalization, channel axis 1, params of shape [C]; x rank >= 2 (rank 2 = [N,C]).
/// y = (x - mean) / sqrt(var + epsilon) * scale + bias.
template <typename T>
Array<T> batchNormInference(const Array<T>& x, const Array<T>& scale, const Array<T>& bias, const Array<T>& mean,
                            const Array<T>& var, double epsilon);

template <typename T>
struct BatchNormTraining {
  Array<T> y, runningMean, runningVar, savedMean, savedInvStdDev;
};

/// Training-mode BatchNormalization: statistics over every axis but 1, y normalised with the batch mean and the
/// batch (population, divide-by-count) variance.
///
/// Which variance goes where — the ONNX spec and ONNX Runtime 1.30 (CPU, batch_norm.h) agree on the running
/// statistics:
/// - runningMean = inputMean * momentum + batchMean * (1 - momentum);
///   runningVar = inputVar * momentum + batchVar * (1 - momentum), batchVar the POPULATION (biased) variance. The
///   spec (opset 14/15, training_mode=1, outputs Y, running_mean, running_var) says "ReduceVar ... the population
///   variance" and its reference implementation uses numpy's x.var(); ORT divides by N*spatial. (PyTorch updates its
///   running_var with the unbiased variance: an exported PyTorch training graph does not match either.)
/// - Opset 9 and earlier (5 outputs Y, mean, var, saved_mean, saved_var, training inferred from the output count):
///   outputs 1 and 2 are the running statistics above, output 3 the batch mean. Output 4 differs: the spec calls it
///   saved_var, but ORT writes 1 / sqrt(batchVar + epsilon) (its comment: "with opset <= 9 we will be outputting
///   saved_inv_std_dev instead of saved_var"). We follow ORT: savedInvStdDev.
/// ORT reads epsilon and momentum as float attributes; pass the float-rounded values to match it exactly.
template <typename T>
BatchNormTraining<T> batchNormTraining(const Array<T>& x, const Array<T>& scale, const Array<T>& bias,
                                       const Array<T>& inputMean, const Array<T>& inputVar, double epsilon,
                                       double momentum);

// Normalizations. Statistics are per block of the input (the elements they reduce over are contiguous in
// row-major order), computed in double with the two-pass (population) variance; `stash` rounds each statistic to
// the type ONNX's stash_type names (null: kept in double), which is what the spec's function bodies compute in.
using StashRounding = double (*)(double);

template <typename T>
struct LayerNormalizationResult {
  Array<T> y, mean, invStdDev;  // mean and invStdDev: x's dims with axes axis.. set to 1
};

/// LayerNormalization-17: statistics over axes axis..rank-1 (negative axis counts from the end); y = (x - mean) *
/// invStdDev * scale + bias with numpy broadcasting of scale and bias (null = no bias), which must leave x's dims.
template <typename T>
LayerNormalizationResult<T> layerNormalization(const Array<T>& x, const Array<T>& scale, const Array<T>* bias,
                                               int64_t axis, double epsilon, StashRounding stash);

/// RMSNormalization-23: y = x / sqrt(mean(x^2 over axes axis..) + epsilon) * scale (numpy broadcast, keeping x's
/// dims).
template <typename T>
Array<T> rmsNormalization(const Array<T>& x, const Array<T>& scale, int64_t axis, double epsilon, StashRounding stash);

/// GroupNormalization: x `[N, C, D...]`, statistics per sample over each of numGroups groups of C / numGroups
/// consecutive channels and the spatial dims. Opset 18 takes scale and bias of shape [numGroups] (channel c uses its
/// group's value); opset 21 per channel [C].
enum class GroupAffine { PerGroup, PerChannel };
template <typename T>
Array<T> groupNormalization(const Array<T>& x, const Array<T>& scale, const Array<T>& bias, int64_t numGroups,
                            double epsilon, GroupAffine affine, StashRounding stash);

/// InstanceNormalization-6: x `[N, C, D...]` (rank >= 3), statistics per sample and channel over the spatial
/// dims, scale and bias [C].
template <typename T>
Array<T> instanceNormalization(const Array<T>& x, const Array<T>& scale, const Array<T>& bias, double epsilon);

enum class BinaryOp { Add, Sub, Mul, Div, Pow, Max, Min };
/// Element-wise with numpy multidirectional broadcasting; T float, double, int64_t. Integer Div truncates toward
/// zero (as ORT) and throws on division by zero (as ORT does not, which would be undefined behaviour here); Pow on
/// integers goes through double.
template <typename T>
Array<T> binary(BinaryOp op, const Array<T>& a, const Array<T>& b);

enum class UnaryOp { Identity, Sqrt, Reciprocal, Neg, Relu };
template <typename T>
Array<T> unary(UnaryOp op, const Array<T>& x);

/// LeakyRelu: x where x >= 0, else alpha * x (NaN stays NaN).
template <typename T>
Array<T> leakyRelu(const Array<T>& x, double alpha);

/// PRelu (opset 7+): x where x >= 0, else slope * x, with slope unidirectionally broadcast to x's shape (a slope
/// that would broadcast x to a bigger shape throws).
template <typename T>
Array<T> prelu(const Array<T>& x, const Array<T>& slope);

/// Mean over axes (negative counts from the end; empty = all axes); duplicate or out-of-range axes throw.
template <typename T>
Array<T> reduceMean(const Array<T>& x, const std::vector<int64_t>& axes, bool keepDims);
/// Sum over axes, as reduceMean without the division.
template <typename T>
Array<T> reduceSum(const Array<T>& x, const std::vector<int64_t>& axes, bool keepDims);

// Layout / data movement, T in {float, double, int64_t}.

/// Permutes the axes; empty perm reverses them.
template <typename T>
Array<T> transpose(const Array<T>& x, const std::vector<int64_t>& perm);

/// ONNX Slice-13: negative starts/ends count from the end and are clamped (to [0, d] for positive steps, to
/// [-1, d-1] for negative ones); negative steps walk backwards; empty axes = 0..n-1, empty steps = 1; step 0 and
/// repeated axes throw.
template <typename T>
Array<T> slice(const Array<T>& x, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
               const std::vector<int64_t>& axes, const std::vector<int64_t>& steps);

/// ONNX Gather: output dims = x.dims[:axis] + indices.dims + x.dims[axis+1:]; indices in [-d, d).
template <typename T>
Array<T> gather(const Array<T>& x, const Array<int64_t>& indices, int64_t axis);

/// ONNX Expand: x broadcast with shape (bidirectionally, so a 1 in shape keeps x's dim).
template <typename T>
Array<T> expand(const Array<T>& x, const Dims& shape);

/// ONNX Concat: same rank, same dims except on axis (negative counts from the end).
template <typename T>
Array<T> concat(const std::vector<const Array<T>*>& inputs, int64_t axis);

// Additions to the interface.

/// Overloads for a literal nullptr bias / C, which cannot deduce T from `const Array<T>*`.
template <typename T>
Array<T> conv(const Array<T>& x, const Array<T>& w, std::nullptr_t, const ConvAttributes& a) {
  return conv(x, w, static_cast<const Array<T>*>(nullptr), a);
}
template <typename T>
Array<T> convTranspose(const Array<T>& x, const Array<T>& w, std::nullptr_t, const ConvAttributes& a) {
  return convTranspose(x, w, static_cast<const Array<T>*>(nullptr), a);
}
template <typename T>
Array<T> gemm(const Array<T>& a, const Array<T>& b, std::nullptr_t, double alpha, double beta, bool transA,
              bool transB) {
  return gemm(a, b, static_cast<const Array<T>*>(nullptr), alpha, beta, transA, transB);
}

template <typename T>
LayerNormalizationResult<T> layerNormalization(const Array<T>& x, const Array<T>& scale, std::nullptr_t, int64_t axis,
                                               double epsilon, StashRounding stash) {
  return layerNormalization(x, scale, static_cast<const Array<T>*>(nullptr), axis, epsilon, stash);
}

/// The begin / end pads ConvTranspose uses on one spatial axis, and its output size (see convTranspose).
struct TransposePads {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t outputSize = 0;
};
/// outputShapeDim: the output_shape entry for this axis, or -1 when output_shape is not given.
TransposePads convTransposePads(int64_t inputSize, int64_t kernel, int64_t stride, int64_t dilation,
                                int64_t outputPadding, int64_t padBegin, int64_t padEnd, int64_t outputShapeDim,
                                const std::string& autoPad);

}  // namespace bnfold::verify
