#include "rewrite_verifier.h"

#include <exception>
#include <string>
#include <utility>

namespace bnfold::verify {

namespace {

// The verdict goes on the rule's own entries; the constants it evaluated on the way are part of its rewrite.
void attachVerdict(Report& report, const RecordedEntries& recorded, const nlohmann::json& verdict) {
  bool attached = false;
  for (const auto& [section, index] : recorded)
    if (section != "evaluated") {
      report.entry(section, index)["verify"] = verdict;
      attached = true;
    }
  if (!attached)
    for (const auto& [section, index] : recorded) report.entry(section, index)["verify"] = verdict;
}

}  // namespace

RewriteVerifier::RewriteVerifier(const Model& model, Report& report, bool verify, uint64_t seed,
                                 FaultInjector injectFault)
    : model_(model), report_(report), verify_(verify), seed_(seed), injectFault_(std::move(injectFault)) {}

void RewriteVerifier::rewriteStarting(const Rule&, const Node&) { recorder_.begin(); }

void RewriteVerifier::rewriteFinished(const Rule& rule, Rewriter& rewriter, const RecordedEntries& recorded) {
  ++rewrites_;
  if (injectFault_) injectFault_(rewriter, recorder_.liveNodes());
  if (!verify_) return;
  const uint64_t seed = seed_ + rewrites_;
  nlohmann::json verdict;
  try {
    VerifySettings settings;
    settings.seed = seed;
    settings.batchNormAsInference = rule.verifiesAgainstFrozenBatchNorm();
    verdict = verifier_.verify(recorder_.finish(model_), settings);
  } catch (const std::exception& e) {
    verdict = {{"passed", false},
               {"seed", seed},
               {"outputs", nlohmann::json::array()},
               {"error", std::string("cannot be verified: ") + e.what()}};
  }
  if (!verdict.value("passed", false)) ++failed_;
  attachVerdict(report_, recorded, verdict);
}

void RewriteVerifier::recordSummary() const {
  if (!verify_) return;
  report_.setVerification({{"rewrites", rewrites_}, {"passed", rewrites_ - failed_}, {"failed", failed_}, {"seed", seed_}});
}

}  // namespace bnfold::verify
