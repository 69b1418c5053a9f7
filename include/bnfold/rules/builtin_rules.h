#pragma once
/// \file
/// The rules bnfold has, and the --rules selection language over them.

#include <memory>
#include <string>
#include <vector>

#include "bnfold/rewrite/rule.h"

namespace bnfold {

/// Every rule bnfold has, in priority order (an explicit list: static self-registration gets dropped by the
/// linker from static libraries).
const std::vector<std::unique_ptr<Rule>>& builtinRules();
/// The built-in rule named `name`, or null.
const Rule* findRule(const std::string& name);

/// Parses a --rules value: "default", "all", "none", a comma list of names ("bn-fold,bias-add"), or changes
/// to the defaults ("+bn-decompose", "-scale-fold", "default,-bias-add"). Throws std::invalid_argument naming
/// an unknown rule.
std::vector<std::string> parseRuleSelection(const std::string& selection);

}  // namespace bnfold
