#pragma once
/// \file
/// A fold as the CLI runs it: the chosen built-in rules through the generic driver (bnfold/rewrite/driver.h), with
/// what the report adds around them: --verify of every rewrite, and a `skipped` entry for each BatchNormalization
/// left in place.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "bnfold/report/report.h"
#include "bnfold/rewrite/rule.h"
#include "bnfold/rules/builtin_rules.h"

namespace bnfold {

struct DriverOptions {
  std::vector<std::string> rules;  ///< names of the enabled rules
  RuleOptions ruleOptions;
  /// Safety net against rules that undo each other; a fixed point is reached long before.
  std::size_t maxRewrites = 1000000;
  /// Evaluate every rewrite's original and rewritten nodes on seeded random inputs and add a "verify" object to
  /// its report entry (README, "Verification"). Report::failedVerifications() lists the ones that failed.
  bool verify = false;
  /// Seed of the random inputs (each rewrite adds its number to it).
  uint64_t verifySeed = 20261125;
};

/// Runs the enabled rules on every graph of the model and records what happened in `report`, including a
/// `skipped` entry for each BatchNormalization node left in place. Throws std::invalid_argument naming an unknown
/// rule.
void runRules(Model& model, const DriverOptions& options, Report& report);

/// What --input-defaults-are-constant would change after a run. Older PyTorch exports list every initializer as a
/// graph input (IR >= 4), which makes them overridable defaults that no rule folds; `skipped` entries of BNs that
/// would fold if they were constants carry `would_fold_with`.
struct InputDefaultsHint {
  std::size_t wouldFold = 0;             ///< BatchNormalization nodes marked would_fold_with
  std::size_t initializers = 0;          ///< initializers in every graph of the model (counted when wouldFold > 0)
  std::size_t initializersAsInputs = 0;  ///< those also listed as graph inputs (likewise)
  /// One line for users: "3 BatchNormalization would fold with --input-defaults-are-constant: every initializer of
  /// this model is also a graph input"; empty when nothing would fold.
  std::string message() const;
};
InputDefaultsHint inputDefaultsHint(Model& model, const Report& report);

}  // namespace bnfold
