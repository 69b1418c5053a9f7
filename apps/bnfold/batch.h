#pragma once
// What `fold` and `check` share when they work on many models: the rule flags (the list of models comes from
// bnfold/api/batch.h), and running independent per-model work on a few threads while the
// calling thread reports results in input order (so the output does not depend on --jobs).

#include <cstddef>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "bnfold/api/api.h"
#include "bnfold/api/batch.h"
#include "bnfold/check/fold.h"
#include "bnfold/error.h"

namespace bnfold::cli {

/// The flags that choose and steer the rules; `fold` and `check` take the same ones so `check` predicts `fold`.
/// bnfold::driverOptionsFrom turns them into the driver's options.
using RuleFlags = RuleSettings;

void addRuleFlags(CLI::App& command, RuleFlags& flags);
/// "Rules (default marked *):" and one line per rule, for --help footers.
std::string ruleListText();

/// `jobs` threads when given, else the number of cores (at least 1).
unsigned effectiveJobs(unsigned requested);

/// Runs `work(i)` for every i in [0, count) on up to `jobs` threads (each call independent; `work` must not
/// throw). `onFinished(i)` runs on the calling thread as each item completes, in completion order.
void runInParallel(std::size_t count, unsigned jobs, const std::function<void(std::size_t)>& work,
                   const std::function<void(std::size_t)>& onFinished);

/// Hands items to `emit` in index order however they complete: call `finished(i)` once per index.
class InOrder {
 public:
  InOrder(std::size_t count, std::function<void(std::size_t)> emit) : done_(count, false), emit_(std::move(emit)) {}
  void finished(std::size_t index);

 private:
  std::vector<bool> done_;
  std::size_t next_ = 0;
  std::function<void(std::size_t)> emit_;
};

/// The message of the exception being handled, without the file name when it is `path` (the caller prints it).
/// std::bad_alloc says "out of memory".
std::string currentErrorMessage(const std::string& path);

/// Runs `work` on the model at `path`; an exception that is not a bnfold::Error (std::bad_alloc, ...) comes out as
/// one that names the file, as every error of a model's run does.
template <typename Work>
auto namingFile(const std::string& path, Work&& work) -> decltype(work()) {
  try {
    return work();
  } catch (const Error&) {
    throw;
  } catch (const std::exception&) {
    throw Error(path, currentErrorMessage(path));
  }
}

}  // namespace bnfold::cli
