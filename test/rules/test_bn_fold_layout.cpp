// bn-fold through layout ops and Concat (issue 12): the paths real exporters put between a layer and its BN
// (old PyTorch's Gemm -> Unsqueeze -> BN -> Squeeze, Keras's Transpose sandwiches, MatMul -> Reshape -> BN,
// Inception's Concat of convolutions). Each positive case checks the structure, the report and ONNX Runtime's
// numbers; each condition that stops the fold has a negative test with its reason code.
#include <catch2/catch.hpp>
#include <onnx/checker.h>

#include "test_bn_fold_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;

namespace {

constexpr double kAtol = 1e-5, kRtol = 1e-4;

std::string header(int opset) {
  return "<ir_version: 8, opset_import: [\"\" : " + std::to_string(opset) + "]>\n";
}

std::string params(std::size_t channels, double seed, const std::string& prefix = "") {
  return bnInitializers(makeBnParams(channels, seed), prefix);
}

std::string weights(const std::string& name, const std::vector<int64_t>& dims, double seed) {
  return tensorText("float", name, dims, asFloats(sampleValues(product(dims, 0), seed)));
}

/// Folds with bn-fold, checks ONNX Runtime agrees, no BN is left and the output passes onnx::checker.
Report foldAndCompare(Model& model) {
  auto outcome = applyRulesAndCompare(model, {"bn-fold"}, kAtol, kRtol);
  INFO(outcome.report.dump());
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  CHECK(countOps(model, "BatchNormalization") == 0);
  CHECK_NOTHROW(onnx::checker::check_model(modelToProto(model)));
  return outcome.report;
}

std::string pathOps(const nlohmann::json& entry) {
  std::string text;
  for (const auto& step : entry["path"]) text += (text.empty() ? "" : ",") + step["op"].get<std::string>();
  return text;
}

void expectSkipped(const std::string& text, const std::string& code) {
  expectBatchNormSkipped(text, {"bn-fold"}, code);
}
}  // namespace

TEST_CASE("bn-fold layout: old PyTorch's Gemm -> Unsqueeze -> BN -> Squeeze", "[bn-fold][layout]") {
  SECTION("opset 9: axes as attributes") {
    auto model = parseModel(header(9) + "g (float[4,3] x) => (float[4,5] y)\n<" + weights("w", {5, 3}, 1) + ", " +
                            weights("bias", {5}, 2) + ", " + params(5, 3) +
                            ">\n{\n  c = Gemm <transB = 1> (x, w, bias)\n  u = Unsqueeze <axes = [2]> (c)\n"
                            "  n = BatchNormalization <epsilon = 0.001> (u, s, b, m, v)\n  y = Squeeze <axes = [2]> (n)\n}\n");
    const Report report = foldAndCompare(*model);
    REQUIRE(report.section("folds").size() == 1);
    CHECK(pathOps(report.section("folds")[0]) == "Unsqueeze");
    CHECK(opSequence(model->graph()) == "Gemm,Unsqueeze,Squeeze");
  }
  SECTION("opset 13: axes as inputs") {
    auto model = parseModel(header(13) + "g (float[N,3] x) => (float[N,5] y)\n<" + weights("w", {5, 3}, 1) + ", " +
                            params(5, 3) + ", int64[1] ax = {2}" +
                            ">\n{\n  c = Gemm <transB = 1> (x, w)\n  u = Unsqueeze (c, ax)\n"
                            "  n = BatchNormalization <epsilon = 0.001> (u, s, b, m, v)\n  y = Squeeze (n, ax)\n}\n");
    const Report report = foldAndCompare(*model);
    REQUIRE(report.section("folds").size() == 1);
    CHECK(report.section("folds")[0]["bias_created"] == true);
  }
}

