#pragma once
// --verify as a driver observer: it records the region each rewrite changes (a RegionRecorder listening to the
// rewriter) and puts the verdict on the rewrite's report entries; the run's summary goes on the report at the end.
// A test may hand it a fault to inject into each rewrite before the verdict.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "bnfold/report/report.h"
#include "bnfold/rewrite/driver.h"
#include "region.h"
#include "verifier.h"

namespace bnfold::verify {

class RewriteVerifier final : public DriverObserver {
 public:
  using FaultInjector = std::function<void(Rewriter&, const std::vector<Node*>&)>;

  /// `verify`: whether to verify (false: only inject faults); `seed`: the run's seed (each rewrite adds its number).
  RewriteVerifier(const Model& model, Report& report, bool verify, uint64_t seed, FaultInjector injectFault = {});

  /// To be added to the rewriter's listeners (RewriteDriverOptions::listeners) for the run.
  RewriteListener& recorder() { return recorder_; }

  void rewriteStarting(const Rule& rule, const Node& root) override;
  void rewriteFinished(const Rule& rule, Rewriter& rewriter, const RecordedEntries& recorded) override;

  /// Adds the run's "verification" summary to the report (when verifying).
  void recordSummary() const;

 private:
  const Model& model_;
  Report& report_;
  const bool verify_;
  const uint64_t seed_;
  const FaultInjector injectFault_;
  RegionRecorder recorder_;
  Verifier verifier_;
  std::size_t rewrites_ = 0;
  std::size_t failed_ = 0;
};

}  // namespace bnfold::verify
