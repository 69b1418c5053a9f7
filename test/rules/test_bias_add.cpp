// bias-add: a per-channel constant Add after Conv / ConvTranspose / Gemm / MatMul becomes the layer's bias.
// Every positive case checks the rewritten structure, the new bias against values computed here, the report
// entry, and the function in ONNX Runtime; every refusal checks the rule's reason code.

#include <catch2/catch.hpp>

#include "bnfold/check/fold.h"
#include "test_bn_fold_support.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;

namespace {

constexpr double kTol = 1e-5;

std::string floats(const std::string& name, const std::vector<int64_t>& dims, double seed) {
  return tensorText("float", name, dims, asFloats(sampleValues(product(dims, 0), seed)));
}

/// The rule's own verdict on one node (the driver does not report non-BN refusals).
MatchFailure refusal(Model& model, const std::string& ruleName, const std::string& nodeName,
                     const RuleOptions& options = {}) {
  const Node* node = findNodeByName(model, nodeName);
  REQUIRE(node);
  RuleContext context(model, options);
  MatchResult result = findRule(ruleName)->match(*node, context);
  REQUIRE_FALSE(result.matched());
  return result.failure();
}

std::vector<double> plus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

std::vector<double> biasOf(const Node* layer, int slot = 2) {
  REQUIRE(layer);
  REQUIRE(layer->input(static_cast<std::size_t>(slot)));
  return layer->input(static_cast<std::size_t>(slot))->constantTensor()->toDoubles();
}

void checkFoldsInOrt(const FoldOutcome& outcome) {
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  CHECK(outcome.comparison.maxAbs < 1e-4);
}

}  // namespace

TEST_CASE("bias-add: per-channel constant shapes on an NCHW output become the Conv bias", "[bias-add]") {
  struct Case {
    std::string constant;           // the constant in ONNX text
    std::vector<double> perChannel;  // what it adds to each of the 2 channels
  };
  const std::vector<Case> cases = {
      {"float[1,2,1,1] k = {0.5, -1.25}", {0.5, -1.25}},
      {"float[2,1,1] k = {0.75, 2}", {0.75, 2.0}},
      {"float k = {0.375}", {0.375, 0.375}},
      {"float[1] k = {-0.5}", {-0.5, -0.5}},
      {"float[1,1,1,1] k = {1.5}", {1.5, 1.5}},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.constant) {
      auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,5,5] x) => (float[1,2,3,3] y)
<)" + floats("w", {2, 3, 3, 3}, 1.0) + ", " + c.constant + R"(>
{
  conv = Conv (x, w)
  y = Add (conv, k)
}
)");
      FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
      checkFoldsInOrt(outcome);
      const Graph& graph = model->graph();
      CHECK(opSequence(graph) == "Conv");
      const Node* conv = findNode(graph, "Conv");
      CHECK(conv->output(0)->name() == "y");
      CHECK(conv->output(0)->isGraphOutput());
      CHECK(biasOf(conv) == c.perChannel);  // a bias-less Conv gets exactly the added values
      CHECK(graph.findLocal("k") == nullptr);  // the constant lost its only reader
      const auto& entries = outcome.report.section("bias_absorbed");
      REQUIRE(entries.size() == 1);
      CHECK(entries[0]["rule"] == "bias-add");
      CHECK(entries[0]["add"] == "Add_0");
      CHECK(entries[0]["layer"] == "Conv_0");
      CHECK(entries[0]["layer_op"] == "Conv");
      CHECK(entries[0]["bias_before"].is_null());
      CHECK(entries[0]["bias_after"] == conv->input(2)->name());
      CHECK(entries[0]["bias_created"] == true);
      CHECK(entries[0]["added"].get<std::vector<double>>() == c.perChannel);
    }
  }
}

