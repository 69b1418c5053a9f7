#pragma once
// Scaling packed floating-point elements in place, beyond what include/bnfold/ir/tensor.h offers: for the
// library's own weight writers.

#include <cstdint>

#include "bnfold/ir/tensor.h"

namespace bnfold {

/// scaleElementsInPlace with two factors per element, applied in order: element i becomes (v * first[i]) *
/// second[i], computed in double and rounded once to `type`.
void scaleElementsInPlace(DataType type, char* bytes, int64_t count, const double* first, const double* second);

}  // namespace bnfold
