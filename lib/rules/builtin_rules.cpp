// The explicit list of rules, in priority order: when several rules are rooted at the same op, the first
// that matches wins, and the first one's reason is the one reported for a BatchNormalization left in place.

#include "bnfold/rewrite/driver.h"
#include "rules.h"

namespace bnfold {

const std::vector<std::unique_ptr<Rule>>& builtinRules() {
  static const std::vector<std::unique_ptr<Rule>> rules = [] {
    std::vector<std::unique_ptr<Rule>> list;
    // Rules are added here as they are written (one .cpp per rule in lib/rules/).
    list.push_back(rules::makeFoldBatchNormIntoLayer());  // first: its reason is the one reported for a BN left
    list.push_back(rules::makeFoldBatchNormForward());    // BN before a layer, when bn-fold found none before it
    // Training-mode BN, after bn-fold (which refuses it); freezing (only with --freeze-train-bn) before expanding.
    list.push_back(rules::makeFreezeTrainingBatchNorm());
    list.push_back(rules::makeExpandTrainingBatchNorm());
    list.push_back(rules::makeDecomposeBatchNorm());      // last among BN rules: only what nothing else handles
    list.push_back(rules::makeAbsorbAddIntoBias());     // rooted at Add: order does not matter for BN
    list.push_back(rules::makeFoldScaleIntoWeights());  // rooted at Mul
    list.push_back(rules::makeEqualizeLayers());        // rooted at layers; runs after the others' fixed point
    return list;
  }();
  return rules;
}

}  // namespace bnfold
