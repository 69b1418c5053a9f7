// Before:     Y, running_mean?, running_var? (, saved_mean?, saved_var?) = BatchNormalization(X, scale, B, mean, var)
//             in training mode
// After:      Y = BatchNormalization(X, scale, B, mean, var) in inference mode (no training_mode; is_test=1 at
//             opsets 1/6; no optional outputs at opsets 7-13); running_mean = Identity(mean), running_var =
//             Identity(var) when read
// Conditions: only with --freeze-train-bn (RuleOptions::freezeTrainingBatchNorm): it changes the function, for
//             models exported in training mode by mistake; mean/var not empty (they are what inference uses);
//             saved_mean/saved_var not read (they are batch statistics, which inference does not compute).
// Math:       Y = (X - mean) / sqrt(var + epsilon) * scale + B with the given running statistics; an inference
//             BN leaves its running statistics as they are. The new BN then folds like any other (bn-fold).

#include "batch_norm.h"
#include "bnfold/rewrite/rewriter.h"
#include "opset_emit.h"
#include "rules.h"
#include "rewrite/understood_ops.h"
#include "rewrite/op_versions.h"

namespace bnfold::rules {
namespace {


bool isRead(const Value* value) { return value && (value->hasUses() || value->isGraphOutput()); }

struct FreezeMatch : Match {
  const Node* bn = nullptr;
  BatchNormForm form;
};

class FreezeTrainingBatchNorm : public Rule {
 public:
  const char* name() const override { return "train-bn-freeze"; }
  const char* summary() const override {
    return "With --freeze-train-bn: turn training-mode BatchNormalization into inference mode (running statistics)";
  }
  std::vector<std::string> rootOps() const override { return {"BatchNormalization"}; }
  std::vector<OpVersions> opVersions() const override { return {kBatchNormalization, kIdentity}; }
  bool verifiesAgainstFrozenBatchNorm() const override { return true; }

  MatchResult match(const Node& bn, const RuleContext& context) const override {
    auto found = std::make_unique<FreezeMatch>();
    found->bn = &bn;
    found->form = readBatchNormForm(bn, context.opset());
    const BatchNormForm& form = found->form;
    if (!form.training) return MatchResult::failure(reason::kNotTrainingMode, "already in inference mode");
    if (!context.options().freezeTrainingBatchNorm)
      return MatchResult::failure(reason::kFreezeNotRequested, "training-mode BN is frozen only with --freeze-train-bn");
    if (form.emptyStatistics)
      return MatchResult::failure(reason::kEmptyStatistics,
                                  "mean/var are empty: there are no running statistics to normalize with");
    if (!bn.input(3) || !bn.input(4)) return MatchResult::failure(reason::kMissingInput, "mean or var is omitted");
    if (isRead(bn.output(3)) || isRead(bn.output(4)))
      return MatchResult::failure(reason::kSavedStatisticsRead,
                                  "saved_mean/saved_var are read: they are batch statistics, which an inference-mode "
                                  "BN does not compute");
    return MatchResult::success(std::move(found));
  }

  void rewrite(Match& base, Rewriter& rewriter) const override {
    const auto& m = static_cast<const FreezeMatch&>(base);
    const Node& bn = *m.bn;
    const int64_t opset = modelOpset(rewriter);
    const std::string oldName = bn.name();
    nlohmann::json outputs = nlohmann::json::array();
    nlohmann::json entry = {{"node", oldName}, {"form", m.form.formName}, {"cause", m.form.trainingCause}};

    // A new node rather than an edit: an inference-mode BN must not declare the optional outputs, and a node's
    // outputs cannot be dropped in place. Readers of the old outputs move over under the same names.
    std::vector<std::pair<const Value*, const Value*>> replacements;
    if (isRead(bn.output(0))) {
      std::vector<onnx::AttributeProto> attributes;
      for (const auto& attribute : bn.proto().attribute())
        if (attribute.name() != "training_mode" && attribute.name() != "is_test") attributes.push_back(attribute);
      if (opset < kBatchNormIsTestRemovedOpset) attributes.push_back(intAttribute("is_test", 1));
      std::vector<const Value*> inputs(bn.inputs().begin(), bn.inputs().end());
      Node* frozen = rewriter.createNode(&bn, "BatchNormalization", inputs, {bn.output(0)->name()}, oldName,
                                         std::move(attributes));
      entry["replacement"] = frozen->name();
      replacements.emplace_back(bn.output(0), frozen->output(0));
    }
    // The running statistics pass through unchanged.
    for (std::size_t slot = 1; slot <= 2; ++slot) {
      if (!isRead(bn.output(slot))) continue;
      Node* identity = rewriter.createNode(&bn, "Identity", {bn.input(slot + 2)}, {bn.output(slot)->name()},
                                           oldName + "/" + (slot == 1 ? "running_mean" : "running_var"));
      replacements.emplace_back(bn.output(slot), identity->output(0));
    }
    for (const auto& [from, to] : replacements) outputs.push_back(from->name());
    entry["outputs"] = outputs;
    entry["change"] = opset >= kBatchNormTrainingModeOpset ? "training_mode removed"
                      : opset >= kBatchNormIsTestRemovedOpset       ? "optional outputs removed"
                                                           : "is_test=1";
    for (const auto& [from, to] : replacements) rewriter.replaceValueKeepingName(from, to);
    if (replacements.empty()) rewriter.eraseNode(&bn);
    rewriter.record("frozen", std::move(entry));
  }
};

}  // namespace

std::unique_ptr<Rule> makeFreezeTrainingBatchNorm() { return std::make_unique<FreezeTrainingBatchNorm>(); }

}  // namespace bnfold::rules
