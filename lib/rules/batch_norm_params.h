#pragma once
// An inference-mode BatchNormalization read as constants, for the rules that remove a BN without a layer
// before it (bn-forward folds it into the layer after it, bn-decompose turns it into Mul + Add). Reading does
// every check such a rewrite needs; the failure codes are those bn-fold reports for the same problems
// (training-mode, params-not-constant, invalid-variance, ...), so a BN left in place reads the same whichever
// rule explains it.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "batch_norm.h"
#include "bnfold/report/report_record.h"
#include "bnfold/rewrite/rule.h"
#include "kernels/fold_math.h"

namespace bnfold::rules {

struct InferenceBatchNorm {
  BatchNormForm form;
  /// scale, B, mean, var: the input values (for the report and keep checks) and their contents.
  std::vector<const Value*> paramValues;
  std::vector<double> gamma, beta, mean, var;
  /// Dims of the parameters as `gamma` holds them: [C], or with per-element (spatial=0) params [C, D1, ...].
  std::vector<int64_t> paramDims;
  int64_t channels = 0;
  double epsilon = 0.0;
  /// y = x * scale + shift, element by element of gamma/beta/mean/var.
  kernels::ChannelAffine affine;
};

/// How to take spatial=0 parameters of shape [C, D1, ...] (one value per element of a sample).
enum class PerElementParams {
  ReducePerChannel,  ///< only when every element of a channel has the same value (else spatial-params-vary)
  Keep,              ///< keep one value per element (Mul/Add can broadcast them as they are)
};

/// Reads `bn` as an inference-mode BatchNormalization with constant, finite parameters and var + eps > 0 in every
/// element. Nullopt with `whyNot` set otherwise (also when a parameter is a kept Constant node or an optional
/// output is read).
std::optional<InferenceBatchNorm> readInferenceBatchNorm(const Node& bn, const RuleContext& context,
                                                         PerElementParams perElement, MatchFailure* whyNot);

/// {"bn", "graph", "bn_form", "gamma", "beta", "mean", "var", "epsilon"}: what a report entry says about the BN.
/// The record has room for the fields a fold or a decomposition adds.
ReportRecord describeBatchNorm(const Node& bn, const InferenceBatchNorm& params);

}  // namespace bnfold::rules
