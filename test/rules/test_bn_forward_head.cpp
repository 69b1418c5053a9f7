// bn-forward through a Flatten or Reshape (issue 12): a CNN head, BatchNorm2d -> Flatten -> Linear, puts channel c
// on the contiguous block of input features [c*H*W, (c+1)*H*W) of the Gemm/MatMul; the BN folds into those rows of
// the weight and into the bias. Each positive case is checked in ONNX Runtime; each condition has a negative test.
#include <catch2/catch.hpp>
#include <onnx/checker.h>

#include "test_bn_fold_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;

namespace {

constexpr double kAtol = 1e-5, kRtol = 1e-4;

std::string weights(const std::string& name, const std::vector<int64_t>& dims, double seed) {
  return tensorText("float", name, dims, asFloats(sampleValues(product(dims, 0), seed)));
}

/// BN on x [2,3,2,2] (3 channels of 4 features each), then `head` reading `n`.
std::string headModel(const std::string& initializers, const std::string& head, const std::string& xType = "float[2,3,2,2]") {
  return "<ir_version: 8, opset_import: [\"\" : 13]>\ng (" + xType + " x) => (float[2,5] y)\n<" +
         bnInitializers(makeBnParams(3, 1.5)) + (initializers.empty() ? "" : ", " + initializers) +
         ">\n{\n  n = BatchNormalization <epsilon = 0.001> (x, s, b, m, v)\n" + head + "}\n";
}

Report foldAndCompare(Model& model) {
  auto outcome = applyRulesAndCompare(model, {"bn-forward"}, kAtol, kRtol);
  INFO(outcome.report.dump());
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  CHECK(countOps(model, "BatchNormalization") == 0);
  CHECK_NOTHROW(onnx::checker::check_model(modelToProto(model)));
  REQUIRE(outcome.report.section("folds").size() == 1);
  CHECK(outcome.report.section("folds")[0]["features_per_channel"] == 4);
  CHECK(outcome.report.section("folds")[0]["direction"] == "forward");
  return outcome.report;
}

void expectSkipped(const std::string& text, const std::string& code) {
  expectBatchNormSkipped(text, {"bn-forward"}, code);
}
}  // namespace

TEST_CASE("bn-forward head: BN -> Flatten -> Gemm folds into the weight rows and the bias", "[bn-forward][head]") {
  SECTION("transB = 0, with C") {
    auto model = parseModel(headModel(weights("w", {12, 5}, 2) + ", " + weights("c", {5}, 3),
                                      "  f = Flatten (n)\n  y = Gemm (f, w, c)\n"));
    foldAndCompare(*model);
    CHECK(opSequence(model->graph()) == "Flatten,Gemm");
  }
  SECTION("transB = 1, alpha and beta, no C") {
    auto model = parseModel(headModel(weights("w", {5, 12}, 4), "  f = Flatten (n)\n  y = Gemm <transB = 1, alpha = 0.5> (f, w)\n"));
    const Report report = foldAndCompare(*model);
    CHECK(report.section("folds")[0]["bias_created"] == true);
  }
  SECTION("transB = 1, alpha and beta, with C") {
    auto model = parseModel(headModel(weights("w", {5, 12}, 4) + ", " + weights("c", {1, 5}, 5),
                                      "  f = Flatten (n)\n  y = Gemm <transB = 1, alpha = 0.5, beta = 2.0> (f, w, c)\n"));
    foldAndCompare(*model);
  }
}

TEST_CASE("bn-forward head: Reshape forms [0, -1] and [-1, C*H*W]", "[bn-forward][head]") {
  for (const std::string shape : {"0, -1", "-1, 12"}) {
    DYNAMIC_SECTION(shape) {
      auto model = parseModel(headModel(weights("w", {12, 5}, 6) + ", int64[2] shp = {" + shape + "}",
                                        "  f = Reshape (n, shp)\n  y = Gemm (f, w)\n", "float[N,3,2,2]"));
      foldAndCompare(*model);
    }
  }
}

