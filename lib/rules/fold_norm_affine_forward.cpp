// Before:     Y = LayerNormalization(X, g, b?)  or  Y = RMSNormalization(X, g);   Z_i = L_i(Y, W_i, B_i?)
//             L_i = MatMul (2-D weight) | Gemm (transA = 0), every reader of Y, each reading it as its data input
// After:      Y = LayerNormalization(X, 1)  /  RMSNormalization(X, 1);          Z_i = L_i(Y, W_i', B_i')
//             (a MatMul that needs a bias becomes a Gemm when its input is 2-D, else gets an Add of the bias)
// Conditions: g and b constant with the readers' element type; g and b vary only along the last axis (the one
//             every L_i contracts), so a LayerNorm over several axes folds only with an affine constant along
//             the others; Y no graph output, read only by such layers in the norm's graph, not kept, with
//             constant weight and bias; not already g = 1 and b = 0.
// Math:       Y = N * g + b over the last axis d, so Y . W = N . (g * W) + b . W:
//             W'[d, :] = g[d] * W[d, :] (the rows, i.e. the input channels; transB handled by the layout)
//             B' = B + alpha * sum_d b[d] * W[d, :]   (original W; Gemm: C' = beta * C + that, beta = 1)
//             The norm keeps scale 1 and drops b, so a weight shared with another node is copied, never edited.

#include <algorithm>
#include <memory>

#include "affine_layer.h"
#include "bnfold/dims_text.h"
#include "bnfold/rewrite/rewriter.h"
#include "kernels/forward_fold_math.h"
#include "opset_emit.h"
#include "rewrite/understood_ops.h"
#include "rules.h"

namespace bnfold::rules {
namespace {

/// How a reader takes the shift b . W.
enum class BiasForm { None, Slot, MatMulToGemm, AddAfterMatMul };

const char* biasFormText(BiasForm form) {
  switch (form) {
    case BiasForm::Slot: return "bias";
    case BiasForm::MatMulToGemm: return "gemm";
    case BiasForm::AddAfterMatMul: return "add";
    case BiasForm::None: break;
  }
  return "none";
}

struct Reader {
  AffineLayer layer;
  BiasForm biasForm = BiasForm::None;
};

struct NormAffine : Match {
  const Node* norm = nullptr;
  const Value* scaleValue = nullptr;
  const Tensor* scale = nullptr;
  const Value* shiftValue = nullptr;  ///< the LayerNorm's B, or null
  kernels::ChannelAffine affine;      ///< g and b, one value per feature of the last axis
  std::vector<Reader> readers;
};

bool allEqual(const std::vector<double>& values, double to) {
  return std::all_of(values.begin(), values.end(), [to](double v) { return v == to; });
}

MatchResult fail(ReasonCode code, std::string message) { return MatchResult::failure(code, std::move(message)); }

class FoldNormAffineForward final : public Rule {
 public:
  const char* name() const override { return "norm-affine-forward"; }
  const char* summary() const override {
    return "Move a LayerNormalization's or RMSNormalization's scale and bias into the MatMul/Gemm layers reading it";
  }
  std::vector<std::string> rootOps() const override { return {"LayerNormalization", "RMSNormalization"}; }
  std::vector<OpVersions> opVersions() const override {
    return joinOps({kLayerNormalization, kRmsNormalization, kAdd}, layerOps());
  }
  const char* failureSection() const override { return "norm_affine_not_forwarded"; }