TEST_CASE("bias-add: an existing Conv bias is added to, in a new initializer when shared", "[bias-add]") {
  // Both Convs read `b`; only the first is followed by an Add, so `b` must stay as it was for the second.
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y, float[1,2,4,4] z)
<)" + floats("w", {2, 3, 1, 1}, 2.0) + R"(, float[2] b = {0.25, -0.5}, float[2,1,1] k = {1, 3}>
{
  c1 = Conv (x, w, b)
  y = Add (c1, k)
  z = Conv (x, w, b)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
  checkFoldsInOrt(outcome);
  const Graph& graph = model->graph();
  CHECK(opSequence(graph) == "Conv,Conv");
  const Node* first = graph.findLocal("y")->producer();
  const Node* second = graph.findLocal("z")->producer();
  CHECK(biasOf(first) == plus({0.25, -0.5}, {1, 3}));
  CHECK(first->input(2)->name() != "b");
  CHECK(second->input(2)->name() == "b");
  CHECK(biasOf(second) == std::vector<double>{0.25, -0.5});
  const auto& entry = outcome.report.section("bias_absorbed").at(0);
  CHECK(entry["bias_before"] == "b");
  CHECK(entry["bias_after"] == first->input(2)->name());
  CHECK(entry["bias_created"] == false);
}

TEST_CASE("bias-add: Add(constant, X) with swapped operands folds too", "[bias-add]") {
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + floats("w", {2, 3, 1, 1}, 3.0) + R"(, float[2] b = {1, 2}, float[1,2,1,1] k = {-4, 0.5}>
{
  conv = Conv (x, w, b)
  y = Add (k, conv)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
  checkFoldsInOrt(outcome);
  CHECK(opSequence(model->graph()) == "Conv");
  CHECK(biasOf(findNode(model->graph(), "Conv")) == std::vector<double>{-3, 2.5});
}

TEST_CASE("bias-add: a chain Conv -> Add -> Add folds completely", "[bias-add]") {
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + floats("w", {2, 3, 3, 3}, 4.0) + R"(, float[2,1,1] k1 = {0.5, 1}, float k2 = {-2}>
{
  conv = Conv <pads = [1,1,1,1]> (x, w)
  a = Add (conv, k1)
  y = Add (k2, a)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
  checkFoldsInOrt(outcome);
  CHECK(opSequence(model->graph()) == "Conv");
  CHECK(biasOf(findNode(model->graph(), "Conv")) == std::vector<double>{-1.5, -1});
  CHECK(outcome.report.section("bias_absorbed").size() == 2);
  CHECK(model->graph().findLocal("y")->producer()->opType() == "Conv");
}

TEST_CASE("bias-add: 1-D and 3-D convolutions and grouped ConvTranspose", "[bias-add]") {
  SECTION("Conv1D with a [C,1] constant") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[2,3,6] x) => (float[2,4,4] y)
<)" + floats("w", {4, 3, 3}, 5.0) + R"(, float[4,1] k = {1, 2, 3, 4}>
{
  conv = Conv (x, w)
  y = Add (conv, k)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(opSequence(model->graph()) == "Conv");
    CHECK(biasOf(findNode(model->graph(), "Conv")) == std::vector<double>{1, 2, 3, 4});
  }
  SECTION("Conv3D with a [1,C,1,1,1] constant") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,2,3,3,3] x) => (float[1,2,2,2,2] y)
<)" + floats("w", {2, 2, 2, 2, 2}, 6.0) + R"(, float[2] b = {0.5, 0.25}, float[1,2,1,1,1] k = {-1, 1}>
{
  conv = Conv (x, w, b)
  y = Add (conv, k)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(opSequence(model->graph()) == "Conv");
    CHECK(biasOf(findNode(model->graph(), "Conv")) == std::vector<double>{-0.5, 1.25});
  }
  SECTION("ConvTranspose group=2 with a [1,C,1,1] constant") {
    // W [C_in=4, C_out/group=2, 2, 2] with group 2: 4 output channels.
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,4,3,3] x) => (float[1,4,6,6] y)
<)" + floats("w", {4, 2, 2, 2}, 7.0) + R"(, float[4] b = {1, 2, 3, 4}, float[1,4,1,1] k = {0.5, 0.5, -1, 2}>
{
  conv = ConvTranspose <group = 2, strides = [2,2]> (x, w, b)
  y = Add (conv, k)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(opSequence(model->graph()) == "ConvTranspose");
    CHECK(biasOf(findNode(model->graph(), "ConvTranspose")) == std::vector<double>{1.5, 2.5, 2, 6});
  }
}

TEST_CASE("bias-add: Gemm outputs take [N], [1,N] and scalars into C", "[bias-add]") {
  SECTION("no C: [N] becomes C") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[2,4] x) => (float[2,3] y)
<)" + floats("w", {4, 3}, 8.0) + R"(, float[3] k = {1, -2, 3}>
{
  gemm = Gemm (x, w)
  y = Add (gemm, k)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(opSequence(model->graph()) == "Gemm");
    CHECK(biasOf(findNode(model->graph(), "Gemm")) == std::vector<double>{1, -2, 3});
  }
  SECTION("C with beta=2, transB=1, alpha=0.5: C' = beta*C + k and beta becomes 1") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[2,4] x) => (float[2,3] y)
