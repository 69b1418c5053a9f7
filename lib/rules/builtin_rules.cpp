// The explicit list of rules, in priority order: when several rules are rooted at the same op, the first
// that matches wins, and the first one's reason is the one reported for a BatchNormalization left in place.

#include "bnfold/rules/builtin_rules.h"

#include <sstream>
#include <stdexcept>
#include <unordered_set>

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
    list.push_back(rules::makeDecomposeNorm());         // rooted at the other normalizations
    list.push_back(rules::makeFuseNormalization());     // rooted at Div/Mul: a decomposed LayerNorm or RMSNorm
    list.push_back(rules::makeAbsorbAddIntoBias());     // rooted at Add: order does not matter for BN
    list.push_back(rules::makeFoldScaleIntoWeights());  // rooted at Mul
    list.push_back(rules::makeFoldNormAffineForward());  // rooted at LayerNormalization / RMSNormalization
    list.push_back(rules::makeReplaceRelu6WithRelu());  // after the folds' fixed point, before equalize
    list.push_back(rules::makeEqualizeLayers());        // rooted at layers; runs after the others' fixed point
    list.push_back(rules::makeAbsorbHighBias());        // after equalize: reads the statistics as it scaled them
    return list;
  }();
  return rules;
}

const Rule* findRule(const std::string& name) {
  for (const auto& rule : builtinRules())
    if (name == rule->name()) return rule.get();
  return nullptr;
}

std::vector<std::string> parseRuleSelection(const std::string& selection) {
  std::vector<std::string> tokens;
  std::stringstream stream(selection);
  for (std::string token; std::getline(stream, token, ',');) {
    token.erase(0, token.find_first_not_of(" \t"));
    token.erase(token.find_last_not_of(" \t") + 1);
    if (!token.empty()) tokens.push_back(token);
  }
  std::unordered_set<std::string> chosen;
  auto addDefaults = [&] {
    for (const auto& rule : builtinRules())
      if (rule->enabledByDefault()) chosen.insert(rule->name());
  };
  auto requireKnown = [](const std::string& name) {
    if (findRule(name)) return;
    std::string known;
    for (const auto& rule : builtinRules()) known += (known.empty() ? "" : ", ") + std::string(rule->name());
    throw std::invalid_argument("unknown rule '" + name + "' (known rules: " + (known.empty() ? "none" : known) + ")");
  };
  // A selection that starts with a change (+x / -x) changes the defaults.
  if (tokens.empty() || tokens.front()[0] == '+' || tokens.front()[0] == '-') addDefaults();
  for (const std::string& token : tokens) {
    if (token == "none") {
      chosen.clear();
    } else if (token == "default") {
      addDefaults();
    } else if (token == "all") {
      for (const auto& rule : builtinRules()) chosen.insert(rule->name());
    } else if (token[0] == '-') {
      requireKnown(token.substr(1));
      chosen.erase(token.substr(1));
    } else {
      const std::string name = token[0] == '+' ? token.substr(1) : token;
      requireKnown(name);
      chosen.insert(name);
    }
  }
  // norm-decompose undoes what norm-fuse does: asked for both (e.g. "all"), they would rewrite each other's output
  // forever. Asking for the decomposition wins.
  if (chosen.count("norm-decompose")) chosen.erase("norm-fuse");
  std::vector<std::string> ordered;
  for (const auto& rule : builtinRules())
    if (chosen.count(rule->name())) ordered.push_back(rule->name());
  return ordered;
}

}  // namespace bnfold
