// libFuzzer target: arbitrary bytes as a model file -> loadModel -> saveModel.
// bnfold::Error is the library's answer to bad input and is expected; a crash, a sanitizer report, a leak or any
// other exception is a finding.

#include <cstddef>
#include <cstdint>
#include <exception>

#include "bnfold/error.h"
#include "bnfold/io/model_io.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace bnfold;
  if (size > fuzz::kMaxInputBytes) return -1;  // -1: never added to the corpus
  const fuzz::ScratchDir& dir = fuzz::ScratchDir::get();
  dir.writeInput(data, size);
  try {
    auto model = loadModel(dir.inputPath());
    saveModel(*model, dir.outputPath());
  } catch (const Error&) {
    // Bad input, reported as bnfold reports it: expected.
  } catch (const std::exception& e) {
    fuzz::reportFinding("load/save", std::string("unexpected exception: ") + e.what());
  }
  return 0;
}
