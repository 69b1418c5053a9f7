// Constants behind chains of ops (issue 12): weights and BatchNormalization parameters that real exporters compute
// from constants (PyTorch's Identity of a de-duplicated tensor, caffe2's ConstantOfShape, Cast, Reshape/Unsqueeze/
// Transpose of a weight, Concat/Slice/Gather/Expand, `var + eps` chains) are evaluated, become initializers through
// the rewriter (reported in `evaluated`), and the chain's nodes nothing else reads go. Each positive case is checked
// in ONNX Runtime; each condition that stops the evaluation has a negative test with its reason code.
#include <catch2/catch.hpp>
#include <onnx/checker.h>

#include "test_bn_fold_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;

namespace {

constexpr double kAtol = 1e-5, kRtol = 1e-4;

std::string header(int opset = 13, int irVersion = 8) {
  return "<ir_version: " + std::to_string(irVersion) + ", opset_import: [\"\" : " + std::to_string(opset) + "]>\n";
}

/// A 1x1 Conv (2 -> 2 channels) into a BatchNormalization whose inputs are `w`, `s`, `b`, `m`, `v`, made by
/// `body` from `initializers`.
std::string convBn(const std::string& initializers, const std::string& body, int opset = 13, int irVersion = 8,
                   const std::string& extraInputs = "") {
  return header(opset, irVersion) + "g (float[1,2,3,3] x" + extraInputs + ") => (float[1,2,3,3] y)\n<" +
         initializers + ">\n{\n" + body + "  c = Conv (x, w)\n  y = BatchNormalization <epsilon = 0.001> (c, s, b, m, v)\n}\n";
}

const char* const kPlainWeight = "float[2,2,1,1] w = {0.5, -1.25, 2, 0.75}";
const char* const kPlainParams =
    "float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375}, float[2] v = {0.5, 2}";

/// Folds with the default rules, checks ONNX Runtime agrees and the output passes onnx::checker, and that no
/// BatchNormalization is left; returns the report.
Report foldAll(Model& model, const RuleOptions& options = {}) {
  auto outcome = applyRulesAndCompare(model, parseRuleSelection("default"), kAtol, kRtol, options);
  INFO(outcome.report.dump());
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  CHECK(countOps(model, "BatchNormalization") == 0);
  CHECK_NOTHROW(onnx::checker::check_model(modelToProto(model)));
  return outcome.report;
}

/// The Conv+BN model with its weight `w` computed as Cast(w16) from a float16 initializer (ONNX text in libonnx
/// 1.12 has no float16 literals, so w16 is converted after parsing).
std::unique_ptr<Model> castWeightModel() {
  auto proto = parseModelProto(convBn("float[2,2,1,1] w16 = {0.5, -1.25, 2, 0.75}, " + std::string(kPlainParams),
                                      "  w = Cast <to = 1> (w16)\n"));
  for (auto& init : *proto.mutable_graph()->mutable_initializer()) {
    if (init.name() != "w16") continue;
    const std::vector<double> values(init.float_data().begin(), init.float_data().end());
    init = Tensor::fromDoubles("w16", DataType::Float16, {2, 2, 1, 1}, values).proto();
  }
  return modelFromProto(std::move(proto));
}

/// The op types of every `evaluated` entry's chain, joined: "Identity;Cast,Reshape".
std::string evaluatedOps(const Report& report) {
  std::string text;
  for (const auto& entry : report.section("evaluated")) {
    if (!text.empty()) text += ";";
    std::string ops;
    for (const auto& op : entry["ops"]) ops += (ops.empty() ? "" : ",") + op.get<std::string>();
    text += ops;
  }
  return text;
}

/// bn-fold leaves the model's BN in place with `code`; nothing is evaluated or removed.
void expectSkipped(const std::string& text, const std::string& code, const RuleOptions& options = {}) {
  const Report report = expectBatchNormSkipped(text, {"bn-fold"}, code, options);
  CHECK(report.section("evaluated").empty());
}
}  // namespace