  MatchResult match(const Node& norm, const RuleContext& context) const override {
    const Value* y = norm.output(0);
    if (!y) return MatchResult::quietFailure(reason::kMissingOutput, describe(norm) + " has no output");
    auto match = std::make_unique<NormAffine>();
    match->norm = &norm;
    MatchFailure why;
    match->scaleValue = norm.input(1);
    if (!match->scaleValue) return fail(reason::kMissingInput, describe(norm) + " has no scale input");
    match->scale = context.constantOf(match->scaleValue, &why);
    if (!match->scale) return fail(why.code, "the scale of " + describe(norm) + " is not usable: " + why.message);
    const Tensor* shift = nullptr;
    if (norm.isOnnxOp("LayerNormalization") && (match->shiftValue = norm.input(2))) {
      shift = context.constantOf(match->shiftValue, &why);
      if (!shift) return fail(why.code, "the bias of " + describe(norm) + " is not usable: " + why.message);
    }
    // What this rule leaves behind, and a norm without an affine part: nothing to move.
    if (allEqual(match->scale->toDoubles(), 1.0) && (!shift || allEqual(shift->toDoubles(), 0.0)))
      return MatchResult::quietFailure(reason::kIdentityAffine, describe(norm) + " has scale 1 and bias 0");
    if (!noKeptConstantProducer(context, {match->scaleValue, match->shiftValue}, &why))
      return fail(reason::kParamKeptByUser, why.message);
    if (y->isGraphOutput())
      return fail(reason::kReaderNotLayer, "the output of " + describe(norm) + " is a graph output, which would "
                                           "lose the scale and bias");
    if (y->uses().empty())
      return MatchResult::quietFailure(reason::kReaderNotLayer, "the output of " + describe(norm) + " is not read");

    for (const auto& use : y->uses()) {
      const Node& reader = *use.node;
      if (reader.isOnnxOp("Add") || reader.isOnnxOp("Sum"))
        return fail(reason::kResidualAdd, "the output of " + describe(norm) + " is also added by " +
                                              describe(reader) + ", which would lose the scale and bias");
      if (!reader.isOnnxOp("MatMul") && !reader.isOnnxOp("Gemm"))
        return fail(reason::kReaderNotLayer, "the output of " + describe(norm) + " is read by " + describe(reader) +
                                                 ", not only by MatMul or Gemm layers");
      if (use.slot != 0 || (reader.isOnnxOp("Gemm") && reader.attributeInt("transA", 0) != 0))
        return fail(reason::kReaderContractsOtherAxis,
                    describe(reader) + " contracts another axis of the output of " + describe(norm) +
                        " than its last (it reads it as input " + std::to_string(use.slot) +
                        (use.slot == 0 ? " with transA=1" : "") + "), along which the scale and bias run");
      if (reader.graph() != norm.graph())
        return fail(reason::kLayerInOtherGraph, describe(reader) + " reads " + describe(norm) + " from another graph");
      auto layer = readLayerForBatchNorm(reader, context, &why);
      if (!layer) return fail(why.code, why.message);
      if (!hasLayerType(*match->scaleValue, *match->scale, *layer, &why) ||
          (shift && !hasLayerType(*match->shiftValue, *shift, *layer, &why)))
        return fail(why.code, why.message);
      match->readers.push_back({std::move(*layer), BiasForm::None});
    }

    const int64_t features = match->readers.front().layer.inputChannels;
    for (const Reader& reader : match->readers)
      if (reader.layer.inputChannels != features)
        return fail(reason::kParamShapeMismatch, describe(*match->readers.front().layer.node) + " reads " +
                                                     std::to_string(features) + " features, " +
                                                     describe(*reader.layer.node) + " " +
                                                     std::to_string(reader.layer.inputChannels));
    auto scale = lastAxisValues(norm, *match->scaleValue, *match->scale, features, &why);
    if (!scale) return fail(why.code, why.message);
    match->affine.scale = std::move(*scale);
    match->affine.shift.assign(static_cast<std::size_t>(features), 0.0);
    if (shift) {
      auto values = lastAxisValues(norm, *match->shiftValue, *shift, features, &why);
      if (!values) return fail(why.code, why.message);
      match->affine.shift = std::move(*values);
    }

    if (!allEqual(match->affine.shift, 0.0))
      for (Reader& reader : match->readers) reader.biasForm = biasFormOf(reader.layer, norm, context);
    return MatchResult::success(std::move(match));
  }

