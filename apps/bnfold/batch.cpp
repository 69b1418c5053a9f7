#include "batch.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <new>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "bnfold/error.h"

namespace bnfold::cli {
void addRuleFlags(CLI::App& command, RuleFlags& flags) {
  command.add_option("--rules", flags.rules,
                     "Rules to run: default, all, none, a list (bn-fold,bias-add) or changes (+bn-decompose,-scale-fold)")
      ->capture_default_str();
  command.add_option("--keep", flags.keepNodes, "Node name (glob) no rule may touch; repeatable");
  command.add_option("--keep-op", flags.keepOps, "Op type no rule may touch; repeatable");
  command.add_flag("--input-defaults-are-constant", flags.inputDefaultsAreConstant,
                   "Treat initializers that are also graph inputs (IR >= 4) as constants");
  command.add_flag("--freeze-train-bn", flags.freezeTrainingBatchNorm,
                   "Turn training-mode BatchNormalization into inference mode (changes the function)");
  command.add_flag(
      "--equalize", flags.equalize,
      "Cross-layer equalization after folding (same as --rules +equalize): rescale channels between "
      "layers joined by Relu/LeakyRelu/PRelu and pools (also a fan-out, a channel-axis Concat, Conv -> Flatten -> "
      "Gemm, a residual stream) so per-tensor int8 weights lose less; exact in float (see "
      "docs/quantization.md)");
  command.add_flag("--absorb-high-bias", flags.absorbHighBias,
                   "High-bias absorption after --equalize (needs it; same as --rules +absorb-high-bias): move "
                   "max(0, beta - 3|gamma|) of a folded BN's channels through a Relu into the next layer's bias, for "
                   "activation quantization; exact where the pre-activation stays above it (see docs/quantization.md)");
  command.add_flag("--relu6-to-relu", flags.relu6ToRelu,
                   "With --equalize (needs it; same as --rules +relu6-to-relu): replace Clip(0, 6) between two layers "
                   "with Relu so equalize can reach the link. CHANGES THE FUNCTION where the first layer's output "
                   "exceeds 6; listed with a warning in the report's relu6_replaced (see docs/quantization.md)");
  command.add_option("--max-constant-size", flags.maxConstantMiB,
                     "Largest result (MiB) of an op that is evaluated when a weight or BN parameter is computed from "
                     "constants (Identity, Cast, Reshape, Add(var, eps), ...)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command.add_option("--target-opset", flags.targetOpset,
                     "Convert the model to this ai.onnx opset (up to 17) with ONNX's version converter before the "
                     "rules, e.g. so norm-fuse can emit LayerNormalization; a model it cannot convert is refused")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  command.add_flag("--verify", flags.verify,
                   "Check every rewrite numerically: evaluate the original and the rewritten nodes on seeded random "
                   "inputs; a rewrite outside its tolerance fails the run (exit code 1, no model written)");
}

std::string ruleListText() {
  std::string text = "Rules (default marked *):\n";
  if (builtinRules().empty()) text += "  (none built in)\n";
  for (const auto& rule : builtinRules())
    text += std::string("  ") + (rule->enabledByDefault() ? "* " : "  ") + rule->name() + "  " + rule->summary() + "\n";
  return text;
}

unsigned effectiveJobs(unsigned requested) {
  if (requested > 0) return requested;
  const unsigned cores = std::thread::hardware_concurrency();
  return cores > 0 ? cores : 1;
}

void runInParallel(std::size_t count, unsigned jobs, const std::function<void(std::size_t)>& work,
                   const std::function<void(std::size_t)>& onFinished) {
  const std::size_t threadCount = std::min<std::size_t>(std::max(jobs, 1u), count);
  if (threadCount <= 1) {
    for (std::size_t i = 0; i < count; ++i) {
      work(i);
      onFinished(i);
    }
    return;
  }
  std::mutex mutex;
  std::condition_variable wakeUp;
  std::deque<std::size_t> completed;
  std::size_t nextItem = 0;
  auto worker = [&] {
    for (;;) {
      std::size_t item;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (nextItem == count) return;
        item = nextItem++;
      }
      work(item);
      {
        std::lock_guard<std::mutex> lock(mutex);
        completed.push_back(item);
      }
      wakeUp.notify_one();
    }
  };
  std::vector<std::thread> threads;
  try {
    for (std::size_t t = 0; t < threadCount; ++t) threads.emplace_back(worker);
  } catch (const std::system_error&) {
    // A process limit (a container's) allows fewer threads: those that started share the work, and with none the
    // models are processed here, one after the other.
    if (threads.empty()) {
      for (std::size_t i = 0; i < count; ++i) {
        work(i);
        onFinished(i);
      }
      return;
    }
  }
  for (std::size_t reported = 0; reported < count; ++reported) {
    std::size_t item;
    {
      std::unique_lock<std::mutex> lock(mutex);
      wakeUp.wait(lock, [&] { return !completed.empty(); });
      item = completed.front();
      completed.pop_front();
    }
    onFinished(item);
  }
  for (std::thread& thread : threads) thread.join();
}

void InOrder::finished(std::size_t index) {
  done_.at(index) = true;
  while (next_ < done_.size() && done_[next_]) emit_(next_++);
}

std::string currentErrorMessage(const std::string& path) {
  try {
    throw;
  } catch (const Error& e) {
    return e.file() == path ? e.problem() : e.what();
  } catch (const std::bad_alloc&) {
    return "out of memory (std::bad_alloc): the model needs more memory than this process may use";
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace bnfold::cli