TEST_CASE("bn-fold layout: an Unsqueeze with a repeated axis is not followed", "[bn-fold][layout]") {
  // Found by the graph fuzzer: the repeated axis made the path read past the input's dims.
  expectSkipped(header(9) + "g (float[4,3] x) => (float[4,5,1,1] y)\n<" + weights("w", {5, 3}, 1) + ", " +
                    weights("bias", {5}, 2) + ", " + params(5, 3) +
                    ">\n{\n  c = Gemm <transB = 1> (x, w, bias)\n  u = Unsqueeze <axes = [2, 2]> (c)\n"
                    "  y = BatchNormalization <epsilon = 0.001> (u, s, b, m, v)\n}\n",
                "channel-axis-mismatch");
}

TEST_CASE("bn-fold layout: MatMul -> Reshape -> BN becomes a Gemm with the bias", "[bn-fold][layout]") {
  SECTION("static batch") {
    auto model = parseModel(header(13) + "g (float[4,3] x) => (float[4,2,1,1] y)\n<" + weights("w", {3, 2}, 4) + ", " +
                            params(2, 5) + ", int64[4] shp = {4, 2, 1, 1}" +
                            ">\n{\n  c = MatMul (x, w)\n  r = Reshape (c, shp)\n"
                            "  y = BatchNormalization <epsilon = 0.001> (r, s, b, m, v)\n}\n");
    const Report report = foldAndCompare(*model);
    REQUIRE(report.section("folds").size() == 1);
    CHECK(report.section("folds")[0]["into_op"] == "Gemm");
    CHECK(opSequence(model->graph()) == "Gemm,Reshape");
  }
  SECTION("unknown batch, Reshape with 0 and -1") {
    auto model = parseModel(header(13) + "g (float[N,3] x) => (float[N,2,1] y)\n<" + weights("w", {3, 2}, 4) + ", " +
                            params(2, 5) + ", int64[3] shp = {-1, 2, 1}" +
                            ">\n{\n  c = MatMul (x, w)\n  r = Reshape (c, shp)\n"
                            "  y = BatchNormalization <epsilon = 0.001> (r, s, b, m, v)\n}\n");
    const Report report = foldAndCompare(*model);
    CHECK(report.section("folds").size() == 1);
  }
}

TEST_CASE("bn-fold layout: a Reshape whose target shape holds no integers is not followed", "[bn-fold][layout]") {
  // Found by the graph fuzzer: a complex64 shape made the fold throw "cannot be read as numbers" (exit 2), and a
  // float one was read as integers. Such a model is invalid (Reshape's shape is int64); the BN stays.
  const std::string text = header(13) + "g (float[4,3] x) => (float[4,2,1,1] y)\n<" + weights("w", {3, 2}, 4) + ", " +
                           params(2, 5) + ", int64[4] shp = {4, 2, 1, 1}" +
                           ">\n{\n  c = MatMul (x, w)\n  r = Reshape (c, shp)\n"
                           "  y = BatchNormalization <epsilon = 0.001> (r, s, b, m, v)\n}\n";
  for (const int32_t type : {onnx::TensorProto::COMPLEX64, onnx::TensorProto::DOUBLE}) {
    INFO(type);
    onnx::ModelProto proto = parseModelProto(text);
    for (onnx::TensorProto& tensor : *proto.mutable_graph()->mutable_initializer()) {
      if (tensor.name() != "shp") continue;
      // Same bytes (8 per element), another type.
      std::string raw;
      for (const int64_t dim : tensor.int64_data()) raw.append(reinterpret_cast<const char*>(&dim), sizeof dim);
      tensor.clear_int64_data();
      tensor.set_raw_data(raw);
      tensor.set_data_type(type);
    }
    auto model = modelFromProto(std::move(proto), "<onnx text>", ".");
    const Report report = applyRules(*model, {"bn-fold"});
    INFO(report.dump());
    CHECK(report.section("folds").empty());
    CHECK(skipReason(report, "BatchNormalization_0") == "rank-unknown");
    CHECK(opSequence(model->graph()) == "MatMul,Reshape,BatchNormalization");
  }
}

