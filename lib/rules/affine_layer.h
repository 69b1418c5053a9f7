#pragma once
// A Conv / ConvTranspose / Gemm / MatMul node seen as a layer whose output channels (and input channels) can be
// rescaled and shifted by rewriting its constant weight and bias. Shared by the rules that move a per-channel
// Add, Mul or BatchNormalization into such a layer (bias-add, scale-fold, bn-forward).
//
// Reading (`readAffineLayer`) does every check a rewrite needs — constant weight and bias, floating type, dims
// that fit the op's layout, the layer not kept by the user — so the rules' `rewrite` cannot fail. Writing never
// touches an existing tensor: new values always go into a new initializer.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bnfold/rewrite/rewriter.h"
#include "bnfold/rewrite/rule.h"
#include "kernels/fold_math.h"

namespace bnfold::rules {

struct AffineLayer {
  const Node* node = nullptr;
  kernels::WeightLayout layout;
  const Value* weightValue = nullptr;
  const Tensor* weight = nullptr;
  /// Input slot of the bias (Conv/ConvTranspose B, Gemm C); -1 when the op has none (MatMul).
  int biasSlot = -1;
  /// The bias input and its tensor; null when the input is omitted.
  const Value* biasValue = nullptr;
  const Tensor* bias = nullptr;
  int64_t outputChannels = 0;
  int64_t inputChannels = 0;
  /// Rank of the layer's output when known (Conv/ConvTranspose: the weight's rank; Gemm: 2; MatMul: the rank of
  /// its first input when known), else -1.
  int64_t outputRank = -1;
  /// Gemm attributes (1, 1, false for the other ops).
  double alpha = 1.0;
  double beta = 1.0;
  bool transA = false;

