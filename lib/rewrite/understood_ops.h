#pragma once
// The op versions bnfold's rules and its constant evaluation were written for and are tested at (Rule::opVersions,
// constant_eval.cpp). Deliberately a list of its own, not op_versions.h's table of what ONNX has: when a new opset brings a new version
// of one of these ops, the table grows and the rules refuse it (unsupported-opset) until someone has read the new
// version's semantics and added it here.

#include <vector>

#include "bnfold/rewrite/rule.h"

namespace bnfold {

// Every version through opset 27: later versions of these ops only added element types.
inline const OpVersions kBatchNormalization{"BatchNormalization", {1, 6, 7, 9, 14, 15}};
inline const OpVersions kConv{"Conv", {1, 11, 22}};
inline const OpVersions kConvTranspose{"ConvTranspose", {1, 11, 22}};
inline const OpVersions kGemm{"Gemm", {1, 6, 7, 9, 11, 13}};
inline const OpVersions kMatMul{"MatMul", {1, 9, 13}};
inline const OpVersions kConstant{"Constant", {1, 9, 11, 12, 13, 19, 21, 23, 24, 25}};
inline const OpVersions kConcat{"Concat", {1, 4, 11, 13}};
inline const OpVersions kIdentity{"Identity", {1, 13, 14, 16, 19, 21, 23, 24, 25}};
inline const OpVersions kTranspose{"Transpose", {1, 13, 21, 23, 24, 25}};
inline const OpVersions kReshape{"Reshape", {1, 5, 13, 14, 19, 21, 23, 24, 25}};
inline const OpVersions kFlatten{"Flatten", {1, 9, 11, 13, 21, 23, 24, 25}};
inline const OpVersions kSqueeze{"Squeeze", {1, 11, 13, 21, 23, 24, 25}};
inline const OpVersions kUnsqueeze{"Unsqueeze", {1, 11, 13, 21, 23, 24, 25}};
inline const OpVersions kReduceMean{"ReduceMean", {1, 11, 13, 18}};
inline const OpVersions kReduceSum{"ReduceSum", {1, 11, 13}};
// A spatial mean: norm-fuse reads means from it; it passes a channel scale through (equalize's pool junction).
inline const OpVersions kGlobalAveragePool{"GlobalAveragePool", {1, 22}};
inline const OpVersions kGlobalMaxPool{"GlobalMaxPool", {1, 22}};
inline const OpVersions kCast{"Cast", {1, 6, 9, 13, 19, 21, 23, 24, 25}};
inline const OpVersions kSqrt{"Sqrt", {1, 6, 13}};
inline const OpVersions kReciprocal{"Reciprocal", {1, 6, 13}};
inline const OpVersions kNeg{"Neg", {1, 6, 13}};
inline const OpVersions kPow{"Pow", {1, 7, 12, 13, 15}};
inline const OpVersions kMax{"Max", {1, 6, 8, 12, 13}};
inline const OpVersions kMin{"Min", {1, 6, 8, 12, 13}};
inline const OpVersions kSlice{"Slice", {1, 10, 11, 13}};
inline const OpVersions kGather{"Gather", {1, 11, 13}};
inline const OpVersions kExpand{"Expand", {8, 13}};
inline const OpVersions kConstantOfShape{"ConstantOfShape", {9, 20, 21, 23, 24, 25}};
// Positively homogeneous activations (equalize looks through them).
inline const OpVersions kRelu{"Relu", {1, 6, 13, 14}};
inline const OpVersions kLeakyRelu{"LeakyRelu", {1, 6, 16}};
inline const OpVersions kPRelu{"PRelu", {1, 6, 7, 9, 16}};
// ReLU6 as ONNX writes it (relu6-to-relu reads it; not homogeneous, so equalize stops at it).
inline const OpVersions kClip{"Clip", {1, 6, 11, 12, 13}};
// A per-channel max or mean over windows: passes a positive channel scale (equalize's links and residual streams).
inline const OpVersions kMaxPool{"MaxPool", {1, 8, 10, 11, 12, 22}};
inline const OpVersions kAveragePool{"AveragePool", {1, 7, 10, 11, 19, 22}};
// Arithmetic: versions 1 and 6 broadcast only with the `broadcast`/`axis` attributes, which rules emitting these
// ops write; rules that read an Add or Mul as numpy-broadcast take versions 7 and later only.
inline const OpVersions kAdd{"Add", {1, 6, 7, 13, 14}};
inline const OpVersions kSub{"Sub", {1, 6, 7, 13, 14}};
inline const OpVersions kMul{"Mul", {1, 6, 7, 13, 14}};
inline const OpVersions kDiv{"Div", {1, 6, 7, 13, 14}};
// Emitted (and for InstanceNormalization read) by norm-fuse; GroupNormalization-18 is never emitted.
inline const OpVersions kLayerNormalization{"LayerNormalization", {17}};
inline const OpVersions kRmsNormalization{"RMSNormalization", {23}};
inline const OpVersions kGroupNormalization{"GroupNormalization", {18, 21}};
inline const OpVersions kInstanceNormalization{"InstanceNormalization", {1, 6, 22}};
inline const OpVersions kAddNumpyBroadcast{"Add", {7, 13, 14}};
inline const OpVersions kMulNumpyBroadcast{"Mul", {7, 13, 14}};

/// What readAffineLayer reads: the layer ops, and Constant nodes holding weights.
inline std::vector<OpVersions> layerOps() { return {kConv, kConvTranspose, kGemm, kMatMul, kConstant}; }
/// What findLayoutPath looks through.
inline std::vector<OpVersions> layoutOps() {
  return {kIdentity, kTranspose, kReshape, kFlatten, kSqueeze, kUnsqueeze};
}

/// `a` followed by the entries of `b` whose op is not in `a` yet.
inline std::vector<OpVersions> joinOps(std::vector<OpVersions> a, const std::vector<OpVersions>& b) {
  for (const OpVersions& op : b) {
    bool present = false;
    for (const OpVersions& have : a) present = present || have.op == op.op;
    if (!present) a.push_back(op);
  }
  return a;
}

}  // namespace bnfold