TEST_CASE("bn-fold layout: MatMul [N,T,C] -> Transpose -> BN -> Transpose gets its bias in an Add", "[bn-fold][layout]") {
  auto model = parseModel(header(13) + "g (float[2,5,3] x) => (float[2,5,4] y)\n<" + weights("w", {3, 4}, 6) + ", " +
                          params(4, 7) +
                          ">\n{\n  c = MatMul (x, w)\n  t = Transpose <perm = [0, 2, 1]> (c)\n"
                          "  n = BatchNormalization <epsilon = 0.001> (t, s, b, m, v)\n"
                          "  y = Transpose <perm = [0, 2, 1]> (n)\n}\n");
  const Report report = foldAndCompare(*model);
  REQUIRE(report.section("folds").size() == 1);
  const auto entry = report.section("folds")[0];
  CHECK(entry["into_op"] == "MatMul");
  CHECK(entry.contains("bias_node"));
  CHECK(opSequence(model->graph()) == "MatMul,Add,Transpose,Transpose");
}

TEST_CASE("bn-fold layout: Keras's Conv -> Transpose(0,2,3,1) -> Identity -> Transpose(0,3,1,2) -> BN", "[bn-fold][layout]") {
  for (const std::string op : {"Conv", "ConvTranspose"}) {
    DYNAMIC_SECTION(op) {
      const std::vector<int64_t> wdims = op == "Conv" ? std::vector<int64_t>{4, 3, 3, 3} : std::vector<int64_t>{3, 4, 3, 3};
      auto model = parseModel(header(13) + "g (float[1,3,6,6] x) => (float[1,6,6,4] y)\n<" + weights("w", wdims, 8) +
                              ", " + params(4, 9) + ">\n{\n  c = " + op + " <pads = [1, 1, 1, 1]> (x, w)\n"
                              "  h = Transpose <perm = [0, 2, 3, 1]> (c)\n  i = Identity (h)\n"
                              "  t = Transpose <perm = [0, 3, 1, 2]> (i)\n"
                              "  n = BatchNormalization <epsilon = 0.001> (t, s, b, m, v)\n"
                              "  y = Transpose <perm = [0, 2, 3, 1]> (n)\n}\n");
      const Report report = foldAndCompare(*model);
      REQUIRE(report.section("folds").size() == 1);
      CHECK(pathOps(report.section("folds")[0]) == "Transpose,Identity,Transpose");
    }
  }
}

TEST_CASE("bn-fold layout: Gemm -> Flatten -> BN", "[bn-fold][layout]") {
  auto model = parseModel(header(13) + "g (float[4,3] x) => (float[4,5] y)\n<" + weights("w", {3, 5}, 10) + ", " +
                          params(5, 11) + ">\n{\n  c = Gemm (x, w)\n  f = Flatten (c)\n"
                          "  y = BatchNormalization <epsilon = 0.001> (f, s, b, m, v)\n}\n");
  const Report report = foldAndCompare(*model);
  CHECK(report.section("folds").size() == 1);
}

TEST_CASE("bn-fold layout: a Concat of layers on the channel axis splits the BN", "[bn-fold][layout]") {
  SECTION("two Convs, axis 1") {
    auto model = parseModel(header(13) + "g (float[1,3,5,5] x) => (float[1,6,5,5] y)\n<" + weights("w1", {2, 3, 1, 1}, 12) +
                            ", " + weights("w2", {4, 3, 3, 3}, 13) + ", " + weights("b2", {4}, 14) + ", " + params(6, 15) +
                            ">\n{\n  c1 = Conv (x, w1)\n  c2 = Conv <pads = [1, 1, 1, 1]> (x, w2, b2)\n"
                            "  c = Concat <axis = 1> (c1, c2)\n  y = BatchNormalization <epsilon = 0.001> (c, s, b, m, v)\n}\n");
    const Report report = foldAndCompare(*model);
    REQUIRE(report.section("folds").size() == 2);
    CHECK(report.section("folds")[0]["channels"] == nlohmann::json({0, 2}));
    CHECK(report.section("folds")[1]["channels"] == nlohmann::json({2, 6}));
    CHECK(report.section("folds")[0]["split_by"] == "Concat_0");
    CHECK(opSequence(model->graph()) == "Conv,Conv,Concat");
  }
  SECTION("three Convs, one grouped, negative axis") {
    auto model = parseModel(header(13) + "g (float[1,4,5,5] x) => (float[1,9,5,5] y)\n<" + weights("w1", {2, 4, 1, 1}, 16) +
                            ", " + weights("w2", {4, 2, 1, 1}, 17) + ", " + weights("w3", {3, 4, 1, 1}, 18) + ", " +
                            params(9, 19) +
                            ">\n{\n  c1 = Conv (x, w1)\n  c2 = Conv <group = 2> (x, w2)\n  c3 = Conv (x, w3)\n"
                            "  c = Concat <axis = -3> (c1, c2, c3)\n  y = BatchNormalization <epsilon = 0.001> (c, s, b, m, v)\n}\n");
    const Report report = foldAndCompare(*model);
    CHECK(report.section("folds").size() == 3);
  }
}