  DataType type() const { return weight->dataType(); }
  bool isMatMul() const { return layout.kind == kernels::WeightKind::MatMul; }
  bool isGemm() const { return layout.kind == kernels::WeightKind::Gemm; }
  /// Conv or ConvTranspose: channels on axis 1 of an N-D tensor, not on a matrix's last axis.
  bool isSpatial() const { return !isGemm() && !isMatMul(); }
  /// The output axis holding the channels: 1, or the last axis for MatMul (needs a known outputRank).
  int64_t outputChannelAxis() const { return isMatMul() ? outputRank - 1 : 1; }
};

/// Conv, ConvTranspose, Gemm or MatMul of the standard ONNX domain.
bool isAffineLayerOp(const Node& node);

/// Reads `node` as a layer, or returns nullopt with `whyNot` set (not a layer op, kept by the user, weight or
/// bias not constant, non-floating type, dims that do not fit the op).
std::optional<AffineLayer> readAffineLayer(const Node& node, const RuleContext& context, MatchFailure* whyNot);

/// readAffineLayer's reason as said of a layer that another node's rule looked at: a kept layer gets its own code,
/// and a weight computed at run time is said as such.
MatchFailure asLayerFailure(MatchFailure why);

/// readAffineLayer for a rule rooted at a BatchNormalization, which also refuses a layer whose weight or bias
/// comes from a Constant node the user asked to keep. Its reasons are said as such a rule says them: the driver
/// reports the BN as kept-by-user, so a kept layer gets its own code, and a weight computed at run time is not a
/// BN parameter.
std::optional<AffineLayer> readLayerForBatchNorm(const Node& node, const RuleContext& context, MatchFailure* whyNot);

/// The constant operand's values, one per channel, when combining it element-wise (numpy broadcasting, shapes
/// aligned from the last axis) with a tensor of rank `rank` whose `channels` channels are on `channelAxis`
/// acts per channel and leaves that tensor's shape unchanged. Otherwise nullopt with `whyNot` saying which axis
/// the constant runs along.
std::optional<std::vector<double>> perChannelConstant(const Value& constantValue, const Tensor& constant,
                                                      int64_t rank, int64_t channelAxis, int64_t channels,
                                                      MatchFailure* whyNot);

/// The bias after the layer's output channel c is mapped to out * affine.scale[c] + affine.shift[c] (the weights
/// are scaled separately), with the Gemm `beta` to set next to it. Nullopt when the layer has no bias and the
/// shift is all zero (nothing to write). Requires a layer with a bias slot.
std::optional<kernels::GemmBiasFold> foldedBias(const AffineLayer& layer, const kernels::ChannelAffine& affine);

/// Writes `bias` as a new initializer, points the layer's bias slot at it and sets Gemm's beta to 1 when needed
/// (and broadcast=1 before opset 7, where Gemm broadcasts C only when told).
/// Returns the new tensor's name.
std::string writeBias(Rewriter& rewriter, const AffineLayer& layer, const kernels::GemmBiasFold& bias);

/// A 2-D MatMul has no bias input, a Gemm has one: Gemm(A, B, bias) named "<MatMul>_gemm", made before the MatMul
/// `layer` from its current inputs, with `bias` as a new [N] initializer "<MatMul>_bias" (broadcast=1 before
/// opset 7). The Gemm's output takes over `replaced`, with its name: the MatMul's output, or a value computed from
/// it (an Add of the bias) that the Gemm now computes. Returns the Gemm.
Node* replaceMatMulWithGemm(Rewriter& rewriter, const AffineLayer& layer, const std::vector<double>& bias,
                            const Value* replaced);

/// A MatMul of any rank takes a bias through an Add after it: MatMul(A, B) named after `layer`'s MatMul, then
/// Add(that, bias) with `bias` as a new [N] initializer "<MatMul>_bias" (broadcast=1 before opset 7), whose output
/// takes over the MatMul's output and its name. Returns the Add.
Node* addBiasAfterMatMul(Rewriter& rewriter, const AffineLayer& layer, const std::vector<double>& bias);

/// Which channels of a layer a per-channel factor applies to.
enum class ChannelSide { Output, Input };

/// Writes the layer's weights multiplied by scale[c] along its output or input channels (see
/// kernels::scaleOutputChannels / scaleInputChannels) as a new initializer, and points the layer at it. The
/// products are computed when the tensor is read or saved, not here. Returns the new name.
std::string writeScaledWeight(Rewriter& rewriter, const AffineLayer& layer, ChannelSide side,
                              std::vector<double> scale, const std::string& suffix);

/// The names writeBias and writeScaledWeight ask the model for (it makes them unique).
std::string biasNameHint(const AffineLayer& layer);
std::string scaledWeightNameHint(const AffineLayer& layer, const std::string& suffix);

/// A new initializer in `anchor`'s graph holding `values` rounded once to `type`.
Value* addTensor(Rewriter& rewriter, const Node& anchor, DataType type, std::vector<int64_t> dims,
                 const std::vector<double>& values, const std::string& nameHint);

/// The first of `values` produced by a Constant node the user asked to keep (the rewrite would drop it once its
/// last reader is gone), or null.
const Node* keptConstantProducer(const RuleContext& context, const std::vector<const Value*>& values);

/// True when no value of `values` comes from a Constant node the user asked to keep; else false with `whyNot`
/// saying which (kept-by-user).
bool noKeptConstantProducer(const RuleContext& context, const std::vector<const Value*>& values,
                            MatchFailure* whyNot);

/// True when the constant operand `constant` (holding `tensor`) that a rule merges into `layer` has the layer's
/// element type; else false with `whyNot` saying both (unsupported-type).
bool hasLayerType(const Value& constant, const Tensor& tensor, const AffineLayer& layer, MatchFailure* whyNot);

/// The consumer of `value` when it is read exactly once, by one node, and is not a graph output; else null.
const Node* soleConsumer(const Value& value, int* slot = nullptr);

/// Which input of a binary node (0 or 1) is produced by an affine layer with the other one constant; tries slot 0
/// first so Add(X, c) and Add(c, X) both work. -1 when neither is.
int layerOperandSlot(const Node& binary, const RuleContext& context);

}  // namespace bnfold::rules