TEST_CASE("constant chains: PyTorch's Identity-shared BN parameters fold, the Identity nodes go", "[constant-eval]") {
  // Two Conv+BN branches with equal statistics: the exporter stored them once and reads them through Identity.
  auto model = parseModel(header(13) +
                          "g (float[1,2,3,3] x) => (float[1,2,3,3] y1, float[1,2,3,3] y2)\n<" + std::string(kPlainWeight) +
                          ", float[2,2,1,1] w2 = {1, 0.5, -0.25, 2}, " + kPlainParams +
                          ">\n{\n  m2 = Identity (m)\n  v2 = Identity (v)\n"
                          "  c1 = Conv (x, w)\n  y1 = BatchNormalization <epsilon = 0.001> (c1, s, b, m, v)\n"
                          "  c2 = Conv (x, w2)\n  y2 = BatchNormalization <epsilon = 0.001> (c2, s, b, m2, v2)\n}\n");
  const Report report = foldAll(*model);
  CHECK(report.section("folds").size() == 2);
  CHECK(evaluatedOps(report) == "Identity;Identity");
  CHECK(countOps(*model, "Identity") == 0);
  const auto entry = report.section("evaluated")[0];
  CHECK(entry["rule"] == "bn-fold");
  CHECK(entry["removed_nodes"].size() == 1);
  // The shared statistics are gone with their last reader.
  CHECK(findInitializer(*model, "m") == nullptr);
}

TEST_CASE("constant chains: Paddle's Constant-node weights and parameters fold", "[constant-eval]") {
  auto model = parseModel(convBn(
      "float[2,2,1,1] w0 = {0.5, -1.25, 2, 0.75}",
      "  w = Identity (w0)\n"
      "  s = Constant <value = float[2] {1.5, -0.5}> ()\n  b = Constant <value = float[2] {0.25, -1}> ()\n"
      "  m = Constant <value = float[2] {0.125, -0.375}> ()\n  v = Constant <value = float[2] {0.5, 2}> ()\n"));
  const Report report = foldAll(*model);
  CHECK(report.section("folds").size() == 1);
  CHECK(countOps(*model, "Constant") == 0);
  CHECK(countOps(*model, "Identity") == 0);
  CHECK(opSequence(model->graph()) == "Conv");
}

TEST_CASE("constant chains: caffe2's ConstantOfShape weights and parameters fold", "[constant-eval]") {
  auto model = parseModel(convBn(
      "int64[1] n = {2}, int64[4] wshape = {2,2,1,1}, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375}",
      "  w = ConstantOfShape <value = float[1] {0.75}> (wshape)\n"
      "  s = ConstantOfShape <value = float[1] {1.5}> (n)\n"
      "  v = ConstantOfShape <value = float[1] {2}> (n)\n"));
  const Report report = foldAll(*model);
  CHECK(report.section("folds").size() == 1);
  CHECK(evaluatedOps(report) == "ConstantOfShape;ConstantOfShape;ConstantOfShape");
  CHECK(countOps(*model, "ConstantOfShape") == 0);
  CHECK(findInitializer(*model, "n") == nullptr);
}

TEST_CASE("constant chains: a Conv bias from ConstantOfShape (zeros) is folded into", "[constant-eval]") {
  auto model = parseModel(header(13) + "g (float[1,2,3,3] x) => (float[1,2,3,3] y)\n<" + std::string(kPlainWeight) +
                          ", int64[1] n = {2}, " + kPlainParams +
                          ">\n{\n  bias = ConstantOfShape (n)\n  c = Conv (x, w, bias)\n"
                          "  y = BatchNormalization <epsilon = 0.001> (c, s, b, m, v)\n}\n");
  const Report report = foldAll(*model);
  CHECK(report.section("folds").size() == 1);
  CHECK(countOps(*model, "ConstantOfShape") == 0);
}

TEST_CASE("constant chains: float16 weights behind a Cast fold", "[constant-eval]") {
  auto model = castWeightModel();
  const Report report = foldAll(*model);
  CHECK(evaluatedOps(report) == "Cast");
  CHECK(countOps(*model, "Cast") == 0);
  CHECK(report.section("evaluated")[0]["data_type"] == "float");
}