  void rewrite(Match& base, Rewriter& rewriter) const override {
    auto& match = static_cast<NormAffine&>(base);
    const bool scales = !allEqual(match.affine.scale, 1.0);
    // The shift's response is computed from every original weight before any reader changes.
    std::vector<std::vector<double>> responses;
    for (const Reader& reader : match.readers) {
      if (reader.biasForm == BiasForm::None) {
        responses.emplace_back();
        continue;
      }
      const AffineLayer& layer = reader.layer;
      std::vector<double> response = kernels::inputShiftResponse(layer.layout, layer.weight->toDoubles(),
                                                                 layer.weight->dims(), match.affine.shift);
      for (double& r : response) r *= layer.alpha;
      responses.push_back(std::move(response));
    }

    nlohmann::json layers = nlohmann::json::array();
    for (std::size_t i = 0; i < match.readers.size(); ++i) {
      const Reader& reader = match.readers[i];
      const AffineLayer& layer = reader.layer;
      const Node* matMul = layer.node;
      nlohmann::json entry = {{"node", layer.node->name()},
                              {"op", layer.node->opType()},
                              {"weight_before", layer.weightValue->name()},
                              {"bias_before", layer.biasValue ? nlohmann::json(layer.biasValue->name()) : nullptr},
                              {"bias_form", biasFormText(reader.biasForm)}};
      entry["weight_after"] = scales ? writeScaledWeight(rewriter, layer, ChannelSide::Input, match.affine.scale,
                                                         "_norm_scaled")
                                     : layer.weightValue->name();
      entry["bias_after"] = entry["bias_before"];
      switch (reader.biasForm) {
        case BiasForm::None: break;
        case BiasForm::Slot: {
          const std::vector<double> ones(responses[i].size(), 1.0);
          // Non-null: the shift is non-zero here.
          entry["bias_after"] = writeBias(rewriter, layer, *foldedBias(layer, {ones, responses[i]}));
          break;
        }
        case BiasForm::MatMulToGemm: {
          const Node* gemm = replaceMatMulWithGemm(rewriter, layer, responses[i], matMul->output(0));
          entry["bias_after"] = gemm->input(2)->name();
          entry["replaced_by"] = gemm->name();
          break;
        }
        case BiasForm::AddAfterMatMul: {
          const Node* add = addBiasAfterMatMul(rewriter, layer, responses[i]);
          entry["bias_after"] = add->input(1)->name();
          entry["replaced_by"] = add->input(0)->producer()->name();
          entry["bias_add"] = add->name();
          break;
        }
      }
      layers.push_back(std::move(entry));
    }

    const Node* norm = match.norm;
    const Tensor& scale = *match.scale;
    const std::vector<double> ones(static_cast<std::size_t>(scale.elementCount()), 1.0);
    Value* unitScale = addTensor(rewriter, *norm, scale.dataType(), scale.dims(), ones, norm->name() + "_unit_scale");
    rewriter.setInput(norm, 1, unitScale);
    if (match.shiftValue) rewriter.setInput(norm, 2, nullptr);
    rewriter.record("norm_affine_forwarded",
                    {{"node", norm->name()},
                     {"op", norm->opType()},
                     {"scale", match.scaleValue->name()},
                     {"bias", match.shiftValue ? nlohmann::json(match.shiftValue->name()) : nullptr},
                     {"scale_after", unitScale->name()},
                     {"features", match.affine.scale.size()},
                     {"layers", std::move(layers)}});
  }

 private:
  /// The constant's value per feature of the last axis, when it varies along no other axis (it broadcasts over
  /// the normalized axes, which end with the last one).
  static std::optional<std::vector<double>> lastAxisValues(const Node& norm, const Value& value, const Tensor& tensor,
                                                           int64_t features, MatchFailure* whyNot) {
    const auto dims = tensor.dims();
    if (!dims.empty() && dims.back() != 1 && dims.back() != features) {
      *whyNot = {reason::kParamShapeMismatch, "'" + value.name() + "' of " + describe(norm) + " has dims " +
                                                  formatDims(dims) + ", the layers reading it " +
                                                  std::to_string(features) + " features"};
      return std::nullopt;
    }
    const int64_t rank = std::max<int64_t>(static_cast<int64_t>(dims.size()), 1);
    MatchFailure why;
    auto values = perChannelConstant(value, tensor, rank, rank - 1, features, &why);
    if (!values)
      *whyNot = {reason::kAffineVariesOffAxis, why.message + "; the layers reading " + describe(norm) +
                                                   " contract only its last axis"};
    return values;
  }

  /// A MatMul takes a bias as a Gemm when its input is known to be 2-D, else through an Add after it.
  static BiasForm biasFormOf(const AffineLayer& layer, const Node& norm, const RuleContext& context) {
    if (!layer.isMatMul()) return BiasForm::Slot;
    for (const Value* sameShape : {norm.output(0), norm.input(0)})
      if (auto shape = context.knownShape(*sameShape); shape && shape->size() == 2) return BiasForm::MatMulToGemm;
    return BiasForm::AddAfterMatMul;
  }
};

}  // namespace

std::unique_ptr<Rule> makeFoldNormAffineForward() { return std::make_unique<FoldNormAffineForward>(); }

}  // namespace bnfold::rules
