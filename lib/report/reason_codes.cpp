#include "bnfold/report/reason_codes.h"

namespace bnfold {

const std::vector<ReasonCodeInfo>& reasonCodes() {
  using namespace reason;
  static const std::vector<ReasonCodeInfo> codes = {
      {kActivationNotRelu, "the layer's output goes through no Relu (or another activation) before the next layer (absorb-high-bias)"},
      {kAffineVariesOffAxis, "the norm's scale or bias varies along an axis the layers reading it do not contract (norm-affine-forward)"},
      {kAxesDiffer, "the two means of a decomposed norm reduce different axes (norm-fuse)"},
      {kAxesNotTrailing, "a decomposed norm reduces axes that are not its input's trailing ones (norm-fuse)"},
      {kBnHasOtherConsumers, "the BN's output is read by more than the one layer it would fold into (bn-forward)"},
      {kChannelAxisMismatch, "the BN's channel axis is not the layer's output-channel (or input-channel) axis"},
      {kConstantTooLarge, "a constant chain's evaluation, or a constant a rule would write (norm-fuse's expanded scale or bias), would exceed --max-constant-size"},
      {kEmptyStatistics, "a training-mode BN with empty mean/var has no running statistics to freeze with"},
      {kEpsilonNotScalar, "the epsilon of a decomposed norm is not a single constant value (norm-fuse)"},
      {kExponentNotTwo, "the variance of a decomposed norm averages something other than a square (norm-fuse)"},
      {kFreezeNotRequested, "training-mode BN is frozen only with --freeze-train-bn"},
      {kIdentityAffine, "the norm's scale is 1 and its bias 0: nothing to move (norm-affine-forward)"},
      {kIntermediateHasOtherReaders, "a value inside a decomposed norm is read outside it, or is a graph output (norm-fuse)"},
      {kInvalidVariance, "var + epsilon is zero or negative, so the BN divides by zero or a complex number"},
      {kKeptByUser, "--keep/--keep-op protects the node"},
      {kLayerHasNoBias, "the layer has no bias input and the Add cannot become one (e.g. MatMul of rank > 2)"},
      {kLayerHasOtherConsumers, "the layer's output is read elsewhere too, or is a graph output"},
      {kLayerInOtherGraph, "the layer and the BN (or Add, Mul) are in different graphs (a subgraph and its parent)"},
      {kLayerKeptByUser, "--keep/--keep-op protects the layer (or a Constant holding its weights)"},
      {kLayerPadsInput, "the layer pads its input, so a shift applied before it would reach the padding (bn-forward, absorb-high-bias)"},
      {kMeanCountMismatch, "a decomposed norm's mean scales a sum by another count than the number of elements summed (norm-fuse)"},
      {kMissingInput, "a required input is omitted"},
      {kMissingOutput, "the output is omitted"},
      {kMulMayBroadcastInput, "the Mul could broadcast the layer's output to a bigger shape"},
      {kNoBnStatistics, "no BN statistics are known for the layer's output: none was folded into it, or a later rewrite changed it (absorb-high-bias)"},
      {kNoFoldableConsumer, "the BN's output is not read by a Conv, Gemm or MatMul it could fold into (bn-forward)"},
      {kNoFoldableLayer, "no Conv, ConvTranspose, Gemm or MatMul produces the Add's or Mul's input"},
      {kNoFoldableProducer, "no Conv, ConvTranspose, Gemm or MatMul produces the BN's input (e.g. a Relu between); for equalize, a Concat's input"},
      {kNoHighBias, "no channel's beta lies more than three standard deviations above zero: nothing to absorb (absorb-high-bias)"},
      {kNoRuleEnabled, "no enabled rule handles BatchNormalization (--rules)"},
      {kNonFiniteParams, "a BN parameter holds NaN or infinity"},
      {kNonHomogeneousActivation, "the activation between two layers is not positively homogeneous (Clip/Relu6, HardSwish, Sigmoid, ...) (equalize)"},
      {kNonSpatialTraining, "spatial=0 in training mode (statistics per element) is not expanded"},
      {kNormOpNotInOpset, "the model's opset predates the norm op (LayerNormalization 17, RMSNormalization 23, GroupNormalization 21; also each deprecated GroupNormalization-18) (norm-fuse)"},
      {kNotANormChain, "the ops around the square root differ from every decomposed norm form bnfold fuses (norm-fuse)"},
      {kNotImproving,
       "equalizing the link would not lower its chain's per-tensor int8 weight noise, referred to the chain's output "
       "(equalize)"},
      {kNotPerChannel, "the constant does not broadcast as one value per output channel"},
      {kNotTrainingMode, "the BN is in inference mode, which this rule does not handle"},
      {kOperandNotConstant, "neither operand of the Mul is a constant"},
      {kOptionalOutputsUsed, "the BN's optional outputs (running or saved statistics) are read"},
      {kParamKeptByUser, "--keep/--keep-op protects a Constant holding a BN parameter"},
      {kParamShapeMismatch, "a parameter's shape does not match the channel count"},
      {kParamsNotConstant, "a BN parameter (or the Add's or Mul's constant) is computed at run time"},
      {kParamsOverridable, "a parameter is an initializer that is also a graph input (IR >= 4); see --input-defaults"},
      {kQuantizedWeights, "a weight is computed by DequantizeLinear: quantized weights are not folded into"},
      {kRankTooLow, "the BN's input has rank below 2, where BatchNormalization needs [N, C, ...]"},
      {kRankUnknown, "the rank (or a needed dim) of a tensor on the path is not known"},
      {kReaderContractsOtherAxis, "a layer reading the norm's output contracts another axis than the last (a MatMul's second input, Gemm transA=1) (norm-affine-forward)"},
      {kReaderNotLayer, "the activation's output is not read by one Conv, ConvTranspose, Gemm or MatMul as its data input (equalize); the norm's output is read by another node or is a graph output (norm-affine-forward)"},
      {kResidualAdd, "the output is added to another path (a residual Add), which would need the same scales (equalize) or keep the norm's scale and bias (norm-affine-forward)"},
      {kRunningStatsUndefined, "mean/var are empty, yet the running statistics computed from them are read"},
      {kSavedStatisticsRead, "saved_mean/saved_var are read, which an inference-mode BN does not compute"},
      {kSharedWeights, "a weight or bias the rewrite would change is read by another node too (equalize)"},
      {kSpatialParamsVary, "spatial=0 parameters vary within a channel, which one weight per channel cannot hold"},
      {kTrainingMode, "the BN normalizes with batch statistics (training mode)"},
      {kTypeUnknown, "an element type the rule needs is not known"},
      {kUnexpectedOutput, "the BN declares an output its opset does not have"},
      {kUnsupportedBiasShape, "the layer's bias does not fit its output channels"},
      {kUnsupportedOpset, "the model's opset (or an op's version) is outside what the rule knows"},
      {kUnsupportedType, "an element type other than float, double, float16 or bfloat16"},
      {kUnsupportedWeightShape, "the layer's weight does not fit the layer (e.g. its group count), or has no elements"},
      {kWeightsNotConstant, "the layer's weight or bias is computed at run time"},
  };
  return codes;
}

const std::vector<RetiredReasonCode>& retiredReasonCodes() {
  static const std::vector<RetiredReasonCode> retired = {
      {"bad-param-shape", reason::kParamShapeMismatch, 1},
      {"bad-rank", reason::kRankTooLow, 1},
      {"layer-in-outer-graph", reason::kLayerInOtherGraph, 1},
      {"unknown-rank", reason::kRankUnknown, 1},
      {"unknown-type", reason::kTypeUnknown, 1},
  };
  return retired;
}

std::optional<ReasonCode> findReasonCode(std::string_view spelling) {
  for (const ReasonCodeInfo& info : reasonCodes())
    if (spelling == info.code.str()) return info.code;
  for (const RetiredReasonCode& old : retiredReasonCodes())
    if (spelling == old.spelling) return old.current;
  return std::nullopt;
}

}  // namespace bnfold