TEST_CASE("bn-fold layout: conditions that stop the fold, each with its reason", "[bn-fold][layout]") {
  const std::string gemm = header(13) + "g (float[4,3] x, int64[2] dyn) => (float[2,2,2] y)\n<" + weights("w", {3, 2}, 1) +
                           ", " + params(2, 2) + ", int64[3] shp = {2, 2, 2}>\n{\n  c = Gemm (x, w)\n";
  SECTION("the Reshape's target shape is not known") {
    expectSkipped(header(13) + "g (float[4,3] x, int64[4] dyn) => (float[4,2,1,1] y)\n<" + weights("w", {3, 2}, 1) +
                      ", " + params(2, 2) + ">\n{\n  c = Gemm (x, w)\n  r = Reshape (c, dyn)\n"
                      "  y = BatchNormalization (r, s, b, m, v)\n}\n",
                  "rank-unknown");
  }
  SECTION("a Reshape that moves the channels off their own axis") {
    expectSkipped(gemm + "  r = Reshape (c, shp)\n  y = BatchNormalization (r, s, b, m, v)\n}\n", "channel-axis-mismatch");
  }
  SECTION("Transposes that do not bring the channel axis back to 1") {
    expectSkipped(header(13) + "g (float[1,2,2,2] x) => (float[1,2,2,2] y)\n<" + weights("w", {2, 2, 1, 1}, 3) + ", " +
                      params(2, 4) + ">\n{\n  c = Conv (x, w)\n  h = Transpose <perm = [0, 2, 3, 1]> (c)\n"
                      "  t = Transpose <perm = [0, 2, 3, 1]> (h)\n  y = BatchNormalization (t, s, b, m, v)\n}\n",
                  "channel-axis-mismatch");
  }
  SECTION("a value on the path is read by another node") {
    expectSkipped(header(13) + "g (float[4,3] x) => (float[4,2,1] y, float[4,2,1] z)\n<" + weights("w", {3, 2}, 1) +
                      ", " + params(2, 2) + ", int64[1] ax = {2}>\n{\n  c = Gemm (x, w)\n  u = Unsqueeze (c, ax)\n"
                      "  z = Relu (u)\n  y = BatchNormalization (u, s, b, m, v)\n}\n",
                  "layer-has-other-consumers");
  }
  SECTION("a value on the path is a graph output") {
    expectSkipped(header(13) + "g (float[4,3] x) => (float[4,2,1] y, float[4,2] c)\n<" + weights("w", {3, 2}, 1) +
                      ", " + params(2, 2) + ", int64[1] ax = {2}>\n{\n  c = Gemm (x, w)\n  u = Unsqueeze (c, ax)\n"
                      "  y = BatchNormalization (u, s, b, m, v)\n}\n",
                  "layer-has-other-consumers");
  }
  SECTION("the path does not start at a layer") {
    expectSkipped(header(13) + "g (float[4,2] x) => (float[4,2,1] y)\n<" + params(2, 2) +
                      ", int64[1] ax = {2}>\n{\n  r = Relu (x)\n  u = Unsqueeze (r, ax)\n"
                      "  y = BatchNormalization (u, s, b, m, v)\n}\n",
                  "no-foldable-producer");
  }
  SECTION("the rank of a MatMul's output is not known") {
    expectSkipped(header(13) + "g (float x) => (float y)\n<" + weights("w", {3, 2}, 1) + ", " + params(2, 2) +
                      ">\n{\n  c = MatMul (x, w)\n  t = Transpose <perm = [0, 2, 1]> (c)\n"
                      "  y = BatchNormalization (t, s, b, m, v)\n}\n",
                  "rank-unknown");
  }
  const std::string convs = header(13) + "g (float[1,3,5,5] x) => (float[1,4,5,5] y, float[1,2,5,5] z)\n<" +
                            weights("w1", {2, 3, 1, 1}, 5) + ", " + weights("w2", {2, 3, 1, 1}, 6) + ", " + params(4, 7) +
                            ">\n{\n  c1 = Conv (x, w1)\n";
  SECTION("a Concat input that is not a layer") {
    expectSkipped(convs + "  r = Relu (x)\n  c2 = Conv (r, w2)\n  z = Relu (c2)\n  q = Identity (c1)\n"
                          "  c = Concat <axis = 1> (q, c2)\n  y = BatchNormalization (c, s, b, m, v)\n}\n",
                  "no-foldable-producer");
  }
  SECTION("a Concat input read by another node") {
    expectSkipped(convs + "  c2 = Conv (x, w2)\n  z = Relu (c2)\n"
                          "  c = Concat <axis = 1> (c1, c2)\n  y = BatchNormalization (c, s, b, m, v)\n}\n",
                  "layer-has-other-consumers");
  }
  SECTION("a Concat along another axis than the channels") {
    expectSkipped(header(13) + "g (float[1,3,5,5] x) => (float[1,2,10,5] y)\n<" + weights("w1", {2, 3, 1, 1}, 5) + ", " +
                      weights("w2", {2, 3, 1, 1}, 6) + ", " + params(2, 7) +
                      ">\n{\n  c1 = Conv (x, w1)\n  c2 = Conv (x, w2)\n  c = Concat <axis = 2> (c1, c2)\n"
                      "  y = BatchNormalization (c, s, b, m, v)\n}\n",
                  "channel-axis-mismatch");
  }
}