TEST_CASE("constant chains: Reshape, Unsqueeze and Squeeze of parameters, attribute and input forms", "[constant-eval]") {
  SECTION("opset 11: axes as attributes") {
    auto model = parseModel(convBn(
        "float[1,2] s2 = {1.5, -0.5}, float[2,1] b2 = {0.25, -1}, float[2] m = {0.125, -0.375}, float[2] v = {0.5, 2},"
        " float[2,2] w2 = {0.5, -1.25, 2, 0.75}",
        "  s = Squeeze <axes = [0]> (s2)\n  b = Squeeze <axes = [1]> (b2)\n  w = Unsqueeze <axes = [2, 3]> (w2)\n",
        11));
    const Report report = foldAll(*model);
    CHECK(evaluatedOps(report) == "Squeeze;Squeeze;Unsqueeze");  // BN parameters first, then the weight
  }
  SECTION("opset 13: axes as inputs, Reshape with 0 and -1") {
    auto model = parseModel(convBn(
        "float[1,2] s2 = {1.5, -0.5}, float[2,1] b2 = {0.25, -1}, float[2] m = {0.125, -0.375}, float[2] v = {0.5, 2},"
        " float[4] w4 = {0.5, -1.25, 2, 0.75}, int64[1] a0 = {0}, int64[4] wshape = {2, -1, 1, 1},"
        " int64[1] flat = {-1}",
        "  s = Squeeze (s2, a0)\n  b = Reshape (b2, flat)\n  w = Reshape (w4, wshape)\n", 13));
    const Report report = foldAll(*model);
    CHECK(report.section("evaluated").size() == 3);
    CHECK(countOps(*model, "Reshape") == 0);
    CHECK(countOps(*model, "Squeeze") == 0);
  }
}

TEST_CASE("constant chains: a Gemm weight behind a Transpose folds", "[constant-eval]") {
  auto model = parseModel(header(13) +
                          "g (float[4,3] x) => (float[4,2] y)\n<float[2,3] wt = {0.5, -1, 2, 0.25, 1.5, -0.75}, " +
                          kPlainParams +
                          ">\n{\n  w = Transpose <perm = [1, 0]> (wt)\n  c = Gemm (x, w)\n"
                          "  y = BatchNormalization <epsilon = 0.001> (c, s, b, m, v)\n}\n");
  const Report report = foldAll(*model);
  CHECK(report.section("folds").size() == 1);
  CHECK(evaluatedOps(report) == "Transpose");
  CHECK(opSequence(model->graph()) == "Gemm");
}

TEST_CASE("constant chains: Concat, Slice, Gather and Expand of constants", "[constant-eval]") {
  auto model = parseModel(convBn(
      std::string(kPlainWeight) +
          ", float[1] s0 = {1.5}, float[1] s1 = {-0.5}, float[4] ball = {9, 0.25, -1, 9},"
          " int64[1] st = {1}, int64[1] en = {3}, float[3] mtab = {-0.375, 7, 0.125}, int64[2] idx = {2, 0},"
          " float[1] v1 = {0.5}, int64[1] n = {2}",
      "  s = Concat <axis = 0> (s0, s1)\n  b = Slice (ball, st, en)\n  m = Gather <axis = 0> (mtab, idx)\n"
      "  v = Expand (v1, n)\n"));
  const Report report = foldAll(*model);
  CHECK(evaluatedOps(report) == "Concat;Slice;Gather;Expand");
  CHECK(opSequence(model->graph()) == "Conv");
}

TEST_CASE("constant chains: elementwise chains (var + eps, 1/sqrt, Pow, Max, Min, Neg, Sub, Div) fold", "[constant-eval]") {
  auto model = parseModel(convBn(
      std::string(kPlainWeight) +
          ", float[2] g0 = {0.75, -0.25}, float two = {2}, float[2] b0 = {-0.25, 1}, float[2] m0 = {0.25, -0.75},"
          " float[2] r = {0.7, 1.4}, float eps = {0.001}, float lo = {-0.3}, float hi = {0.2}, float half = {0.5}",
      "  s = Mul (g0, two)\n  b = Neg (b0)\n  mh = Min (m0, hi)\n  mm = Max (mh, lo)\n  m = Div (mm, half)\n"
      "  rr = Pow (r, two)\n  rs = Sub (rr, eps)\n  ri = Reciprocal (rs)\n  rq = Sqrt (ri)\n  v = Reciprocal (rq)\n"));
  const Report report = foldAll(*model);
  CHECK(report.section("folds").size() == 1);
  CHECK(report.section("evaluated").size() == 4);
  CHECK(opSequence(model->graph()) == "Conv");
  // The reported chain of v lists every op on the way, in evaluation order.
  for (const auto& entry : report.section("evaluated"))
    if (entry["value"] == "v") CHECK(entry["ops"] == nlohmann::json({"Pow", "Sub", "Reciprocal", "Sqrt", "Reciprocal"}));
}