TEST_CASE("bn-forward head: BN -> Flatten -> MatMul becomes a Gemm with the bias", "[bn-forward][head]") {
  auto model = parseModel(headModel(weights("w", {12, 5}, 7), "  f = Flatten (n)\n  y = MatMul (f, w)\n"));
  const Report report = foldAndCompare(*model);
  CHECK(report.section("folds")[0]["into_op"] == "Gemm");
  CHECK(opSequence(model->graph()) == "Flatten,Gemm");
}

TEST_CASE("bn-forward head: conditions that stop the fold, each with its reason", "[bn-forward][head]") {
  SECTION("the Flatten's output has another reader") {
    expectSkipped("<ir_version: 8, opset_import: [\"\" : 13]>\ng (float[2,3,2,2] x) => (float[2,5] y, float[2,12] f)\n<" +
                      bnInitializers(makeBnParams(3, 1.5)) + ", " + weights("w", {12, 5}, 2) +
                      ">\n{\n  n = BatchNormalization (x, s, b, m, v)\n  f = Flatten (n)\n  y = Gemm (f, w)\n}\n",
                  "no-foldable-consumer");
  }
  SECTION("a Flatten that does not keep the batch apart") {
    expectSkipped(headModel(weights("w", {4, 5}, 2), "  f = Flatten <axis = 2> (n)\n  y = Gemm (f, w)\n"),
                  "channel-axis-mismatch");
  }
  SECTION("a Reshape that is not [batch, C*H*W]") {
    expectSkipped(headModel(weights("w", {4, 5}, 2) + ", int64[2] shp = {6, 4}", "  f = Reshape (n, shp)\n  y = Gemm (f, w)\n"),
                  "channel-axis-mismatch");
  }
  SECTION("the spatial dims are not known") {
    expectSkipped(headModel(weights("w", {12, 5}, 2), "  f = Flatten (n)\n  y = Gemm (f, w)\n", "float[2,3,H,W]"),
                  "rank-unknown");
  }
  SECTION("the Gemm transposes its input") {
    expectSkipped(headModel(weights("w", {2, 5}, 2), "  f = Flatten (n)\n  y = Gemm <transA = 1> (f, w)\n"),
                  "channel-axis-mismatch");
  }
  SECTION("the weight does not have C*H*W input rows") {
    expectSkipped(headModel(weights("w", {10, 5}, 2), "  f = Flatten (n)\n  y = Gemm (f, w)\n"), "param-shape-mismatch");
  }
  SECTION("the Flatten is followed by something that is not a Gemm or MatMul") {
    expectSkipped(headModel("", "  f = Flatten (n)\n  y = Relu (f)\n"), "no-foldable-consumer");
  }
}

TEST_CASE("bn-forward head: the spatial dims come from a MaxPool's window (kernel, strides, pads, ceil_mode)", "[bn-forward][head]") {
  // x [2,3,5,5] -> MaxPool 3x3 stride 2, pads 1, ceil_mode -> [2,3,3,3] -> BN -> Flatten (27 features) -> Gemm.
  auto model = parseModel("<ir_version: 8, opset_import: [\"\" : 13]>\ng (float[2,3,5,5] x) => (float[2,5] y)\n<" +
                          bnInitializers(makeBnParams(3, 2.5)) + ", " + weights("w", {27, 5}, 8) +
                          ">\n{\n  p = MaxPool <kernel_shape = [3, 3], strides = [2, 2], pads = [1, 1, 1, 1], ceil_mode = 1> (x)\n"
                          "  n = BatchNormalization <epsilon = 0.001> (p, s, b, m, v)\n  f = Flatten (n)\n  y = Gemm (f, w)\n}\n");
  auto outcome = applyRulesAndCompare(*model, {"bn-forward"}, kAtol, kRtol);
  INFO(outcome.report.dump());
  CHECK(outcome.comparison.ok);
  REQUIRE(outcome.report.section("folds").size() == 1);
  CHECK(outcome.report.section("folds")[0]["features_per_channel"] == 9);
}
