#pragma once
// Tests only: runRules with a hook called after each rewrite, before it is verified, with the nodes it changed or
// created, so that a test can break the rewrite through the rewriter and see --verify catch it.

#include <functional>
#include <vector>

#include "bnfold/check/fold.h"
#include "bnfold/rewrite/rewriter.h"

namespace bnfold {

using FaultInjector = std::function<void(Rewriter&, const std::vector<Node*>&)>;

void runRulesInjectingFaults(Model& model, const DriverOptions& options, const FaultInjector& injectFault,
                             Report& report);

}  // namespace bnfold
