#include "affine_layer.h"

#include <algorithm>

#include "bnfold/dims_text.h"
#include "opset_emit.h"
#include "scaled_weight.h"

namespace bnfold::rules {

namespace {

std::optional<AffineLayer> fail(MatchFailure* whyNot, ReasonCode code, std::string message) {
  if (whyNot) *whyNot = {code, std::move(message)};
  return std::nullopt;
}

bool allZero(const std::vector<double>& values) {
  return std::all_of(values.begin(), values.end(), [](double v) { return v == 0.0; });
}

}  // namespace

bool isAffineLayerOp(const Node& node) {
  return node.isOnnxOp("Conv") || node.isOnnxOp("ConvTranspose") || node.isOnnxOp("Gemm") || node.isOnnxOp("MatMul");
}

std::optional<AffineLayer> readAffineLayer(const Node& node, const RuleContext& context, MatchFailure* whyNot) {
  if (!isAffineLayerOp(node))
    return fail(whyNot, reason::kNoFoldableLayer, "'" + node.name() + "' (" + node.opType() + ") is not a Conv, "
                                             "ConvTranspose, Gemm or MatMul");
  if (context.isKept(node))
    return fail(whyNot, reason::kKeptByUser, "layer '" + node.name() + "' is kept by --keep or --keep-op");

  AffineLayer layer;
  layer.node = &node;
  const std::string& op = node.opType();
  if (op == "Conv") {
    layer.layout.kind = kernels::WeightKind::Conv;
  } else if (op == "ConvTranspose") {
    layer.layout.kind = kernels::WeightKind::ConvTranspose;
  } else if (op == "Gemm") {
    layer.layout.kind = kernels::WeightKind::Gemm;
  } else {
    layer.layout.kind = kernels::WeightKind::MatMul;
  }
  layer.layout.group = node.attributeInt("group", 1);
  layer.layout.transB = node.attributeInt("transB", 0) != 0;
  if (layer.isGemm()) {
    layer.alpha = node.attributeFloat("alpha", 1.0f);
    layer.beta = node.attributeFloat("beta", 1.0f);
    layer.transA = node.attributeInt("transA", 0) != 0;
  }

  layer.weightValue = node.input(1);
  MatchFailure why;
  layer.weight = context.constantOf(layer.weightValue, &why);
  if (!layer.weight)
    return fail(whyNot, why.code, "the weight of '" + node.name() + "' is not usable: " + why.message);
  if (!isFloatingPoint(layer.weight->dataType()))
    return fail(whyNot, reason::kUnsupportedType, "the weight of '" + node.name() + "' has type " +
                                                dataTypeName(layer.weight->dataType()) +
                                                "; only float, double, float16 and bfloat16 are rewritten");
  const auto dims = layer.weight->dims();
  const auto outputs = kernels::outputChannelCount(layer.layout, dims);
  const auto inputs = kernels::inputChannelCount(layer.layout, dims);
  if (!outputs || !inputs)
    return fail(whyNot, reason::kUnsupportedWeightShape, "the weight of '" + node.name() + "' has dims " +
                                                        formatDims(dims) + ", which do not fit " + op +
                                                        " (group " + std::to_string(layer.layout.group) + ")");
  // A weight without elements has nothing to rewrite, and its dims are not backed by data: a file may claim
  // 2^56 channels for it, which per-channel vectors must never be sized by.
  if (layer.weight->elementCount() == 0)
    return fail(whyNot, reason::kUnsupportedWeightShape, "the weight of '" + node.name() + "' has dims " +
                                                        formatDims(dims) + ": no elements");
  layer.outputChannels = *outputs;
  layer.inputChannels = *inputs;

  if (layer.isMatMul()) {
    if (const Value* input = node.input(0))
      if (auto shape = context.knownShape(*input); shape && !shape->empty())
        layer.outputRank = static_cast<int64_t>(shape->size());
  } else {
    layer.biasSlot = 2;
    layer.outputRank = layer.isGemm() ? 2 : layer.weight->rank();
  }

  if (layer.biasSlot >= 0 && (layer.biasValue = node.input(static_cast<std::size_t>(layer.biasSlot)))) {
    layer.bias = context.constantOf(layer.biasValue, &why);
    if (!layer.bias)
      return fail(whyNot, why.code, "the bias of '" + node.name() + "' is not usable: " + why.message);
    const auto biasDims = layer.bias->dims();
    const bool fits = layer.isGemm() ? kernels::isGemmBiasShape(biasDims, layer.outputChannels)
                                     : biasDims.size() == 1 && biasDims[0] == layer.outputChannels;
    if (!fits)
      return fail(whyNot, reason::kUnsupportedBiasShape, "the bias of '" + node.name() + "' has dims " +
                                                        formatDims(biasDims) + ", which do not fit " +
                                                        std::to_string(layer.outputChannels) + " output channels");
    if (layer.bias->dataType() != layer.weight->dataType())
      return fail(whyNot, reason::kUnsupportedType, "the bias of '" + node.name() + "' has type " +
                                                  dataTypeName(layer.bias->dataType()) + ", the weight " +
                                                  dataTypeName(layer.weight->dataType()));
  }
  return layer;
}

std::optional<std::vector<double>> perChannelConstant(const Value& constantValue, const Tensor& constant,
                                                      int64_t rank, int64_t channelAxis, int64_t channels,
                                                      MatchFailure* whyNot) {
  auto failWith = [&](const std::string& problem) -> std::optional<std::vector<double>> {
    if (whyNot) *whyNot = {reason::kNotPerChannel, "constant '" + constantValue.name() + "' " + problem};
    return std::nullopt;
  };
  const auto dims = constant.dims();
  const auto constRank = static_cast<int64_t>(dims.size());
  const std::string shapeText = formatDims(dims);
  if (!isFloatingPoint(constant.dataType()))
    return failWith("has type " + dataTypeName(constant.dataType()) + ", not a floating type");
  if (constRank > rank)
    return failWith("of shape " + shapeText + " has a higher rank than the rank-" + std::to_string(rank) +
                    " tensor it is combined with, so it would broadcast that tensor to a bigger shape");
  // Shapes align from the last axis: constant axis i meets tensor axis i + offset.
  const int64_t offset = rank - constRank;
  for (int64_t i = 0; i < constRank; ++i) {
    const int64_t d = dims[static_cast<std::size_t>(i)];
    if (d == 1) continue;
    const int64_t axis = i + offset;
    if (axis != channelAxis)
      return failWith("of shape " + shapeText + " broadcasts along axis " + std::to_string(axis) + " of the rank-" +
                      std::to_string(rank) + " tensor (shapes align from the last axis), not along the channel "
                      "axis " + std::to_string(channelAxis));
    if (d != channels)
      return failWith("of shape " + shapeText + " has " + std::to_string(d) + " entries on the channel axis, but "
                      "there are " + std::to_string(channels) + " channels");
  }
  auto values = kernels::perChannelValues(rank, channelAxis, channels, dims, constant.toDoubles());
  if (!values) return failWith("of shape " + shapeText + " is not per-channel");
  return values;
}

std::optional<kernels::GemmBiasFold> foldedBias(const AffineLayer& layer, const kernels::ChannelAffine& affine) {
  if (layer.isGemm()) {
    if (!layer.bias || layer.beta == 0.0) {
      // C absent or multiplied by 0: only the shift remains, and nothing at all when it is zero.
      if (allZero(affine.shift)) return std::nullopt;
      return kernels::foldGemmBias(affine);
    }
    return kernels::foldGemmBias(layer.bias->toDoubles(), layer.bias->dims(), layer.beta, affine);
  }
  if (!layer.bias) {
    if (allZero(affine.shift)) return std::nullopt;
    return kernels::GemmBiasFold{kernels::foldBias(affine), {layer.outputChannels}, 1.0};
  }
  return kernels::GemmBiasFold{kernels::foldBias(layer.bias->toDoubles(), affine), {layer.outputChannels}, 1.0};
}

Value* addTensor(Rewriter& rewriter, const Node& anchor, DataType type, std::vector<int64_t> dims,
                 const std::vector<double>& values, const std::string& nameHint) {
  return rewriter.addInitializer(*anchor.graph(), Tensor::fromDoubles("", type, std::move(dims), values), nameHint);
}

std::string biasNameHint(const AffineLayer& layer) {
  return layer.biasValue ? layer.biasValue->name() + "_folded" : layer.node->name() + "_bias";
}

std::string scaledWeightNameHint(const AffineLayer& layer, const std::string& suffix) {
  return layer.weightValue->name() + suffix;
}

std::string writeBias(Rewriter& rewriter, const AffineLayer& layer, const kernels::GemmBiasFold& bias) {
  Value* value = addTensor(rewriter, *layer.node, layer.type(), bias.dims, bias.values, biasNameHint(layer));
  rewriter.setInput(layer.node, layer.biasSlot, value);
  if (layer.isGemm() && layer.beta != 1.0) {
    onnx::AttributeProto beta;
    beta.set_name("beta");
    beta.set_type(onnx::AttributeProto::FLOAT);
    beta.set_f(static_cast<float>(bias.beta));
    rewriter.setAttribute(layer.node, std::move(beta));
  }
  if (layer.isGemm())
    for (onnx::AttributeProto& attribute : broadcastAttributes(modelOpset(rewriter)))
      rewriter.setAttribute(layer.node, std::move(attribute));
  return value->name();
}

Node* replaceMatMulWithGemm(Rewriter& rewriter, const AffineLayer& layer, const std::vector<double>& bias,
                            const Value* replaced) {
  const Node* matMul = layer.node;
  Value* biasValue = addTensor(rewriter, *matMul, layer.type(), {layer.outputChannels}, bias, matMul->name() + "_bias");
  Node* gemm = rewriter.createNode(matMul, "Gemm", {matMul->input(0), matMul->input(1), biasValue},
                                   {matMul->output(0)->name()}, matMul->name() + "_gemm",
                                   broadcastAttributes(modelOpset(rewriter)));
  rewriter.replaceValueKeepingName(replaced, gemm->output(0));
  return gemm;
}

Node* addBiasAfterMatMul(Rewriter& rewriter, const AffineLayer& layer, const std::vector<double>& bias) {
  const Node* matMul = layer.node;
  Value* biasValue = addTensor(rewriter, *matMul, layer.type(), {layer.outputChannels}, bias, matMul->name() + "_bias");
  const Node* product = rewriter.createNode(matMul, "MatMul", {matMul->input(0), matMul->input(1)},
                                            {matMul->output(0)->name() + "_unbiased"}, matMul->name());
  Node* add = rewriter.createNode(matMul, "Add", {product->output(0), biasValue}, {matMul->output(0)->name()},
                                  matMul->name() + "_bias_add", broadcastAttributes(modelOpset(rewriter)));
  rewriter.replaceValueKeepingName(matMul->output(0), add->output(0));
  return add;
}

std::string writeScaledWeight(Rewriter& rewriter, const AffineLayer& layer, ChannelSide side,
                              std::vector<double> scale, const std::string& suffix) {
  const auto dims = layer.weight->dims();
  // readAffineLayer checked that the dims fit the layout.
  const kernels::ChannelIndexing indexing = side == ChannelSide::Output
                                                ? *kernels::outputChannelIndexing(layer.layout, dims)
                                                : *kernels::inputChannelIndexing(layer.layout, dims);
  auto bytes = scaledChannelBytes(layer.weight->byteSource(), layer.type(), indexing, std::move(scale));
  Value* value = rewriter.addInitializer(*layer.node->graph(), Tensor::deferred("", layer.type(), dims, std::move(bytes)),
                                         scaledWeightNameHint(layer, suffix));
  rewriter.setInput(layer.node, 1, value);
  return value->name();
}

const Node* keptConstantProducer(const RuleContext& context, const std::vector<const Value*>& values) {
  for (const Value* value : values) {
    if (!value) continue;
    const Node* producer = value->producer();
    if (producer && producer->isOnnxOp("Constant") && context.isKept(*producer)) return producer;
  }
  return nullptr;
}

bool noKeptConstantProducer(const RuleContext& context, const std::vector<const Value*>& values,
                            MatchFailure* whyNot) {
  const Node* kept = keptConstantProducer(context, values);
  if (kept && whyNot)
    *whyNot = {reason::kKeptByUser, "Constant node '" + kept->name() + "' is kept by --keep or --keep-op and would be "
                                    "removed"};
  return !kept;
}

bool hasLayerType(const Value& constant, const Tensor& tensor, const AffineLayer& layer, MatchFailure* whyNot) {
  if (tensor.dataType() == layer.type()) return true;
  if (whyNot)
    *whyNot = {reason::kUnsupportedType, "constant '" + constant.name() + "' has type " +
                                             dataTypeName(tensor.dataType()) + ", the layer " +
                                             dataTypeName(layer.type())};
  return false;
}

const Node* soleConsumer(const Value& value, int* slot) {
  if (value.isGraphOutput() || value.uses().size() != 1) return nullptr;
  if (slot) *slot = value.uses().front().slot;
  return value.uses().front().node;
}

int layerOperandSlot(const Node& binary, const RuleContext& context) {
  for (int slot = 0; slot < 2; ++slot) {
    const Value* operand = binary.input(static_cast<std::size_t>(slot));
    const Value* other = binary.input(static_cast<std::size_t>(1 - slot));
    if (!operand || !other || !operand->producer() || !isAffineLayerOp(*operand->producer())) continue;
    if (context.constantOf(other)) return slot;
  }
  return -1;
}

MatchFailure asLayerFailure(MatchFailure why) {
  if (why.code == reason::kKeptByUser) why.code = reason::kLayerKeptByUser;
  if (why.code == reason::kParamsNotConstant) why.code = reason::kWeightsNotConstant;
  return why;
}

std::optional<AffineLayer> readLayerForBatchNorm(const Node& node, const RuleContext& context, MatchFailure* whyNot) {
  MatchFailure why;
  std::optional<AffineLayer> layer = readAffineLayer(node, context, &why);
  if (!layer) {
    why = asLayerFailure(std::move(why));
    return fail(whyNot, why.code, std::move(why.message));
  }
  if (const Node* kept = keptConstantProducer(context, {layer->weightValue, layer->biasValue}))
    return fail(whyNot, reason::kLayerKeptByUser, "a weight of " + describe(node) + " comes from Constant '" +
                                                      kept->name() + "', which is kept by --keep/--keep-op");
  return layer;
}

}  // namespace bnfold::rules