TEST_CASE("constant chains: the evaluated values are the chain's own, computed in double and rounded once", "[constant-eval]") {
  // var = Add(v0, 1e-8) in float: exactly what the chain computes decides the fold; compare the folded weight
  // with the reference computed from the evaluated parameters.
  auto model = parseModel(convBn(std::string(kPlainWeight) +
                                     ", float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375},"
                                     " float[2] v0 = {0.5, 2}, float[2] d = {0.25, 1}",
                                 "  v = Add (v0, d)\n"));
  const Report report = applyRules(*model, {"bn-fold"});
  REQUIRE(report.section("folds").size() == 1);
  const auto fold = report.section("folds")[0];
  CHECK(fold["var"] == nlohmann::json({0.75, 3.0}));
}

TEST_CASE("constant chains: bias-add and scale-fold see chain constants too", "[constant-eval]") {
  auto model = parseModel(header(13) + "g (float[1,2,3,3] x) => (float[1,2,3,3] y)\n<" + std::string(kPlainWeight) +
                          ", float[2] k0 = {2, -1}, float[2] c0 = {0.5, 0.25}, int64[4] shp = {1, 2, 1, 1}>\n{\n"
                          "  c = Conv (x, w)\n  k = Reshape (k0, shp)\n  mcv = Mul (c, k)\n"
                          "  cc = Reshape (c0, shp)\n  y = Add (mcv, cc)\n}\n");
  auto outcome = applyRulesAndCompare(*model, parseRuleSelection("default"), kAtol, kRtol);
  INFO(outcome.report.dump());
  CHECK(outcome.comparison.ok);
  CHECK(opSequence(model->graph()) == "Conv");
  CHECK(outcome.report.section("evaluated").size() == 2);
}

TEST_CASE("constant chains: a chain shared by two BatchNormalization nodes is evaluated once", "[constant-eval]") {
  auto model = parseModel(header(13) +
                          "g (float[1,2,3,3] x) => (float[1,2,3,3] y1, float[1,2,3,3] y2)\n<" + std::string(kPlainWeight) +
                          ", float[2,2,1,1] w2 = {1, 0.5, -0.25, 2}, float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1},"
                          " float[2] m = {0.125, -0.375}, float[2] v0 = {0.5, 2}, float eps = {0.25}>\n{\n"
                          "  v = Add (v0, eps)\n"
                          "  c1 = Conv (x, w)\n  y1 = BatchNormalization <epsilon = 0.001> (c1, s, b, m, v)\n"
                          "  c2 = Conv (x, w2)\n  y2 = BatchNormalization <epsilon = 0.001> (c2, s, b, m, v)\n}\n");
  const Report report = foldAll(*model);
  CHECK(report.section("folds").size() == 2);
  CHECK(report.section("evaluated").size() == 1);
  CHECK(countOps(*model, "Add") == 0);
}

TEST_CASE("constant chains: a chain node that something else reads stays", "[constant-eval]") {
  auto model = parseModel(header(13) + "g (float[1,2,3,3] x) => (float[1,2,3,3] y, float[2] a)\n<" +
                          std::string(kPlainWeight) +
                          ", float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375},"
                          " float[2] v0 = {0.5, 2}, float eps = {0.25}>\n{\n"
                          "  a = Add (v0, eps)\n  v = Sqrt (a)\n"
                          "  c = Conv (x, w)\n  y = BatchNormalization <epsilon = 0.001> (c, s, b, m, v)\n}\n");
  const Report report = foldAll(*model);
  REQUIRE(report.section("evaluated").size() == 1);
  CHECK(report.section("evaluated")[0]["removed_nodes"] == nlohmann::json({"Sqrt_0"}));
  CHECK(countOps(*model, "Add") == 1);  // `a` is a graph output
  CHECK(countOps(*model, "Sqrt") == 0);
}

TEST_CASE("constant chains: folding the output again changes nothing", "[constant-eval]") {
  auto model = castWeightModel();
  applyRules(*model, parseRuleSelection("default"));
  auto again = modelFromProto(modelToProto(*model));
  const Report second = applyRules(*again, parseRuleSelection("default"));
  CHECK(second.rewriteCount() == 0);
}

