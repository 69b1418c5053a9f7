#pragma once
/// \file
/// The driver applies rules to a fixed point: rules are bucketed by root op type, every node of every graph is
/// looked at in order, and whatever a rewrite touched is looked at again (it listens to the Rewriter for that).
/// Deterministic: the same model and rules give the same result. It knows no op and no rule: what sits above it
/// (--verify, the report's skipped nodes, test hooks) watches through a DriverObserver or a RewriteListener.

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "bnfold/report/report.h"
#include "bnfold/rewrite/pre_activation_statistics.h"
#include "bnfold/rewrite/rewriter.h"
#include "bnfold/rewrite/rule.h"

namespace bnfold {

/// A rule that did not match a root, and why.
struct RuleFailure {
  const Rule* rule;
  MatchFailure failure;
};

/// Where the report entries of one rewrite went: (section, index in it).
using RecordedEntries = std::vector<std::pair<std::string, std::size_t>>;

/// Told what the driver does. Every method does nothing unless overridden.
class DriverObserver {
 public:
  virtual ~DriverObserver() = default;
  /// `rule` matched `root`; its rewrite runs next (the rewriter's listeners then hear of each change).
  virtual void rewriteStarting(const Rule& /*rule*/, const Node& /*root*/) {}
  /// The rewrite is done; `recorded` lists its report entries. The observer may change the graph through
  /// `rewriter`, and the driver looks again at what it changes.
  virtual void rewriteFinished(const Rule& /*rule*/, Rewriter& /*rewriter*/, const RecordedEntries& /*recorded*/) {}
  /// The driver is done with `root` for now: one rule rewrote it (`rewritten`), or none did and `failures` says why,
  /// one per rule tried, in priority order (none when the user keeps the node: `kept`). `fromScan`: the root came
  /// from the scan in graph order, which yields each node the graphs had at the start once (unless it was erased
  /// first), before any other visit of it; otherwise a rewrite touched it or made it.
  virtual void rootVisited(const Node& /*root*/, bool /*fromScan*/, bool /*kept*/, bool /*rewritten*/,
                           const std::vector<RuleFailure>& /*failures*/) {}
};

struct RewriteDriverOptions {
  RuleOptions ruleOptions;
  /// Safety net against rules that undo each other; a fixed point is reached long before.
  std::size_t maxRewrites = 1000000;
  /// Look again at what each rewrite touched (to a fixed point). Off: each root is visited once, in graph order.
  bool revisitTouched = true;
  /// Told of every match and rewrite, in the order given; each must outlive the run.
  std::vector<DriverObserver*> observers;
  /// Added to the rewriter for the run, after the driver's own; each must outlive the run.
  std::vector<RewriteListener*> listeners;
  /// The layers' output statistics shared by the rules across runs (pre_activation_statistics.h); null: the run's
  /// own, forgotten at its end.
  PreActivationStatistics* statistics = nullptr;
};

/// Runs `rules` (in priority order: at a root, the first that matches rewrites it) on every graph of the model to a
/// fixed point; the rewrites record what they did in `report`.
void driveRules(Model& model, const std::vector<const Rule*>& rules, const RewriteDriverOptions& options,
                Report& report);

}  // namespace bnfold
