#include "skipped_batch_norms.h"

#include <algorithm>

namespace bnfold {

namespace {

// Whether one of the rules that failed on `node` only because a parameter or weight is an overridable default
// (params-overridable) would rewrite it if such defaults were constants. Matching changes nothing.
bool wouldRewriteWithInputDefaults(const Node& node, const std::vector<RuleFailure>& failures,
                                   const RuleContext& relaxed) {
  for (const RuleFailure& f : failures)
    if (f.failure.code == reason::kParamsOverridable && relaxed.match(*f.rule, node).matched()) return true;
  return false;
}

// Whether `node` is still in the model: not erased, and neither is any node owning a graph around it.
bool isInModel(const Node& node) {
  for (const Node* n = &node; n; n = n->graph()->ownerNode())
    if (n->isErased()) return false;
  return true;
}

}  // namespace

SkippedBatchNorms::SkippedBatchNorms(const std::vector<const Rule*>& rules) {
  for (const Rule* rule : rules) {
    const std::vector<std::string> ops = rule->rootOps();
    if (std::find(ops.begin(), ops.end(), "BatchNormalization") != ops.end()) batchNormIsRoot_ = true;
  }
}

void SkippedBatchNorms::rootVisited(const Node& root, bool fromScan, bool kept, bool rewritten,
                                    const std::vector<RuleFailure>& failures) {
  if (!root.isOnnxOp("BatchNormalization")) return;
  if (root.order() == Node::kUnnumbered) scannedComplete_ = false;  // made by a rewrite
  else if (fromScan) scanned_.push_back(&root);
  if (kept) return;  // reported as kept-by-user, whatever the rules would say
  if (!rewritten) failures_[&root] = failures;
  else if (!failures_.empty()) failures_.erase(&root);
}

void SkippedBatchNorms::record(Model& model, const RuleOptions& options, Report& report) const {
  RuleOptions relaxedOptions = options;
  relaxedOptions.inputDefaultsAreConstant = true;
  const RuleContext context(model, options);
  const RuleContext relaxed(model, relaxedOptions);
  std::vector<const Node*> found;
  const std::vector<const Node*>* batchNorms = &scanned_;
  if (!batchNormIsRoot_ || !scannedComplete_) {
    for (Graph* graph : model.allGraphs())
      for (const auto& node : graph->nodes())
        if (node->isOnnxOp("BatchNormalization")) found.push_back(node.get());
    batchNorms = &found;
  }
  for (const Node* batchNorm : *batchNorms) {
    const Node& node = *batchNorm;
    if (!isInModel(node)) continue;
    nlohmann::json entry = nlohmann::json::object();  // key by key: a braced list costs a copy of each value
    entry["node"] = node.name();
    entry["op"] = node.opType();
    entry["graph"] = node.graph()->name();
    auto it = failures_.find(&node);
    if (context.isKept(node)) {
      entry["reason"] = reason::kKeptByUser.str();
      entry["message"] = "kept by --keep or --keep-op";
    } else if (it == failures_.end() || it->second.empty()) {
      entry["reason"] = reason::kNoRuleEnabled.str();
      entry["message"] = "no enabled rule applies to BatchNormalization";
    } else {
      entry["reason"] = it->second.front().failure.code.str();
      entry["message"] = it->second.front().failure.message;
      nlohmann::json details = nlohmann::json::array();
      for (const RuleFailure& f : it->second)
        details.push_back({{"rule", f.rule->name()}, {"reason", f.failure.code.str()}, {"message", f.failure.message}});
      entry["details"] = std::move(details);
      if (!options.inputDefaultsAreConstant && wouldRewriteWithInputDefaults(node, it->second, relaxed))
        entry["would_fold_with"] = "--input-defaults-are-constant";
    }
    report.add("skipped", std::move(entry));
  }
}

}  // namespace bnfold