TEST_CASE("constant chains: conditions that stop the evaluation, each with its reason", "[constant-eval]") {
  SECTION("a graph input in the chain") {
    expectSkipped(convBn(std::string(kPlainWeight) + ", float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1},"
                                                     " float[2] m = {0.125, -0.375}",
                         "  v = Identity (vin)\n", 13, 8, ", float[2] vin"),
                  "params-not-constant");
  }
  SECTION("an initializer that is also a graph input (IR >= 4) in the chain") {
    expectSkipped(convBn(std::string(kPlainWeight) + ", float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1},"
                                                     " float[2] m = {0.125, -0.375}, float[2] vin = {0.5, 2}",
                         "  v = Identity (vin)\n", 13, 8, ", float[2] vin"),
                  "params-overridable");
  }
  SECTION("quantized weights (DequantizeLinear)") {
    expectSkipped(convBn(std::string(kPlainParams) + ", int8[2,2,1,1] wq = {5, -12, 20, 7}, float ws = {0.1},"
                                                     " int8 wz = {0}",
                         "  w = DequantizeLinear (wq, ws, wz)\n"),
                  "quantized-weights");
  }
  SECTION("a result larger than the limit") {
    RuleOptions options;
    options.maxConstantBytes = 4;
    expectSkipped(convBn(std::string(kPlainWeight) + ", float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1},"
                                                     " float[2] m = {0.125, -0.375}, float[2] v0 = {0.5, 2}, float e = {1}",
                         "  v = Add (v0, e)\n"),
                  "constant-too-large", options);
  }
  SECTION("an op the evaluator does not compute") {
    expectSkipped(convBn(std::string(kPlainWeight) + ", float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1},"
                                                     " float[2] m = {0.125, -0.375}, float[2] v0 = {0.5, 2}",
                         "  v = Relu (v0)\n"),
                  "params-not-constant");
  }
  SECTION("a Concat without inputs (found by the graph fuzzer: it read a null first operand)") {
    expectSkipped(convBn(std::string(kPlainWeight) + ", float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1},"
                                                     " float[2] m = {0.125, -0.375}",
                         "  v = Concat <axis = 0> ()\n"),
                  "params-not-constant");
  }
  SECTION("a node of the chain kept by the user") {
    RuleOptions options;
    options.keepNodes = {"keepme"};
    auto text = convBn(std::string(kPlainWeight) + ", float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1},"
                                                   " float[2] m = {0.125, -0.375}, float[2] v0 = {0.5, 2}",
                       "  v = Identity (v0)\n");
    // Name the Identity so --keep can select it.
    auto proto = parseModelProto(text);
    for (auto& node : *proto.mutable_graph()->mutable_node())
      if (node.op_type() == "Identity") node.set_name("keepme");
    auto model = modelFromProto(std::move(proto));
    const Report report = applyRules(*model, {"bn-fold"}, options);
    CHECK(skipReason(report, "BatchNormalization_0") == "param-kept-by-user");
    CHECK(countOps(*model, "Identity") == 1);
  }
}

TEST_CASE("constant chains: through the CLI, the report lists what was evaluated and validates", "[constant-eval]") {
  TempDir dir;
  auto model = castWeightModel();
  saveModel(*model, dir.file("in.onnx"));
  std::string out, err;
  REQUIRE(runCommand(cli("fold " + dir.file("in.onnx") + " -o " + dir.file("out.onnx") + " --report " +
                         dir.file("report.json")),
                     &out, &err) == 0);
  const auto report = nlohmann::json::parse(readFile(dir.file("report.json")));
  REQUIRE(report["evaluated"].size() == 1);
  CHECK(report["evaluated"][0]["ops"] == nlohmann::json({"Cast"}));
  CHECK(runCommand("/usr/bin/python3 " + sourceDir() + "/scripts/validate_report.py " + dir.file("report.json"),
                   &out, &err) == 0);
  // A limit of 0 MiB evaluates nothing: the BN stays, with the reason.
  REQUIRE(runCommand(cli("fold " + dir.file("in.onnx") + " -o " + dir.file("out0.onnx") + " --max-constant-size 0"
                         " --report " + dir.file("report0.json")),
                     &out, &err) == 0);
  const auto limited = nlohmann::json::parse(readFile(dir.file("report0.json")));
  CHECK(limited["folds"].empty());
  REQUIRE(limited["skipped"].size() == 1);
  CHECK(limited["skipped"][0]["reason"] == "constant-too-large");
}