<)" + floats("w", {3, 4}, 9.0) + R"(, float[3] c = {0.5, 1, -1}, float[1,3] k = {1, 2, 3}>
{
  gemm = Gemm <transB = 1, alpha = 0.5, beta = 2.0> (x, w, c)
  y = Add (gemm, k)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    const Node* gemm = findNode(model->graph(), "Gemm");
    CHECK(biasOf(gemm) == std::vector<double>{2, 4, 1});
    CHECK(gemm->attributeFloat("beta", 1.0f) == 1.0f);
    CHECK(gemm->attributeFloat("alpha", 1.0f) == 0.5f);
  }
  SECTION("C of shape [M,N] plus a scalar keeps its per-row values") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[2,4] x) => (float[2,3] y)
<)" + floats("w", {4, 3}, 10.0) + R"(, float[2,3] c = {1, 2, 3, 4, 5, 6}, float k = {0.5}>
{
  gemm = Gemm (x, w, c)
  y = Add (gemm, k)
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    const Node* gemm = findNode(model->graph(), "Gemm");
    CHECK(gemm->input(2)->constantTensor()->dims() == std::vector<int64_t>{2, 3});
    CHECK(biasOf(gemm) == std::vector<double>{1.5, 2.5, 3.5, 4.5, 5.5, 6.5});
  }
}

TEST_CASE("bias-add: a 2-D MatMul and its bias Add become one Gemm", "[bias-add]") {
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[5,4] x) => (float[5,3] y)
<)" + floats("w", {4, 3}, 11.0) + R"(, float[3] k = {0.25, -0.75, 1.5}>
{
  mm = MatMul (x, w)
  y = Add (mm, k)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
  checkFoldsInOrt(outcome);
  const Graph& graph = model->graph();
  CHECK(opSequence(graph) == "Gemm");
  const Node* gemm = findNode(graph, "Gemm");
  CHECK(gemm->input(0)->name() == "x");
  CHECK(gemm->input(1)->name() == "w");
  CHECK(biasOf(gemm) == std::vector<double>{0.25, -0.75, 1.5});
  CHECK(gemm->output(0)->name() == "y");
  const auto& entry = outcome.report.section("bias_absorbed").at(0);
  CHECK(entry["layer"] == "MatMul_0");
  CHECK(entry["replaced_by"] == gemm->name());
  CHECK(entry["bias_created"] == true);
}

TEST_CASE("bias-add: a [C] constant on a 4-D output runs along the last axis and is left alone", "[bias-add]") {
  // Output [1,3,3,3]: the [3] constant is valid ONNX but adds along W (axis 3), not per channel.
  const std::string text = R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,5,5] x) => (float[1,3,3,3] y)
<)" + floats("w", {3, 3, 3, 3}, 12.0) + R"(, float[3] k = {1, 2, 3}>
{
  conv = Conv (x, w)
  y = Add (conv, k)
}
)";
  auto model = parseModel(text);
  const MatchFailure why = refusal(*model, "bias-add", "Add_0");
  CHECK(why.code == reason::kNotPerChannel);
  CHECK_THAT(why.message, Catch::Contains("axis 3") && Catch::Contains("not along the channel axis 1"));
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
  checkFoldsInOrt(outcome);
  CHECK(opSequence(model->graph()) == "Conv,Add");
  CHECK(outcome.report.section("bias_absorbed").empty());
}

TEST_CASE("bias-add: constants that are not a per-channel bias are refused with the reason", "[bias-add]") {
  struct Case {
    std::string outputType;
    std::string constant;
    std::string code;
    std::string mentions;
  };
  const std::vector<Case> cases = {
      // [2,3,1,1] spreads a batch of 1 over 2: the Add's output is bigger than the Conv's.
      {"float[2,3,3,3]", "float[2,3,1,1] k = {1,2,3,4,5,6}", "not-per-channel", "axis 0"},
      // Rank 5 on a rank-4 output raises the rank.
      {"float[1,1,3,3,3]", "float[1,1,3,1,1] k = {1,2,3}", "not-per-channel", "higher rank"},
      // [3,1] lines up with H.
      {"float[1,3,3,3]", "float[3,1] k = {1,2,3}", "not-per-channel", "axis 2"},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.constant) {
      auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,5,5] x) => ()" + c.outputType + R"( y)
