#pragma once
// --verify: one rewrite's regions (before and after) evaluated on the same seeded random inputs and compared.
// Inputs get the value's real shape when it is known and small, else a stand-in derived from the op that reads
// it (small spatial sizes that still reach every kernel position and both borders). The README's "Verification"
// section states the tolerances and what this cannot see.

#include <cstdint>

#include <nlohmann/json.hpp>

#include "bnfold/ir/tensor.h"
#include "interpreter.h"
#include "region.h"

namespace bnfold::verify {

/// Largest run-time input (elements) given its real shape; larger ones get stand-in sizes.
inline constexpr int64_t kRealShapeElementLimit = int64_t{1} << 16;

/// The largest error of one output element, relative to its magnitude plus the root mean square of the
/// original output, that passes for outputs of this element type.
double toleranceFor(DataType type);

struct VerifySettings {
  uint64_t seed = 0;
  /// Evaluate the original's training-mode BatchNormalization in inference mode (for train-bn-freeze).
  bool batchNormAsInference = false;
};

/// Verifies the rewrites of one run, one at a time; keeps buffers from one to the next.
class Verifier {
 public:
  /// The report's "verify" object for one rewrite: passed, max_abs_error, max_rel_error, tolerance, data_type,
  /// input_shapes, outputs, seed; "error" instead of the errors when the regions could not be evaluated.
  nlohmann::json verify(const RegionPair& regions, const VerifySettings& settings);

 private:
  template <typename T>
  nlohmann::json verifyAs(const RegionPair& regions, const VerifySettings& settings, BufferPool<T>& pool);

  BufferPool<float> floatBuffers_;
  BufferPool<double> doubleBuffers_;
};

}  // namespace bnfold::verify
