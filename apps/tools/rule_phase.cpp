// For the benchmark's rule scaling: the rules phase of `bnfold fold` (default rules) timed on its own, after an
// optional sweep through a buffer twice the size of the last-level cache.
//
// Loading leaves a small model in the CPU caches when the rules start, and a large one not: the rules phase of a
// 1,000-block chain reads memory that is still cached, that of a 10,000-block chain mostly reads it from RAM.
// With the caches emptied before the rules at both sizes, the ratio of the two times shows how the rules' own work
// grows, apart from that difference.
//
//   bnfold_rule_phase MODEL [--empty-caches]     prints "rules 0.0123 s, 1154 page faults"
//
// The page faults are the new memory the rules touch (minor faults, from getrusage): in a VM each is dear.

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "bnfold/io/model_io.h"
#include "bnfold/report/report.h"
#include "bnfold/check/fold.h"

namespace {

std::size_t lastLevelCacheBytes() {
  const long size = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return size > 0 ? static_cast<std::size_t>(size) : std::size_t{64} << 20;
}

// Reads every cache line of `buffer`, which pushes whatever was cached before out of the caches.
unsigned char sweep(const std::vector<unsigned char>& buffer) {
  unsigned char sum = 0;
  for (std::size_t i = 0; i < buffer.size(); i += 64) sum = static_cast<unsigned char>(sum + buffer[i]);
  return sum;
}

}  // namespace

int main(int argc, char** argv) {
  const bool emptyCaches = argc == 3 && std::strcmp(argv[2], "--empty-caches") == 0;
  if (argc < 2 || argc > 3 || (argc == 3 && !emptyCaches)) {
    std::fprintf(stderr, "usage: %s MODEL [--empty-caches]\n", argv[0]);
    return 2;
  }
  try {
    // Allocated and written before loading, so that its page faults are not part of what is measured.
    std::vector<unsigned char> buffer(emptyCaches ? 2 * lastLevelCacheBytes() : 0, 1);
    auto model = bnfold::loadModel(argv[1]);
    volatile unsigned char sink = sweep(buffer);
    (void)sink;

    bnfold::DriverOptions options;
    options.rules = bnfold::parseRuleSelection("");
    rusage before{};
    getrusage(RUSAGE_SELF, &before);
    const auto start = std::chrono::steady_clock::now();
    bnfold::Report report;
    bnfold::runRules(*model, options, report);
    const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
    rusage after{};
    getrusage(RUSAGE_SELF, &after);
    std::printf("rules %.4f s, %ld page faults\n", seconds.count(), after.ru_minflt - before.ru_minflt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[1], e.what());
    return 1;
  }
  return 0;
}
