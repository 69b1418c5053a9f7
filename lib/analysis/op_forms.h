#pragma once
// The ai.onnx opsets at which an op's form changed (an attribute became an input, broadcasting became numpy's),
// for code that reads or writes both forms. The full table of op versions is rewrite/op_versions.h.

#include <cstdint>

namespace bnfold {

/// Add, Sub, Mul, Div and Gemm's C broadcast numpy-style from 7; before it only with `broadcast`/`axis`.
inline constexpr int64_t kNumpyBroadcastOpset = 7;
/// Reshape takes the shape as an input from 5 (an attribute before).
inline constexpr int64_t kReshapeShapeInputOpset = 5;
/// Squeeze and Unsqueeze take their axes as an input from 13 (an attribute before).
inline constexpr int64_t kSqueezeAxesInputOpset = 13;
/// ReduceMean takes its axes as an optional input from 18 (an attribute before).
inline constexpr int64_t kReduceMeanAxesInputOpset = 18;
/// ReduceSum takes its axes as an optional input from 13 (an attribute before).
inline constexpr int64_t kReduceSumAxesInputOpset = 13;
/// BatchNormalization: `is_test` goes at 7, `spatial` at 9; 14 brings `training_mode` and drops the saved
/// statistics outputs; from 15 scale/B and mean/var may have a type other than X's.
inline constexpr int64_t kBatchNormIsTestRemovedOpset = 7;
inline constexpr int64_t kBatchNormSpatialRemovedOpset = 9;
inline constexpr int64_t kBatchNormTrainingModeOpset = 14;
inline constexpr int64_t kBatchNormMixedTypesOpset = 15;
/// GroupNormalization-18 takes scale and bias per group; -21 per channel, with a stash_type.
inline constexpr int64_t kGroupNormPerChannelOpset = 21;

}  // namespace bnfold
