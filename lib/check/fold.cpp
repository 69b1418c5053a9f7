// The composition above the generic driver: the built-in rules chosen by name, --verify and the report's skipped
// BatchNormalization entries plugged in as observers, and the test-only fault hook (fold_testing.h).

#include "bnfold/check/fold.h"

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "bnfold/rewrite/driver.h"
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

void fold(Model& model, const DriverOptions& options, const FaultInjector& injectFault, Report& report) {
  report.setOpset(model.opsetVersion(""));
  report.setRules(options.rules);
  report.setReorderedGraphs(model.reorderedGraphs());
  const std::vector<const Rule*> rules = rulesNamed(options.rules);

  RewriteDriverOptions driverOptions;
  driverOptions.ruleOptions = options.ruleOptions;
  driverOptions.maxRewrites = options.maxRewrites;
  SkippedBatchNorms skipped(rules);
  driverOptions.observers.push_back(&skipped);
  std::optional<verify::RewriteVerifier> verifier;
  if (options.verify || injectFault) {
    verifier.emplace(model, report, options.verify, options.verifySeed, injectFault);
    driverOptions.observers.push_back(&*verifier);
    driverOptions.listeners.push_back(&verifier->recorder());
  }
  driveRules(model, rules, driverOptions, report);
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
