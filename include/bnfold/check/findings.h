#pragma once
/// \file
/// Findings: a run's report read as a CI gate reads it (what `bnfold check` prints). Each rewrite a rule did or
/// would do, each BatchNormalization left in place and each graph sorted on load becomes one finding with a
/// category; a category in the caller's fail-on set makes the finding an error. Library users get the same
/// answers as `bnfold check`, which only formats them.

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bnfold/rewrite/rule.h"

namespace bnfold {

class Model;
class Report;

struct FindingCategory {
  const char* name;     ///< e.g. "foldable-bn"; what --fail-on takes
  const char* meaning;  ///< one line for help and docs
};

/// Every category, in the order help lists them.
const std::vector<FindingCategory>& findingCategories();

/// The categories that fail a check unless the caller says otherwise.
inline constexpr const char* kDefaultFailOn = "foldable-bn,training-bn";

/// Parses a comma list of category names, "all" or "none" (later items add to earlier ones; "none" clears).
/// Throws bnfold::Error naming an unknown category and listing the known ones.
std::set<std::string> parseFailOn(const std::string& text);

enum class Severity { Warning, Error };
const char* severityName(Severity severity);  ///< "warning" or "error"

struct Finding {
  std::string category;                ///< one of findingCategories()
  Severity severity = Severity::Warning;  ///< Error when the category is in the fail-on set (invalid-model: always)
  std::string node;                    ///< the node a rewrite removes or that is left in place; may be empty
  std::string op;                      ///< its op type
  std::string graph;                   ///< the graph holding it
  std::string rule;                    ///< the rule that did (or would do) it, or whose reason is given
  std::string reason;                  ///< the reason code, for BatchNormalization left in place
  std::string message;                 ///< one line for people
  nlohmann::json entry;                ///< the report entry it came from (null for model-level findings)
};

/// The findings of one run: `model` and `report` as runRules left them (the model rewritten in memory; it is read
/// for the form of each BatchNormalization left in place), with Report::setReorderedGraphs called before the run.
/// When the run included equalize, each layer whose per-tensor int8 weight SQNR stays more than
/// kWeightQuantGapLimitDb below per channel is a weight-quant-gap finding (bnfold/check/weight_quant.h);
/// `ruleOptions` (the run's) tell which weights are constants and which layers the user kept.
std::vector<Finding> findingsOf(Model& model, const Report& report, const std::set<std::string>& failOn,
                                const RuleOptions& ruleOptions = {});

/// One finding per rewrite whose --verify check did not pass (category verify-failed, always an error): what was
/// rewritten, and the error against the tolerance or why it could not be evaluated. findingsOf includes these.
std::vector<Finding> failedVerifications(const Report& report);

/// The finding for a model that cannot be read or is invalid: category invalid-model, always an error.
Finding invalidModelFinding(const std::string& message);

}  // namespace bnfold
