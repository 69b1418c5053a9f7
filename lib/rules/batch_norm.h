#pragma once
// What a BatchNormalization node means at the model's opset: inference or training, epsilon, momentum,
// spatial. Shared by every rule rooted at BatchNormalization. See shared ONNX notes: the attributes that say
// "training" differ at opsets 1/6 (is_test), 7/9 (optional outputs present) and 14/15 (training_mode).

#include <cstdint>
#include <string>

#include "bnfold/ir/graph.h"

namespace bnfold::rules {

struct BatchNormForm {
  int64_t opset = 0;        ///< the model's ai.onnx opset
  bool training = false;    ///< normalizes with statistics computed from the batch
  bool emptyStatistics = false;  ///< mean/var inputs are empty tensors (TensorFlow FusedBatchNorm style)
  bool spatial = true;      ///< false: params have one value per element of a sample ([C, D1, ...]), opset <= 7
  float epsilon = 1e-5f;
  float momentum = 0.9f;
  /// Which attribute or structure made it training mode, for reports ("training_mode=1", "is_test=0",
  /// "optional outputs present", "empty mean/var").
  std::string trainingCause;
  /// Short name of the opset form: "opset-6 (is_test)", "opset-9", "opset-15 (training_mode)", ...
  std::string formName;
};

/// Reads the form of a BatchNormalization node. `opset` is the model's ai.onnx opset.
BatchNormForm readBatchNormForm(const Node& node, int64_t opset);

/// True when any of the optional outputs (index >= 1) exists and is read or is a graph output.
bool hasUsedOptionalOutputs(const Node& node);

}  // namespace bnfold::rules
