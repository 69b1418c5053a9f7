#pragma once
/// \file
/// The driver applies rules to a fixed point: rules are bucketed by root op type, the worklist is seeded with
/// every node of every graph in order, and whatever a rewrite touched is looked at again. Deterministic:
/// the same model and rules give the same result.

#include <memory>
#include <string>
#include <vector>

#include "bnfold/report/report.h"
#include "bnfold/rewrite/rule.h"

namespace bnfold {

/// Every rule bnfold has, in priority order (an explicit list: static self-registration gets dropped by the
/// linker from static libraries).
const std::vector<std::unique_ptr<Rule>>& builtinRules();
const Rule* findRule(const std::string& name);

/// Parses a --rules value: "default", "all", "none", a comma list of names ("bn-fold,bias-add"), or changes
/// to the defaults ("+bn-decompose", "-scale-fold", "default,-bias-add"). Throws std::invalid_argument naming
/// an unknown rule.
std::vector<std::string> parseRuleSelection(const std::string& selection);

struct DriverOptions {
  std::vector<std::string> rules;  ///< names of the enabled rules
  RuleOptions ruleOptions;
  /// Safety net against rules that undo each other; a fixed point is reached long before.
  std::size_t maxRewrites = 1000000;
};

/// Runs the enabled rules on every graph of the model and records what happened in `report`, including a
/// `skipped` entry for each BatchNormalization node left in place.
void runRules(Model& model, const DriverOptions& options, Report& report);

}  // namespace bnfold
