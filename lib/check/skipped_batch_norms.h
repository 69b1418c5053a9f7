#pragma once
// The report's `skipped` entries: one for each BatchNormalization left in the model, in graph order, with the
// reason of the first rule that did not rewrite it and, when it would fold if overridable defaults were
// constants, `would_fold_with`. It watches the driver for each BatchNormalization's failures.

#include <unordered_map>
#include <vector>

#include "bnfold/report/report.h"
#include "bnfold/rewrite/driver.h"

namespace bnfold {

class SkippedBatchNorms final : public DriverObserver {
 public:
  /// `rules`: the rules the driver runs (when one is rooted at BatchNormalization, the driver's scan lists every
  /// BatchNormalization, and the graphs need not be read again at the end).
  explicit SkippedBatchNorms(const std::vector<const Rule*>& rules);

  void rootVisited(const Node& root, bool fromScan, bool kept, bool rewritten,
                   const std::vector<RuleFailure>& failures) override;

  /// Adds the entries, after the run.
  void record(Model& model, const RuleOptions& options, Report& report) const;

 private:
  bool batchNormIsRoot_ = false;
  // Every BatchNormalization the model had before the rules ran, in graph order, less those erased before the scan
  // reached them; valid while no rewrite made a new one (scannedComplete_).
  std::vector<const Node*> scanned_;
  bool scannedComplete_ = true;
  std::unordered_map<const Node*, std::vector<RuleFailure>> failures_;
};

}  // namespace bnfold
