// The explicit list of rules, in priority order: when several rules are rooted at the same op, the first
// that matches wins, and the first one's reason is the one reported for a BatchNormalization left in place.

#include "bnfold/rewrite/driver.h"
#include "rules.h"

namespace bnfold {

const std::vector<std::unique_ptr<Rule>>& builtinRules() {
  static const std::vector<std::unique_ptr<Rule>> rules = [] {
    std::vector<std::unique_ptr<Rule>> list;
    // Rules are added here as they are written (one .cpp per rule in lib/rules/).
    return list;
  }();
  return rules;
}

}  // namespace bnfold
