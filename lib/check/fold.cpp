// The composition above the generic driver: the built-in rules chosen by name, --verify and the report's skipped
// BatchNormalization entries plugged in as observers, and the test-only fault hook (fold_testing.h).

#include "bnfold/check/fold.h"

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <stdexcept>

#include "bnfold/rewrite/driver.h"
#include "bnfold/rewrite/pre_activation_statistics.h"
#include "fold_testing.h"
#include "skipped_batch_norms.h"
#include "verify/rewrite_verifier.h"

namespace bnfold {

namespace {

std::vector<const Rule*> rulesNamed(const std::vector<std::string>& names) {
  std::vector<const Rule*> rules;
  for (const std::string& name : names)
    if (!findRule(name)) throw std::invalid_argument("unknown rule '" + name + "'");
  for (const auto& rule : builtinRules())  // priority order, whatever the order of the names
    if (std::find(names.begin(), names.end(), rule->name()) != names.end()) rules.push_back(rule.get());
  return rules;
}

// Records the match failures of each rule that has a Rule::failureSection (those not quiet) in that section, one
// entry per node.
class FailureSections final : public DriverObserver {
 public:
  explicit FailureSections(Report& report) : report_(report) {}
  void rootVisited(const Node& root, bool /*fromScan*/, bool /*kept*/, bool /*rewritten*/,
                   const std::vector<RuleFailure>& failures) override {
    for (const RuleFailure& failure : failures) {
      const char* section = failure.rule->failureSection();
      if (!section || failure.failure.quiet || !logged_.insert({&root, section}).second) continue;
      report_.add(section, nlohmann::json{{"rule", failure.rule->name()},
                                          {"node", root.name()},
                                          {"op", root.opType()},
                                          {"reason", failure.failure.code.str()},
                                          {"message", failure.failure.message}});
    }
  }

 private:
  Report& report_;
  std::set<std::pair<const Node*, std::string>> logged_;  // one entry per node and section
};

void fold(Model& model, const DriverOptions& options, const FaultInjector& injectFault, Report& report) {
  report.setOpset(model.opsetVersion(""));
  report.setRules(options.rules);
  report.setReorderedGraphs(model.reorderedGraphs());
  // Rules that run once the others reached their fixed point (Rule::runsAfterFixedPoint): a run of the driver
  // each, each root visited once.
  std::vector<const Rule*> rules;
  std::vector<const Rule*> lateRules;
  for (const Rule* rule : rulesNamed(options.rules)) (rule->runsAfterFixedPoint() ? lateRules : rules).push_back(rule);

  RewriteDriverOptions driverOptions;
  driverOptions.ruleOptions = options.ruleOptions;
  driverOptions.maxRewrites = options.maxRewrites;
  SkippedBatchNorms skipped(rules);
  driverOptions.observers.push_back(&skipped);
  FailureSections failureSections(report);
  driverOptions.observers.push_back(&failureSections);
  std::optional<verify::RewriteVerifier> verifier;
  if (options.verify || injectFault) {
    verifier.emplace(model, report, options.verify, options.verifySeed, injectFault);
    driverOptions.observers.push_back(&*verifier);
    driverOptions.listeners.push_back(&verifier->recorder());
  }
  // What bn-fold learns of the layers' output channels serves the late rules (high-bias absorption).
  const auto readsStatistics = [](const Rule* rule) { return rule->readsPreActivationStatistics(); };
  PreActivationStatistics statistics(std::any_of(lateRules.begin(), lateRules.end(), readsStatistics) ||
                                     std::any_of(rules.begin(), rules.end(), readsStatistics));
  driverOptions.statistics = &statistics;
  driveRules(model, rules, driverOptions, report);
  if (!lateRules.empty()) {
    driverOptions.revisitTouched = false;
    // The skipped BatchNormalization entries are those of the first run.
    driverOptions.observers.erase(std::find(driverOptions.observers.begin(), driverOptions.observers.end(), &skipped));
    // One run per late rule, in priority order: a later one (absorb-high-bias) sees the whole model as the earlier
    // one (equalize) left it, where one run would let only the first matching rule rewrite each root.
    for (const Rule* rule : lateRules) driveRules(model, {rule}, driverOptions, report);
  }
  if (verifier) verifier->recordSummary();
  skipped.record(model, options.ruleOptions, report);
}

}  // namespace

void runRules(Model& model, const DriverOptions& options, Report& report) { fold(model, options, {}, report); }

void runRulesInjectingFaults(Model& model, const DriverOptions& options, const FaultInjector& injectFault,
                             Report& report) {
  fold(model, options, injectFault, report);
}

std::string InputDefaultsHint::message() const {
  if (wouldFold == 0) return "";
  std::string text = std::to_string(wouldFold) + " BatchNormalization would fold with --input-defaults-are-constant";
  if (initializers > 0 && initializersAsInputs == initializers)
    return text + ": every initializer of this model is also a graph input";
  return text + ": " + std::to_string(initializersAsInputs) + " of its " + std::to_string(initializers) +
         " initializers are also graph inputs, which a caller may override";
}

InputDefaultsHint inputDefaultsHint(Model& model, const Report& report) {
  InputDefaultsHint hint;
  for (const auto& entry : report.section("skipped"))
    if (entry.contains("would_fold_with")) ++hint.wouldFold;
  if (hint.wouldFold == 0) return hint;  // no message: the initializers of a large model need not be read again
  for (Graph* graph : model.allGraphs())
    for (const Value* value : graph->initializers()) {
      ++hint.initializers;
      if (value->isGraphInput()) ++hint.initializersAsInputs;
    }
  return hint;
}

}  // namespace bnfold
