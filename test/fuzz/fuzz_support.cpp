#include "fuzz_support.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "bnfold/error.h"

namespace bnfold::fuzz {
namespace fs = std::filesystem;

namespace {

// Little-endian floats 0.5, 0.25, ..., then a ramp, so external tensors read from it hold ordinary numbers.
void writeWeightsFile(const std::string& path) {
  std::vector<float> values(ScratchDir::kWeightsBytes / sizeof(float));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = 0.5f + static_cast<float>(i % 97) * 0.01f;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(ScratchDir::kWeightsBytes));
  if (!out) reportFinding("setup", "cannot write " + path);
}

}  // namespace

ScratchDir& ScratchDir::get() {
  static ScratchDir dir;
  return dir;
}

ScratchDir::ScratchDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/bnfold-fuzz-XXXXXX";
  if (!::mkdtemp(pattern.data())) reportFinding("setup", "cannot create a scratch folder like " + pattern);
  path_ = pattern;
  writeWeightsFile(path_ + "/" + kWeightsFileName);
}

// libFuzzer ends with exit(), which runs this; a crash leaves the folder for a look at what was written.
ScratchDir::~ScratchDir() {
  std::error_code ignored;
  fs::remove_all(path_, ignored);
}

void ScratchDir::writeInput(const uint8_t* data, std::size_t size) const {
  std::error_code ignored;
  fs::remove(outputPath(), ignored);
  fs::remove(outputPath() + ".data", ignored);
  std::ofstream out(inputPath(), std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) reportFinding("setup", "cannot write " + inputPath());
}

DriverOptions driverOptionsFor(const uint8_t* data, std::size_t size) {
  uint32_t hash = 2166136261u;  // FNV-1a over the bytes: cheap, and stable across runs
  for (std::size_t i = 0; i < size; ++i) hash = (hash ^ data[i]) * 16777619u;
  DriverOptions options;
  switch (hash % 8) {
    case 0:
    case 1:
      options.rules = parseRuleSelection("all");
      break;
    case 2:
      options.rules = parseRuleSelection("default");
      options.ruleOptions.inputDefaultsAreConstant = true;
      break;
    case 3:
      options.rules = parseRuleSelection("all");
      options.ruleOptions.freezeTrainingBatchNorm = true;
      options.ruleOptions.inputDefaultsAreConstant = true;
      break;
    default:
      options.rules = parseRuleSelection("default");
  }
  // Half of the inputs also run --verify: its interpreter and kernels read the mutated graph's shapes and attributes.
  // A rewrite that fails verification is not a finding (a fuzzed model may hold values no rewrite keeps exact);
  // a crash or a sanitizer report is.
  options.verify = (hash / 8) % 2 == 0;
  return options;
}

void reportFinding(const std::string& stage, const std::string& what) {
  std::fprintf(stderr, "==bnfold-fuzz== FINDING at %s: %s\n", stage.c_str(), what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace bnfold::fuzz
