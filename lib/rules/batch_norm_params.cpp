#include "batch_norm_params.h"

#include <cmath>
#include <sstream>

#include "affine_layer.h"
#include "bnfold/dims_text.h"

namespace bnfold::rules {
namespace {

const char* const kParamNames[] = {"scale", "B", "mean", "var"};

std::string formatNumber(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

std::optional<InferenceBatchNorm> fail(MatchFailure* whyNot, ReasonCode code, std::string message) {
  if (whyNot) *whyNot = {code, std::move(message)};
  return std::nullopt;
}

}  // namespace

std::optional<InferenceBatchNorm> readInferenceBatchNorm(const Node& bn, const RuleContext& context,
                                                         PerElementParams perElement, MatchFailure* whyNot) {
  InferenceBatchNorm result;
  result.form = readBatchNormForm(bn, context.opset());
  if (result.form.training)
    return fail(whyNot, reason::kTrainingMode, describe(bn) + " normalizes with batch statistics (" +
                                             result.form.trainingCause + ", " + result.form.formName +
                                             "); only inference-mode BatchNormalization is rewritten");
  if (hasUsedOptionalOutputs(bn))
    return fail(whyNot, reason::kOptionalOutputsUsed,
                describe(bn) + " has optional outputs that are read, so it cannot be removed");

  const Tensor* params[4] = {};
  for (std::size_t i = 0; i < 4; ++i) {
    MatchFailure why;
    const Value* param = bn.input(i + 1);
    params[i] = context.constantOf(param, &why);
    if (!params[i])
      return fail(whyNot, why.code, "BatchNormalization " + std::string(kParamNames[i]) + " of " + describe(bn) +
                                        ": " + why.message);
    if (!isFloatingPoint(params[i]->dataType()))
      return fail(whyNot, reason::kUnsupportedType, "BatchNormalization " + std::string(kParamNames[i]) + " '" +
                                                  param->name() + "' of " + describe(bn) + " is " +
                                                  dataTypeName(params[i]->dataType()));
    result.paramValues.push_back(param);
  }
  if (const Node* kept = keptConstantProducer(context, result.paramValues))
    return fail(whyNot, reason::kParamKeptByUser, "a BatchNormalization parameter of " + describe(bn) +
                                                  " comes from Constant '" + kept->name() +
                                                  "', which is kept by --keep/--keep-op");

  // Every parameter has the scale's dims: [C], or [C, D1, ...] for spatial=0.
  const std::vector<int64_t> dims = params[0]->dims();
  for (std::size_t i = 0; i < 4; ++i) {
    const std::vector<int64_t> paramDims = params[i]->dims();
    const bool rankOk = result.form.spatial ? paramDims.size() == 1 : !paramDims.empty();
    if (!rankOk || paramDims != dims)
      return fail(whyNot, reason::kParamShapeMismatch,
                  "BatchNormalization " + std::string(kParamNames[i]) + " '" + result.paramValues[i]->name() +
                      "' of " + describe(bn) + " has dims " + formatDims(paramDims) + ", expected " +
                      (result.form.spatial ? "[C]" : formatDims(dims)) + " like the scale");
  }
  result.channels = dims[0];
  const bool keepElements = !result.form.spatial && dims.size() > 1 && perElement == PerElementParams::Keep;
  result.paramDims = keepElements ? dims : std::vector<int64_t>{result.channels};

  std::vector<double>* targets[4] = {&result.gamma, &result.beta, &result.mean, &result.var};
  for (std::size_t i = 0; i < 4; ++i) {
    std::vector<double> values = params[i]->toDoubles();
    for (double v : values)
      if (!std::isfinite(v))
        return fail(whyNot, reason::kNonFiniteParams, "BatchNormalization " + std::string(kParamNames[i]) + " '" +
                                                     result.paramValues[i]->name() + "' of " + describe(bn) +
                                                     " holds " + formatNumber(v));
    if (!keepElements && values.size() != static_cast<std::size_t>(result.channels) && result.channels > 0) {
      // spatial=0 with one value per element: a per-channel map only when each channel is uniform.
      const std::size_t block = values.size() / static_cast<std::size_t>(result.channels);
      std::vector<double> reduced(static_cast<std::size_t>(result.channels));
      for (std::size_t c = 0; c < reduced.size(); ++c) {
        reduced[c] = values[c * block];
        for (std::size_t j = 1; j < block; ++j)
          if (values[c * block + j] != reduced[c])
            return fail(whyNot, reason::kSpatialParamsVary,
                        "spatial=0 BatchNormalization " + std::string(kParamNames[i]) + " '" +
                            result.paramValues[i]->name() + "' of " + describe(bn) + " varies within channel " +
                            std::to_string(c) + ", so it is not a per-channel scale and shift");
      }
      values = std::move(reduced);
    }
    *targets[i] = std::move(values);
  }
  result.epsilon = static_cast<double>(result.form.epsilon);
  if (auto element = kernels::findNonPositiveVariance(result.var, result.epsilon))
    return fail(whyNot, reason::kInvalidVariance, describe(bn) + ": var + epsilon = " +
                                                formatNumber(result.var[*element] + result.epsilon) +
                                                " at element " + std::to_string(*element) + " is not positive");
  result.affine = kernels::batchNormAsAffine(result.gamma, result.beta, result.mean, result.var, result.epsilon);
  return result;
}

ReportRecord describeBatchNorm(const Node& bn, const InferenceBatchNorm& params) {
  // Room for a fold's fields (up to 23), its names and the four parameter arrays.
  ReportRecord entry(24, 256, 4 * params.gamma.size());
  entry.setText("bn", bn.name());
  entry.setText("graph", bn.graph()->name());
  entry.setText("bn_form", params.form.formName);
  entry.setNumbers("gamma", params.gamma);
  entry.setNumbers("beta", params.beta);
  entry.setNumbers("mean", params.mean);
  entry.setNumbers("var", params.var);
  entry.setNumber("epsilon", params.epsilon);
  return entry;
}

}  // namespace bnfold::rules
