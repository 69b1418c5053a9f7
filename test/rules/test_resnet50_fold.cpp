// End to end on a ResNet-50-sized model: scripts/gen_resnet50.py writes ResNet-50 v1 with random weights (53
// bias-less Conv + BatchNormalization pairs), the bnfold CLI folds it with the default rules, and ONNX Runtime
// runs both. Float32 and float16.
#include <catch2/catch.hpp>

#include <fstream>

#include "test_bn_fold_support.h"

using namespace bnfold;
using namespace bnfold::test;

namespace {

std::string shellQuote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

/// Generates, folds and compares; returns the comparison.
OrtComparison foldResNet50(const std::string& dtype, double atol, double rtol) {
  TempDir dir;
  const std::string original = dir.file("resnet50.onnx"), folded = dir.file("folded.onnx"),
                    reportPath = dir.file("report.json");
  std::string out, err;
  REQUIRE(runCommand("/usr/bin/python3 " + shellQuote(sourceDir() + "/scripts/gen_resnet50.py") + " " +
                         shellQuote(original) + " --dtype " + dtype,
                     &out, &err) == 0);
  INFO(err);
  REQUIRE(runCommand(shellQuote(bnfoldExecutable()) + " fold " + shellQuote(original) + " -o " + shellQuote(folded) +
                         " --report " + shellQuote(reportPath),
                     &out, &err) == 0);

  std::ifstream stream(reportPath);
  const nlohmann::json report = nlohmann::json::parse(stream);
  CHECK(report["folds"].size() == 53);
  CHECK(report["skipped"].empty());
  for (const auto& entry : report["folds"]) {
    CHECK(entry["rule"] == "bn-fold");
    CHECK(entry["into_op"] == "Conv");
    CHECK(entry["bias_created"] == true);
  }
  auto model = loadModel(folded);
  CHECK(countOps(*model, "BatchNormalization") == 0);
  CHECK(countOps(*model, "Conv") == 53);

  OrtComparison comparison = compareInOrt(original, folded, atol, rtol);
  INFO(comparison.error);
  CHECK(comparison.ok);
  return comparison;
}

}  // namespace

// Tolerances are per element, |a-b| <= atol + rtol*|a|. The logits of this random-weight ResNet-50 are O(1)
// (max |a| about 0.8, rms about 0.24). Measured (ORT 1.30, seed 0 input): float32 max |a-b| 2e-7, i.e. 2.6e-7 of
// the largest logit; float16 max |a-b| 4.9e-4 (one fp16 ulp at 0.5), 6e-4 of the largest logit. The element-wise
// max_rel alone is dominated by logits close to zero (4.8e-5 in float32, 0.26 in float16), hence atol + rtol.
TEST_CASE("ResNet-50 float32: 53 folds, no BatchNormalization left, same outputs in ONNX Runtime",
          "[bn-fold][resnet50]") {
  const OrtComparison comparison = foldResNet50("float32", 1e-6, 1e-5);
  WARN("float32 ResNet-50: max abs " << comparison.maxAbs << ", max rel " << comparison.maxRel);
}

TEST_CASE("ResNet-50 float16: 53 folds, no BatchNormalization left, within 1e-2", "[bn-fold][resnet50]") {
  const OrtComparison comparison = foldResNet50("float16", 1e-3, 1e-2);
  WARN("float16 ResNet-50: max abs " << comparison.maxAbs << ", max rel " << comparison.maxRel);
}