<)" + floats("w", {3, 3, 3, 3}, 13.0) + ", " + c.constant + R"(>
{
  conv = Conv (x, w)
  y = Add (conv, k)
}
)");
      const MatchFailure why = refusal(*model, "bias-add", "Add_0");
      CHECK(std::string(why.code.str()) == c.code);
      CHECK_THAT(why.message, Catch::Contains(c.mentions));
      FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
      checkFoldsInOrt(outcome);
      CHECK(opSequence(model->graph()) == "Conv,Add");
    }
  }
  SECTION("a per-row [M,1] constant after Gemm") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[2,4] x) => (float[2,3] y)
<)" + floats("w", {4, 3}, 14.0) + R"(, float[2,1] k = {1, 2}>
{
  gemm = Gemm (x, w)
  y = Add (gemm, k)
}
)");
    const MatchFailure why = refusal(*model, "bias-add", "Add_0");
    CHECK(why.code == reason::kNotPerChannel);
    CHECK_THAT(why.message, Catch::Contains("axis 0"));
    FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(opSequence(model->graph()) == "Gemm,Add");
  }
}

TEST_CASE("bias-add: structural refusals", "[bias-add]") {
  SECTION("MatMul on a 3-D input has no bias slot and cannot become a Gemm") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[2,5,4] x) => (float[2,5,3] y)
<)" + floats("w", {4, 3}, 15.0) + R"(, float[3] k = {1, 2, 3}>
{
  mm = MatMul (x, w)
  y = Add (mm, k)
}
)");
    const MatchFailure why = refusal(*model, "bias-add", "Add_0");
    CHECK(why.code == reason::kLayerHasNoBias);
    CHECK_THAT(why.message, Catch::Contains("rank 3"));
    applyRules(*model, {"bias-add"});
    CHECK(opSequence(model->graph()) == "MatMul,Add");
  }
  SECTION("the Conv output is also read by another node") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y, float[1,2,4,4] r)
<)" + floats("w", {2, 3, 1, 1}, 16.0) + R"(, float[2,1,1] k = {1, 2}>
{
  conv = Conv (x, w)
  y = Add (conv, k)
  r = Relu (conv)
}
)");
    CHECK(refusal(*model, "bias-add", "Add_0").code == reason::kLayerHasOtherConsumers);
    applyRules(*model, {"bias-add"});
    CHECK(opSequence(model->graph()) == "Conv,Add,Relu");
  }
  SECTION("the Conv output is a graph output") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y, float[1,2,4,4] conv)
<)" + floats("w", {2, 3, 1, 1}, 17.0) + R"(, float[2,1,1] k = {1, 2}>
{
  conv = Conv (x, w)
  y = Add (conv, k)
}
)");
    CHECK(refusal(*model, "bias-add", "Add_0").code == reason::kLayerHasOtherConsumers);
  }
  SECTION("a residual Add of two computed tensors is not a bias") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,2,4,4] x) => (float[1,2,4,4] y)
<)" + floats("w", {2, 2, 1, 1}, 18.0) + R"(>
{
  conv = Conv (x, w)
  y = Add (conv, x)
}
)");
    CHECK(refusal(*model, "bias-add", "Add_0").code == reason::kNoFoldableLayer);
  }
  SECTION("a bias that is a graph input fed at run time") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x, float[2] b) => (float[1,2,4,4] y)
<)" + floats("w", {2, 3, 1, 1}, 19.0) + R"(, float[2,1,1] k = {1, 2}>
{
  conv = Conv (x, w, b)
  y = Add (conv, k)
}
)");
    CHECK(refusal(*model, "bias-add", "Add_0").code == reason::kParamsNotConstant);
  }
}

TEST_CASE("bias-add: a Constant node addend is used and then removed", "[bias-add]") {
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + floats("w", {2, 3, 1, 1}, 20.0) + R"(>
{
  k = Constant <value = float[2,1,1] {2, -2}> ()
  conv = Conv (x, w)
  y = Add (conv, k)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
  checkFoldsInOrt(outcome);
  CHECK(opSequence(model->graph()) == "Conv");
  CHECK(biasOf(findNode(model->graph(), "Conv")) == std::vector<double>{2, -2});
}

TEST_CASE("bias-add: float16 layers get a float16 bias", "[bias-add]") {
  auto model = parseModelAs(R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + floats("w", {2, 3, 3, 3}, 21.0) + R"(, float[2] b = {0.5, 1}, float[1,2,1,1] k = {0.25, -3}>
{
  conv = Conv <pads = [1,1,1,1]> (x, w, b)
  y = Add (conv, k)
}
)",
                            onnx::TensorProto::FLOAT16);
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, 1e-2, 1e-2);
  checkFoldsInOrt(outcome);
  const Node* conv = findNode(model->graph(), "Conv");
  CHECK(conv->input(2)->constantTensor()->dataType() == DataType::Float16);
  CHECK(biasOf(conv) == std::vector<double>{0.75, -2});
}

