#include "batch_norm.h"
#include "rewrite/op_versions.h"

namespace bnfold::rules {

namespace {
bool isEmptyConstant(const Value* value) {
  if (!value) return false;
  const Tensor* tensor = value->constantTensor();
  return tensor && tensor->elementCount() == 0;
}
}  // namespace

bool hasUsedOptionalOutputs(const Node& node) {
  for (std::size_t i = 1; i < node.outputs().size(); ++i) {
    const Value* output = node.output(i);
    if (output && (output->hasUses() || output->isGraphOutput())) return true;
  }
  return false;
}

BatchNormForm readBatchNormForm(const Node& node, int64_t opset) {
  BatchNormForm form;
  form.opset = opset;
  form.epsilon = node.attributeFloat("epsilon", 1e-5f);
  form.momentum = node.attributeFloat("momentum", 0.9f);
  if (opset < kBatchNormIsTestRemovedOpset) {
    form.formName = "opset-" + std::to_string(opset < 6 ? 1 : 6) + " (is_test)";
    // is_test defaults to 0: without it the node normalizes with batch statistics.
    if (node.attributeInt("is_test", 0) == 0) {
      form.training = true;
      form.trainingCause = "is_test=0";
    }
    form.spatial = node.attributeInt("spatial", 1) != 0;
  } else if (opset < kBatchNormTrainingModeOpset) {
    form.formName = opset < kBatchNormSpatialRemovedOpset ? "opset-7" : "opset-9";
    // Opsets 7-13 have no attribute for it: training mode is signalled by the optional outputs.
    std::size_t declared = 0;
    for (std::size_t i = 1; i < node.outputs().size(); ++i) declared += node.output(i) != nullptr;
    if (declared > 0) {
      form.training = true;
      form.trainingCause = "optional outputs present";
    }
    if (opset < kBatchNormSpatialRemovedOpset) form.spatial = node.attributeInt("spatial", 1) != 0;
  } else {
    form.formName = "opset-" + std::to_string(opset < kBatchNormMixedTypesOpset ? 14 : 15) + " (training_mode)";
    if (node.attributeInt("training_mode", 0) != 0) {
      form.training = true;
      form.trainingCause = "training_mode=1";
    }
  }
  if (isEmptyConstant(node.input(3)) || isEmptyConstant(node.input(4))) {
    form.emptyStatistics = true;
    if (!form.training) {
      form.training = true;
      form.trainingCause = "empty mean/var";
    }
  }
  return form;
}

}  // namespace bnfold::rules
