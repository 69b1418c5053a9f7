#include "shape_ops.h"

#include <algorithm>

#include "bnfold/dims_text.h"
#include "bnfold/ir/tensor.h"

namespace bnfold::analysis {
namespace {

using Dims = std::vector<int64_t>;

OutputShape failed(ShapeProblem problem, std::string message, int64_t axis = -1, Dims dims = {}) {
  OutputShape out;
  out.dims = std::move(dims);
  out.problem = problem;
  out.problemAxis = axis;
  out.message = std::move(message);
  return out;
}

bool allKnown(const Dims& dims) {
  return std::none_of(dims.begin(), dims.end(), [](int64_t d) { return d == kUnknownDim; });
}

/// The product of dims [from, to), or kUnknownDim when one of them is unknown (INT64_MAX when it does not fit,
/// which no real dim matches).
int64_t productOrUnknown(const Dims& dims, std::size_t from, std::size_t to) {
  const Dims part(dims.begin() + static_cast<std::ptrdiff_t>(from), dims.begin() + static_cast<std::ptrdiff_t>(to));
  return allKnown(part) ? saturatingElementCount(part) : kUnknownDim;
}

int64_t normalized(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }

}  // namespace

OutputShape reshapeShape(const Dims& input, const Dims& target, bool allowZero) {
  OutputShape out;
  out.dims.reserve(target.size());
  int64_t knownCount = 1;  // of the target dims, leaving out the -1 and the unknown dims a 0 copies
  std::vector<bool> copiedUnknown(input.size(), false);
  int64_t inferred = -1;
  for (std::size_t i = 0; i < target.size(); ++i) {
    int64_t d = target[i];
    if (d == 0 && !allowZero) {
      if (i >= input.size())
        return failed(ShapeProblem::kZeroCopiesMissingDim, "copies dim " + std::to_string(i) + " that does not exist",
                      static_cast<int64_t>(i));
      d = input[i];
      if (d == kUnknownDim) {
        copiedUnknown[i] = true;
        out.dims.push_back(kUnknownDim);
        continue;
      }
    }
    if (d == -1) {
      if (inferred >= 0) return failed(ShapeProblem::kTwoInferredDims, "has two -1 dims", static_cast<int64_t>(i));
      inferred = static_cast<int64_t>(i);
      out.dims.push_back(kUnknownDim);
      continue;
    }
    if (d < 0) return failed(ShapeProblem::kNegativeDim, "has a negative target dim", static_cast<int64_t>(i));
    out.dims.push_back(d);
    const std::optional<int64_t> product = checkedProduct(knownCount, d);  // the target comes from the file
    if (!product)
      return failed(ShapeProblem::kCountOverflow, "reshapes to dims whose element count does not fit in 64 bits");
    knownCount = *product;
  }
  // An unknown dim a 0 copies stands on both sides (a symbolic batch, [0, -1]); any other unknown input dim leaves
  // the element count unknown.
  Dims counted;
  counted.reserve(input.size());
  for (std::size_t i = 0; i < input.size(); ++i) {
    if (copiedUnknown[i]) continue;
    if (input[i] == kUnknownDim) return out;
    counted.push_back(input[i]);
  }
  const int64_t total = saturatingElementCount(counted);
  if (inferred >= 0) {
    if (knownCount == 0 || total % knownCount != 0)
      return failed(ShapeProblem::kCannotInferDim, "cannot infer its -1 dim", inferred);
    out.dims[static_cast<std::size_t>(inferred)] = total / knownCount;
  } else if (knownCount != total) {
    return failed(ShapeProblem::kCountMismatch,
                  "reshapes " + formatDims(input) + " to " + formatDims(out.dims) + ", a different size", -1, out.dims);
  }
  return out;
}

OutputShape transposeShape(const Dims& input, std::vector<int64_t> perm) {
  const auto rank = static_cast<int64_t>(input.size());
  if (perm.empty())
    for (int64_t i = rank - 1; i >= 0; --i) perm.push_back(i);
  if (static_cast<int64_t>(perm.size()) != rank) return failed(ShapeProblem::kPermRankMismatch, "has an invalid perm");
  OutputShape out;
  out.dims.reserve(perm.size());
  out.sourceAxis.reserve(perm.size());
  std::vector<bool> used(input.size(), false);
  for (int64_t axis : perm) {
    if (axis < 0 || axis >= rank || used[static_cast<std::size_t>(axis)])
      return failed(ShapeProblem::kInvalidPerm, "has an invalid perm", axis);
    used[static_cast<std::size_t>(axis)] = true;
    out.dims.push_back(input[static_cast<std::size_t>(axis)]);
    out.sourceAxis.push_back(axis);
  }
  return out;
}

OutputShape squeezeShape(const Dims& input, const std::vector<int64_t>& axes) {
  const auto rank = static_cast<int64_t>(input.size());
  std::vector<bool> removed(input.size(), false);
  if (axes.empty()) {
    if (!allKnown(input))
      return failed(ShapeProblem::kUnknownInputDims, "squeezes every dim of size 1 of an input whose dims are not known");
    for (std::size_t i = 0; i < input.size(); ++i) removed[i] = input[i] == 1;
  }
  for (int64_t axis : axes) {
    const int64_t a = normalized(axis, rank);
    if (a < 0 || a >= rank) return failed(ShapeProblem::kInvalidAxis, "squeezes an axis that is not of size 1", axis);
    const int64_t dim = input[static_cast<std::size_t>(a)];
    if (dim != 1 && dim != kUnknownDim)
      return failed(ShapeProblem::kSqueezesNonUnitDim, "squeezes an axis that is not of size 1", a);
    removed[static_cast<std::size_t>(a)] = true;
  }
  OutputShape out;
  for (std::size_t i = 0; i < input.size(); ++i) {
    if (removed[i]) continue;
    out.dims.push_back(input[i]);
    out.sourceAxis.push_back(static_cast<int64_t>(i));
  }
  return out;
}

OutputShape unsqueezeShape(const Dims& input, const std::vector<int64_t>& axes) {
  const auto rank = static_cast<int64_t>(input.size() + axes.size());
  std::vector<bool> inserted(static_cast<std::size_t>(rank), false);
  for (int64_t axis : axes) {
    const int64_t a = normalized(axis, rank);
    if (a < 0 || a >= rank || inserted[static_cast<std::size_t>(a)])
      return failed(ShapeProblem::kInvalidAxis, "has invalid axes", axis);
    inserted[static_cast<std::size_t>(a)] = true;
  }
  OutputShape out;
  int64_t next = 0;
  for (int64_t i = 0; i < rank; ++i) {
    const bool isNew = inserted[static_cast<std::size_t>(i)];
    out.dims.push_back(isNew ? 1 : input[static_cast<std::size_t>(next)]);
    out.sourceAxis.push_back(isNew ? -1 : next++);
  }
  return out;
}

OutputShape flattenShape(const Dims& input, int64_t axis) {
  const auto rank = static_cast<int64_t>(input.size());
  const int64_t a = normalized(axis, rank);
  if (a < 0 || a > rank) return failed(ShapeProblem::kInvalidAxis, "has an invalid axis", axis);
  OutputShape out;
  out.dims = {productOrUnknown(input, 0, static_cast<std::size_t>(a)),
              productOrUnknown(input, static_cast<std::size_t>(a), input.size())};
  return out;
}

}  // namespace bnfold::analysis