TEST_CASE("bn-fold layout: Conv -> Flatten -> BN when the Conv's window leaves 1x1 (strides, pads, dilations)", "[bn-fold][layout]") {
  // x [2,3,7,7], kernel 3x3, dilation 2, stride 3, pads 1: (7 + 2 - 5) / 3 + 1 = 2; a 2x2 output does not flatten
  // per channel, a 1x1 does: kernel 3x3, dilation 3 on 7x7 without pads gives (7 - 7) / 1 + 1 = 1.
  auto model = parseModel(header(13) + "g (float[2,3,7,7] x) => (float[2,4] y)\n<" + weights("w", {4, 3, 3, 3}, 20) +
                          ", " + params(4, 21) + ">\n{\n  c = Conv <dilations = [3, 3]> (x, w)\n  f = Flatten (c)\n"
                          "  y = BatchNormalization <epsilon = 0.001> (f, s, b, m, v)\n}\n");
  const Report report = foldAndCompare(*model);
  CHECK(report.section("folds").size() == 1);
  auto wide = parseModel(header(13) + "g (float[2,3,7,7] x) => (float[2,16] y)\n<" + weights("w", {4, 3, 3, 3}, 20) +
                         ", " + params(4, 21) + ">\n{\n  c = Conv <dilations = [2, 2], strides = [3, 3], pads = [1, 1, 1, 1]> (x, w)\n"
                         "  f = Flatten (c)\n  y = BatchNormalization <epsilon = 0.001> (f, s, b, m, v)\n}\n");
  const Report refused = applyRules(*wide, {"bn-fold"});
  CHECK(skipReason(refused, "BatchNormalization_0") == "channel-axis-mismatch");
}
