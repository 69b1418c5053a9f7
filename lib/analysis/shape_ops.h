#pragma once
// The output shape of each ONNX layout op (Reshape, Transpose, Squeeze, Unsqueeze, Flatten) from its input's dims
// and its operands, written once for every user: shape inference (value_shape), the rules' layout paths, constant
// evaluation and the verifier's interpreter. Input dims may hold kUnknownDim; an output dim that depends on one is
// unknown too, and a check that needs one is skipped (constant evaluation and the verifier pass known dims only).
// Which form an op's operand takes at an opset (attribute or input) is in op_forms.h.

#include <cstdint>
#include <string>
#include <vector>

namespace bnfold::analysis {

/// A dim that is not known statically (symbolic or not declared).
inline constexpr int64_t kUnknownDim = -1;

/// Why an op's output shape cannot be formed from its input and operands (the model is invalid, or the shape needs
/// dims that are not known).
enum class ShapeProblem {
  kNone,
  kZeroCopiesMissingDim,  ///< Reshape: a 0 copies an input dim that does not exist
  kTwoInferredDims,       ///< Reshape: two -1 dims
  kNegativeDim,           ///< Reshape: a target dim below -1
  kCountOverflow,         ///< Reshape: the target's element count does not fit in int64
  kCannotInferDim,        ///< Reshape: the element count is no multiple of the other target dims'
  kCountMismatch,         ///< Reshape: the target holds another number of elements
  kInvalidAxis,           ///< an axis out of range, or repeated (Unsqueeze)
  kSqueezesNonUnitDim,    ///< Squeeze: an axis whose dim is known and not 1
  kUnknownInputDims,      ///< Squeeze without axes: which dims are 1 is not known
  kPermRankMismatch,      ///< Transpose: perm has another length than the input's rank
  kInvalidPerm,           ///< Transpose: perm is no permutation of the input's axes
};

/// An op's output shape, or the problem that prevents it.
struct OutputShape {
  std::vector<int64_t> dims;  ///< kUnknownDim where not known
  /// Transpose, Squeeze, Unsqueeze: for each output axis the input axis it carries, or -1 for an inserted one.
  /// Empty for Reshape and Flatten, which do not carry axes one to one.
  std::vector<int64_t> sourceAxis;
  ShapeProblem problem = ShapeProblem::kNone;
  int64_t problemAxis = -1;  ///< the target dim or input axis the problem is about, where there is one
  std::string message;       ///< the problem in words, to follow the op's name ("has two -1 dims")

  bool ok() const { return problem == ShapeProblem::kNone; }
};

/// Reshape to `target`: 0 copies the input dim at its place (unless `allowZero`), one -1 is inferred.
OutputShape reshapeShape(const std::vector<int64_t>& input, const std::vector<int64_t>& target, bool allowZero);

/// Transpose by `perm`; an empty perm reverses the axes.
OutputShape transposeShape(const std::vector<int64_t>& input, std::vector<int64_t> perm);

/// Squeeze of `axes` (negative counts from the end); no axes removes every dim of size 1.
OutputShape squeezeShape(const std::vector<int64_t>& input, const std::vector<int64_t>& axes);

/// Unsqueeze inserting dims of size 1 at `axes` of the output (negative counts from the output's end).
OutputShape unsqueezeShape(const std::vector<int64_t>& input, const std::vector<int64_t>& axes);

/// Flatten at `axis` (negative counts from the end) to [product of the dims before, product of the rest].
OutputShape flattenShape(const std::vector<int64_t>& input, int64_t axis);

}  // namespace bnfold::analysis
