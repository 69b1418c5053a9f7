// A model over protobuf's 2 GiB limit, with its tensors in ONNX external data, through `bnfold fold`: the
// output must load, keep its tensors external beside it, and compute what the original computes in ONNX
// Runtime. Slow (a few minutes) and needs about 4.5 GB of free disk in the temp folder; tagged [large].
// Under CTest the input is generated once for this test and the Python module's (BNFOLD_LARGE_MODEL_INPUT names
// its folder); run on its own, the test generates it.

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "bnfold/io/model_io.h"
#include "test_support.h"

namespace fs = std::filesystem;
using bnfold::test::runCommand;
using bnfold::test::TempDir;

namespace {

constexpr std::uintmax_t kTwoGiB = std::uintmax_t{1} << 31;
// Input (2.1 GiB of tensors) and output (the same again), plus slack for the model files.
constexpr std::uintmax_t kDiskNeeded = 4500ull * 1000 * 1000;
constexpr std::uintmax_t kDiskNeededForOutput = 2300ull * 1000 * 1000;
// Inline, the graph, a 4-element shape and at most the [D]-sized biases (~200 kB) fit; one weight is 567 MB.
constexpr std::uintmax_t kSmallModelFile = 1 << 20;

std::string quote(const std::string& text) { return "'" + text + "'"; }

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::uintmax_t folderBytes(const std::string& folder) {
  std::uintmax_t total = 0;
  for (const auto& entry : fs::directory_iterator(folder)) total += entry.file_size();
  return total;
}

}  // namespace

TEST_CASE("a model over 2 GiB in external data folds, stays external beside the output and computes the same",
          "[large]") {
  TempDir dir;
  const char* givenInput = std::getenv("BNFOLD_LARGE_MODEL_INPUT");
  const bool generates = givenInput == nullptr || *givenInput == '\0';
  const std::uintmax_t needed = generates ? kDiskNeeded : kDiskNeededForOutput;
  const std::uintmax_t available = fs::space(dir.path()).available;
  if (available < needed)
    FAIL("the >2 GiB model test needs " << needed / 1000000 << " MB free in " << dir.path() << ", only "
                                        << available / 1000000 << " MB are: free space or point TMPDIR elsewhere");

  const std::string inputDir = generates ? dir.file("in") : std::string(givenInput);
  const std::string outputDir = dir.file("out");
  const std::string input = inputDir + "/model.onnx", output = outputDir + "/model.onnx";
  fs::create_directories(outputDir);
  std::string out, err;
  auto start = std::chrono::steady_clock::now();

  if (generates) {
    const std::string generate = "/usr/bin/python3 " +
                                 quote(bnfold::test::sourceDir() + "/scripts/gen_large_model.py") + " " +
                                 quote(inputDir);
    INFO(generate);
    const int generated = runCommand(generate, &out, &err);
    INFO("stderr: " << err);
    REQUIRE(generated == 0);
    WARN("generated " << folderBytes(inputDir) << " bytes in " << secondsSince(start) << " s");
  }
  REQUIRE(folderBytes(inputDir) > kTwoGiB);

  start = std::chrono::steady_clock::now();
  const std::string fold = bnfold::test::bnfoldExecutable() + " fold " + quote(input) + " -o " + quote(output);
  INFO(fold);
  const int folded = runCommand(fold, &out, &err);
  INFO("stderr: " << err);
  REQUIRE(folded == 0);
  WARN("bnfold fold took " << secondsSince(start) << " s");

  {
    // The output model file is small: its tensors went to external data beside it.
    INFO("model file " << fs::file_size(output) << " bytes; folder " << folderBytes(outputDir) << " bytes");
    CHECK(fs::file_size(output) < kSmallModelFile);
    CHECK(folderBytes(outputDir) > kTwoGiB);
  }

  start = std::chrono::steady_clock::now();
  auto model = bnfold::loadModel(output);
  REQUIRE(model);
  CHECK(bnfold::test::countOps(*model, "BatchNormalization") == 0);
  const fs::path outputFolder = fs::canonical(outputDir);
  std::uintmax_t externalBytes = 0;
  for (bnfold::Graph* graph : model->allGraphs()) {
    for (bnfold::Value* value : graph->initializers()) {
      const bnfold::Tensor& tensor = *value->initializer();
      INFO("tensor " << tensor.name());
      CHECK_NOTHROW(tensor.validate(output));  // byte count agrees with dims, data inside the file
      if (!tensor.isExternal()) continue;
      externalBytes += static_cast<std::uintmax_t>(tensor.byteSize());
      // The output must not lean on the input's data file: it names a file in its own folder.
      const fs::path data = outputFolder / tensor.externalData().location;
      REQUIRE(fs::exists(data));
      CHECK(fs::canonical(data).parent_path() == outputFolder);
    }
  }
  CHECK(externalBytes > kTwoGiB);  // the folded weights, whatever the writer does with the small biases
  model.reset();
  WARN("loaded and checked the output in " << secondsSince(start) << " s");

  start = std::chrono::steady_clock::now();
  // Folding in float32 rounds each weight once; through four layers of width ~12k the outputs moved by at
  // most 6e-6 when this test was written.
  const auto comparison = bnfold::test::compareInOrt(input, output, 1e-5, 1e-4);
  INFO(comparison.error);
  CHECK(comparison.ok);
  WARN("ONNX Runtime comparison took " << secondsSince(start) << " s (max_abs " << comparison.maxAbs << ", max_rel "
                                       << comparison.maxRel << ")");
}
