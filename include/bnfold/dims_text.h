#pragma once
/// \file
/// How messages write dims and shapes. Below every folder (it knows no IR type), so the kernels, the IR, the
/// rules and the verifier all say "[1,8,1,1]" the same way.

#include <string>
#include <string_view>

namespace bnfold {

/// "[1,8,1,1]", or "[1, 8, 1, 1]" with `separator` ", "; "[]" for a scalar. `Dims` is any range of integers.
template <typename Dims>
std::string formatDims(const Dims& dims, std::string_view separator = ",") {
  std::string text = "[";
  bool first = true;
  for (const auto dim : dims) {
    if (!first) text += separator;
    text += std::to_string(dim);
    first = false;
  }
  return text + "]";
}

}  // namespace bnfold