TEST_CASE("bias-add: --keep and --keep-op leave the Add, the layer and kept Constant nodes alone", "[bias-add]") {
  const std::string text = R"(<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + floats("w", {2, 3, 1, 1}, 22.0) + R"(>
{
  k = Constant <value = float[2,1,1] {2, -2}> ()
  conv = Conv (x, w)
  y = Add (conv, k)
}
)";
  SECTION("keep the Add by name") {
    auto model = parseModel(text);
    RuleOptions options;
    options.keepNodes = {"Add_*"};
    Report report = applyRules(*model, {"bias-add"}, options);
    CHECK(opSequence(model->graph()) == "Constant,Conv,Add");
    CHECK(report.section("bias_absorbed").empty());
  }
  SECTION("keep every Conv") {
    auto model = parseModel(text);
    RuleOptions options;
    options.keepOps = {"Conv"};
    CHECK(refusal(*model, "bias-add", "Add_0", options).code == reason::kKeptByUser);
    applyRules(*model, {"bias-add"}, options);
    CHECK(opSequence(model->graph()) == "Constant,Conv,Add");
  }
  SECTION("keep the Constant the rewrite would remove") {
    auto model = parseModel(text);
    RuleOptions options;
    options.keepOps = {"Constant"};
    CHECK(refusal(*model, "bias-add", "Add_0", options).code == reason::kKeptByUser);
    applyRules(*model, {"bias-add"}, options);
    CHECK(opSequence(model->graph()) == "Constant,Conv,Add");
  }
}

TEST_CASE("bias-add: opsets before 7 are left to their own broadcast attributes", "[bias-add]") {
  auto model = parseModel(R"(<ir_version: 3, opset_import: ["" : 6]>
g (float[1,3,4,4] x, float[2,3,1,1] w, float[2,1,1] k) => (float[1,2,4,4] y)
{
  conv = Conv (x, w)
  y = Add <broadcast = 1> (conv, k)
}
)");
  Report report = applyRules(*model, {"bias-add"});
  CHECK(opSequence(model->graph()) == "Conv,Add");
  CHECK(report.section("bias_absorbed").empty());
}

TEST_CASE("bias-add: subgraphs are rewritten inside, never across their boundary", "[bias-add]") {
  SECTION("Conv and Add both in a branch: the new bias lives in the branch") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (bool cond, float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + floats("w", {2, 3, 1, 1}, 23.0) + R"(, float[1,2,1,1] k = {1, -1}>
{
  y = If (cond) <
    then_branch = then_g () => (float[1,2,4,4] t) { c = Conv (x, w)  t = Add (c, k) },
    else_branch = else_g () => (float[1,2,4,4] e) { e = Conv (x, w) }
  >
}
)");
    FoldOutcome outcome = applyRulesAndCompare(*model, {"bias-add"}, kTol, kTol);
    checkFoldsInOrt(outcome);
    Graph* branch = model->graph().nodeList()[0]->subgraphs()[0].graph.get();
    CHECK(opSequence(*branch) == "Conv");
    const Node* conv = findNode(*branch, "Conv");
    CHECK(conv->input(2)->graph() == branch);
    CHECK(biasOf(conv) == std::vector<double>{1, -1});
  }
  SECTION("an Add in a branch reading a Conv of the enclosing graph stays") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 13]>
g (bool cond, float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + floats("w", {2, 3, 1, 1}, 24.0) + R"(, float[1,2,1,1] k = {1, -1}>
{
  c = Conv (x, w)
  y = If (cond) <
    then_branch = then_g () => (float[1,2,4,4] t) { t = Add (c, k) },
    else_branch = else_g () => (float[1,2,4,4] e) { e = Conv (x, w) }
  >
}
)");
    CHECK(refusal(*model, "bias-add", "Add_0").code == reason::kLayerInOtherGraph);
    applyRules(*model, {"bias-add"});
    CHECK(countOps(*model, "Add") == 1);
  }
}
