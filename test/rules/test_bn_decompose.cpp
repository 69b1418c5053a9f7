// bn-decompose (off by default): an inference BatchNormalization nothing could fold becomes Mul + Add of
// per-channel constants shaped [C, 1, ..., 1] so they broadcast over the channel axis (numpy broadcasting aligns
// from the last axis); at opsets 1 and 6, [C] constants with the legacy attributes broadcast=1, axis=1.
// Constants are checked against values computed here. Opset 7+ cases run in ONNX Runtime; ONNX Runtime has no
// kernels below opset 7, so opset 1/6 results go through onnx::checker, and the opset-6 PyTorch models of
// libonnx-testdata are upgraded to opset 7 here and run on their test data.

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>

#include "bnfold/check/fold.h"
#include "test_bn_fold_support.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;

namespace {

constexpr double kTol = 1e-5;

std::string bnText(const BnParams& p, const std::string& extra = "") {
  char eps[32];
  std::snprintf(eps, sizeof eps, "%.9g", p.epsilon);
  return std::string("BatchNormalization <epsilon = ") + eps + extra + ">";
}

std::vector<double> bnShift(const BnParams& p) {
  const auto k = bnMultiplier(p);
  std::vector<double> t(k.size());
  for (std::size_t c = 0; c < t.size(); ++c) t[c] = p.beta[c] - p.mean[c] * k[c];
  return t;
}

std::string dimsText(const std::vector<int64_t>& dims) {
  std::string text;
  for (std::size_t i = 0; i < dims.size(); ++i) text += (i ? "," : "") + std::to_string(dims[i]);
  return text;
}

void checkFoldsInOrt(const FoldOutcome& outcome) {
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
}

// onnx::checker, and for opset 6 strict shape inference too (the opset-1 Mul and Add have no type inference in
// libonnx).
void checkWithOnnx(Model& model) {
  const onnx::ModelProto proto = modelToProto(model);
  CHECK_NOTHROW(onnx::checker::check_model(proto));
  if (model.opsetVersion("") > 1) {
    onnx::ModelProto inferred = proto;
    CHECK_NOTHROW(onnx::shape_inference::InferShapes(inferred, onnx::OpSchemaRegistry::Instance(),
                                                     onnx::ShapeInferenceOptions(true, 1)));
  }
}

// The legacy broadcast form: exactly broadcast=1 and axis=1 (Mul-1/Add-1's optional consumed_inputs left out).
void checkLegacyBroadcast(const Node& node) {
  CAPTURE(node.opType());
  CHECK(node.attributeInt("broadcast", 0) == 1);
  CHECK(node.attributeInt("axis", -1) == 1);
  CHECK(node.proto().attribute_size() == 2);
}

// "float[2,3] x" style type of a graph input; the BN parameters as graph inputs with defaults, as IR version 3
// wants initializers (the ONNX text initializer block would not list them as inputs).
std::string legacyBnModel(int64_t opset, const std::string& inputType, const std::string& outputType,
                          const std::string& params, const std::string& body) {
  return "<ir_version: 3, opset_import: [\"\" : " + std::to_string(opset) + "]>\ng (" + inputType + " x, " +
         params + ") => (" + outputType + " y)\n{\n" + body + "}\n";
}

std::string legacyBnAttributes(const BnParams& p, int64_t opset, const std::string& extra = "") {
  // BatchNormalization-1 requires consumed_inputs.
  return bnText(p, ", is_test = 1" + std::string(opset == 1 ? ", consumed_inputs = [0, 0, 0, 0, 0]" : "") + extra);
}

std::string paramInputs(const BnParams& p, const std::vector<int64_t>& dims) {
  return tensorText("float", "s", dims, p.gamma) + ", " + tensorText("float", "b", dims, p.beta) + ", " +
         tensorText("float", "m", dims, p.mean) + ", " + tensorText("float", "v", dims, p.var);
}

bool listedAsGraphInput(const onnx::ModelProto& proto, const std::string& name) {
  for (const auto& input : proto.graph().input())
    if (input.name() == name) return true;
  return false;
}

// compare.js --against-testdata: runs `model` in ONNX Runtime on every test_data_set_* of `dataDir` and compares
// with the expected outputs (|expected - actual| <= atol + rtol * |expected|).
struct TestDataComparison {
  int exitCode = -1;
  nlohmann::json result;
  std::string log;
};

TestDataComparison compareWithTestData(const std::string& model, const std::string& dataDir, double atol,
                                       double rtol) {
  TestDataComparison comparison;
  std::ostringstream command;
  command << "node '" << sourceDir() << "/scripts/ort/compare.js' --against-testdata '" << model << "' '" << dataDir
          << "' --json --atol " << atol << " --rtol " << rtol;
  std::string out, err;
  comparison.exitCode = runCommand(command.str(), &out, &err);
  comparison.log = out + err;
  try {
    comparison.result = nlohmann::json::parse(out);
  } catch (const std::exception&) {
    comparison.result = nullptr;
  }
  return comparison;
}


// Upgrades a model of elementwise opset-6 Mul/Add nodes on the graph input to opset 7, for ONNX Runtime (which
// has no opset-6 kernels). ONNX's own converter in libonnx 1.12 cannot do it: its Mul/Add 6 -> 7 adapter pads
// the constant to the input's full rank ([C] -> [C, 1, 1] for a [N, C, L] input) instead of to the rank after
// `axis` ([C, 1]), then rejects its own result. Legacy broadcasting aligns B's dims with the input's from `axis`;
// under numpy broadcasting the same constant needs trailing size-1 dims up to the input's rank.
void upgradeLegacyBroadcastToOpset7(onnx::ModelProto& model) {
  const int rank = model.graph().input(0).type().tensor_type().shape().dim_size();
  for (auto& node : *model.mutable_graph()->mutable_node()) {
    int64_t axis = -1;
    google::protobuf::RepeatedPtrField<onnx::AttributeProto> kept;
    for (const auto& attribute : node.attribute()) {
      if (attribute.name() == "axis") axis = attribute.i();
      else if (attribute.name() != "broadcast") *kept.Add() = attribute;
    }
    REQUIRE(axis >= 0);
    node.mutable_attribute()->Swap(&kept);
    for (auto& initializer : *model.mutable_graph()->mutable_initializer()) {
      if (initializer.name() != node.input(1)) continue;
      while (axis + initializer.dims_size() < rank) initializer.add_dims(1);
      for (auto& input : *model.mutable_graph()->mutable_input()) {
        if (input.name() != initializer.name()) continue;
        auto* shape = input.mutable_type()->mutable_tensor_type()->mutable_shape();
        shape->clear_dim();
        for (int64_t dim : initializer.dims()) shape->add_dim()->set_dim_value(dim);
      }
    }
  }
  for (auto& opset : *model.mutable_opset_import())
    if (opset.domain().empty()) opset.set_version(7);
}
}  // namespace

TEST_CASE("bn-decompose: constants shaped [C,1,...] for every input rank", "[bn-decompose]") {
  struct Case {
    std::vector<int64_t> inputDims;
    std::vector<int64_t> constantDims;
  };
  const std::vector<Case> cases = {
      {{2, 3}, {3}},
      {{2, 3, 5}, {3, 1}},
      {{1, 3, 4, 4}, {3, 1, 1}},
      {{1, 3, 2, 3, 2}, {3, 1, 1, 1}},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION("input [" << dimsText(c.inputDims) << "]") {
      const BnParams p = makeBnParams(3, 1.0 + static_cast<double>(c.inputDims.size()));
      const std::string type = "float[" + dimsText(c.inputDims) + "]";
      auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g ()" + type + " x) => (" + type + R"( y)
<)" + bnInitializers(p) + R"(>
{
  y = )" + bnText(p) + R"( (x, s, b, m, v)
}
)");
      FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-decompose"}, kTol, kTol);
      checkFoldsInOrt(outcome);
      const Graph& graph = model->graph();
      CHECK(opSequence(graph) == "Mul,Add");
      const Node* mul = findNode(graph, "Mul");
      const Node* add = findNode(graph, "Add");
      CHECK(mul->input(0)->name() == "x");
      CHECK(add->input(0) == mul->output(0));
      CHECK(add->output(0)->name() == "y");
      CHECK(add->output(0)->isGraphOutput());
      const Tensor* scale = mul->input(1)->constantTensor();
      const Tensor* shift = add->input(1)->constantTensor();
      REQUIRE(scale);
      REQUIRE(shift);
      CHECK(scale->dims() == c.constantDims);
      CHECK(shift->dims() == c.constantDims);
      checkClose(scale->toDoubles(), bnMultiplier(p), 1e-7);
      checkClose(shift->toDoubles(), bnShift(p), 1e-6);
      // The parameters are gone with the BN.
      CHECK(graph.findLocal("s") == nullptr);
      CHECK(graph.findLocal("v") == nullptr);
      const auto& entries = outcome.report.section("decomposed");
      REQUIRE(entries.size() == 1);
      CHECK(entries[0]["rule"] == "bn-decompose");
      CHECK(entries[0]["bn"] == "BatchNormalization_0");
      CHECK(entries[0]["mul"] == mul->name());
      CHECK(entries[0]["add"] == add->name());
      CHECK(entries[0]["scale_tensor"] == mul->input(1)->name());
      CHECK(entries[0]["shift_tensor"] == add->input(1)->name());
      CHECK(entries[0]["constant_dims"].get<std::vector<int64_t>>() == c.constantDims);
      CHECK(entries[0]["mean"].get<std::vector<double>>() == p.mean);
      CHECK(outcome.report.section("skipped").empty());
    }
  }
}

TEST_CASE("bn-decompose is off by default and runs last among BN rules", "[bn-decompose]") {
  const auto defaults = parseRuleSelection("default");
  CHECK(std::find(defaults.begin(), defaults.end(), "bn-decompose") == defaults.end());
  const auto withDecompose = parseRuleSelection("+bn-decompose");
  REQUIRE(std::find(withDecompose.begin(), withDecompose.end(), "bn-decompose") != withDecompose.end());
  // Every other BN rule comes before it in the priority list.
  std::size_t decomposeAt = 0, lastOtherBnRule = 0;
  for (std::size_t i = 0; i < builtinRules().size(); ++i) {
    const Rule& rule = *builtinRules()[i];
    const auto roots = rule.rootOps();
    if (std::find(roots.begin(), roots.end(), "BatchNormalization") == roots.end()) continue;
    if (std::string(rule.name()) == "bn-decompose") decomposeAt = i;
    else lastOtherBnRule = i;
  }
  CHECK(decomposeAt > lastOtherBnRule);

  const BnParams p = makeBnParams(2, 7.0);
  const std::string text = R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y, float[1,2,4,4] z)
<)" + bnInitializers(p) + ", " + tensorText("float", "w", {2, 3, 1, 1}, asFloats(sampleValues(6, 8.0))) + R"(>
{
  c = Conv (x, w)
  y = )" + bnText(p) + R"( (c, s, b, m, v)
  r = Relu (c)
  z = )" + bnText(p) + R"( (r, s, b, m, v)
}
)";
  SECTION("default rules leave a BN after Relu in place") {
    auto model = parseModel(text);
    Report report = applyRules(*model, parseRuleSelection("default"));
    CHECK(countOps(*model, "BatchNormalization") == 2);
    CHECK(report.section("decomposed").empty());
  }
  SECTION("+bn-decompose: only what could not be folded is decomposed") {
    // The Conv output feeds the Relu as well, so the first BN cannot be folded either: both decompose.
    auto model = parseModel(text);
    FoldOutcome outcome = applyRulesAndCompare(*model, parseRuleSelection("+bn-decompose"), kTol, kTol);
    checkFoldsInOrt(outcome);
    CHECK(countOps(*model, "BatchNormalization") == 0);
    CHECK(outcome.report.section("decomposed").size() == 2);
    CHECK(outcome.report.section("folds").empty());
    CHECK(opSequence(model->graph()) == "Conv,Mul,Add,Relu,Mul,Add");
  }
}

TEST_CASE("bn-decompose: a foldable BN is folded, not decomposed", "[bn-decompose]") {
  const BnParams p = makeBnParams(2, 9.0);
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,3,4,4] x) => (float[1,2,4,4] y)
<)" + bnInitializers(p) + ", " + tensorText("float", "w", {2, 3, 1, 1}, asFloats(sampleValues(6, 10.0))) + R"(>
{
  c = Conv (x, w)
  y = )" + bnText(p) + R"( (c, s, b, m, v)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, parseRuleSelection("+bn-decompose"), kTol, kTol);
  checkFoldsInOrt(outcome);
  CHECK(opSequence(model->graph()) == "Conv");
  CHECK(outcome.report.section("folds").size() == 1);
  CHECK(outcome.report.section("decomposed").empty());
}

TEST_CASE("bn-decompose: spatial=0 parameters keep their per-element shape", "[bn-decompose]") {
  // Opset 7, spatial=0: params [C, H, W] hold one value per element of a sample; as Mul/Add constants of that
  // shape they line up with X's last three axes.
  const BnParams p = makeBnParams(3 * 2 * 2, 11.0);  // one value per element of a [3, 2, 2] sample
  const std::vector<int64_t> dims{3, 2, 2};
  auto model = parseModel(R"(<ir_version: 3, opset_import: ["" : 7]>
g (float[2,3,2,2] x) => (float[2,3,2,2] y)
<)" + tensorText("float", "s", dims, p.gamma) + ", " + tensorText("float", "b", dims, p.beta) + ", " +
                          tensorText("float", "m", dims, p.mean) + ", " + tensorText("float", "v", dims, p.var) + R"(>
{
  y = )" + bnText(p, ", spatial = 0") + R"( (x, s, b, m, v)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-decompose"}, kTol, kTol);
  checkFoldsInOrt(outcome);
  const Node* mul = findNode(model->graph(), "Mul");
  REQUIRE(mul);
  CHECK(mul->input(1)->constantTensor()->dims() == dims);
  checkClose(mul->input(1)->constantTensor()->toDoubles(), bnMultiplier(p), 1e-7);
  checkClose(findNode(model->graph(), "Add")->input(1)->constantTensor()->toDoubles(), bnShift(p), 1e-6);
}

TEST_CASE("bn-decompose: float16 input with float parameters (opset 15 types T and T1)", "[bn-decompose]") {
  const BnParams p = makeBnParams(3, 12.0);
  auto model = parseModelAs(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,3,4,4] x) => (float[1,3,4,4] y)
<)" + bnInitializers(p) + R"(>
{
  y = )" + bnText(p) + R"( (x, s, b, m, v)
}
)",
                            onnx::TensorProto::FLOAT16, {"s", "b", "m", "v"});
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-decompose"}, 1e-2, 1e-2);
  checkFoldsInOrt(outcome);
  const Node* mul = findNode(model->graph(), "Mul");
  REQUIRE(mul);
  // Mul(X, k) needs k of X's type, not of the parameters'.
  CHECK(mul->input(1)->constantTensor()->dataType() == DataType::Float16);
  CHECK(findNode(model->graph(), "Add")->input(1)->constantTensor()->dataType() == DataType::Float16);
  checkClose(mul->input(1)->constantTensor()->toDoubles(), bnMultiplier(p), 1e-3);
}

TEST_CASE("bn-decompose: inside an If branch the constants go into the branch", "[bn-decompose]") {
  const BnParams p = makeBnParams(2, 13.0);
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (bool cond, float[1,2,3] x) => (float[1,2,3] y)
<)" + bnInitializers(p) + R"(>
{
  y = If (cond) <
    then_branch = then_g () => (float[1,2,3] t) { t = )" + bnText(p) + R"( (x, s, b, m, v) },
    else_branch = else_g () => (float[1,2,3] e) { e = Neg (x) }
  >
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"bn-decompose"}, kTol, kTol);
  checkFoldsInOrt(outcome);
  CHECK(countOps(*model, "BatchNormalization") == 0);
  Graph* branch = model->graph().nodeList()[0]->subgraphs()[0].graph.get();
  CHECK(opSequence(*branch) == "Mul,Add");
  const Node* mul = findNode(*branch, "Mul");
  CHECK(mul->input(1)->graph() == branch);
  CHECK(mul->input(1)->constantTensor()->dims() == std::vector<int64_t>{2, 1});
}

TEST_CASE("bn-decompose: refusals", "[bn-decompose]") {
  const BnParams p = makeBnParams(3, 14.0);
  SECTION("the input's rank is not known") {
    // Nothing declares the shape of the Tile's output and shape inference has no rule for Tile, so the Transpose's
    // output shape is not known either, and the BN output is not declared.
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,4,4,3] x) => (float[1,3,4,4] y)
<)" + bnInitializers(p) + R"(, int64[4] reps = {1, 1, 1, 1}>
{
  tiled = Tile (x, reps)
  t = Transpose <perm = [0,3,1,2]> (tiled)
  n = )" + bnText(p) + R"( (t, s, b, m, v)
  y = Relu (n)
}
)");
    Report report = applyRules(*model, {"bn-decompose"});
    CHECK(skipReason(report, "BatchNormalization_0") == "rank-unknown");
    CHECK(countOps(*model, "BatchNormalization") == 1);
  }
  SECTION("training mode") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[2,3,4] x) => (float[2,3,4] y)
<)" + bnInitializers(p) + R"(>
{
  y = BatchNormalization <training_mode = 1> (x, s, b, m, v)
}
)");
    CHECK(skipReason(applyRules(*model, {"bn-decompose"}), "BatchNormalization_0") == "training-mode");
  }
  SECTION("a mean fed at run time") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[2,3,4] x, float[3] m2) => (float[2,3,4] y)
<)" + bnInitializers(p) + R"(>
{
  y = )" + bnText(p) + R"( (x, s, b, m2, v)
}
)");
    CHECK(skipReason(applyRules(*model, {"bn-decompose"}), "BatchNormalization_0") == "params-not-constant");
  }
  SECTION("a negative variance") {
    BnParams bad = p;
    bad.var[1] = -1.0;
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[2,3,4] x) => (float[2,3,4] y)
<)" + bnInitializers(bad) + R"(>
{
  y = )" + bnText(bad) + R"( (x, s, b, m, v)
}
)");
    CHECK(skipReason(applyRules(*model, {"bn-decompose"}), "BatchNormalization_0") == "invalid-variance");
  }
  SECTION("kept by the user") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[2,3,4] x) => (float[2,3,4] y)
<)" + bnInitializers(p) + R"(>
{
  y = )" + bnText(p) + R"( (x, s, b, m, v)
}
)");
    RuleOptions options;
    options.keepNodes = {"Batch*"};
    CHECK(skipReason(applyRules(*model, {"bn-decompose"}, options), "BatchNormalization_0") == "kept-by-user");
    CHECK(opSequence(model->graph()) == "BatchNormalization");
  }
}

TEST_CASE("bn-decompose: opsets 1 and 6 use [C] constants with broadcast=1, axis=1", "[bn-decompose]") {
  // Before opset 7 Mul and Add broadcast only when told; axis=1 aligns [C] with the channel axis of any rank.
  const std::vector<std::vector<int64_t>> shapes{{2, 3}, {2, 3, 5}, {1, 3, 4, 4}, {1, 3, 2, 3, 2}};
  for (int64_t opset : {1, 6}) {
    for (const auto& dims : shapes) {
      CAPTURE(opset, dims);
      const BnParams p = makeBnParams(3, 20.0 + static_cast<double>(opset * 10) + static_cast<double>(dims.size()));
      const std::string type = "float[" + dimsText(dims) + "]";
      auto model = parseModel(legacyBnModel(opset, type, type, paramInputs(p, {3}),
                                            "  y = " + legacyBnAttributes(p, opset) + " (x, s, b, m, v)\n"));
      checkWithOnnx(*model);
      Report report = applyRules(*model, {"bn-decompose"});
      const Graph& graph = model->graph();
      CHECK(opSequence(graph) == "Mul,Add");
      CHECK(countOps(*model, "BatchNormalization") == 0);
      const Node* mul = findNode(graph, "Mul");
      const Node* add = findNode(graph, "Add");
      REQUIRE(mul);
      REQUIRE(add);
      CHECK(mul->input(0)->name() == "x");
      CHECK(add->input(0) == mul->output(0));
      CHECK(add->output(0)->name() == "y");
      CHECK(add->output(0)->isGraphOutput());
      checkLegacyBroadcast(*mul);
      checkLegacyBroadcast(*add);
      const Tensor* scale = mul->input(1)->constantTensor();
      const Tensor* shift = add->input(1)->constantTensor();
      REQUIRE(scale);
      REQUIRE(shift);
      CHECK(scale->dims() == std::vector<int64_t>{3});
      CHECK(shift->dims() == std::vector<int64_t>{3});
      CHECK(scale->dataType() == DataType::Float);
      checkClose(scale->toDoubles(), bnMultiplier(p), 1e-7);
      checkClose(shift->toDoubles(), bnShift(p), 1e-6);
      const auto& entries = report.section("decomposed");
      REQUIRE(entries.size() == 1);
      CHECK(entries[0]["bn_form"] == "opset-" + std::to_string(opset) + " (is_test)");
      CHECK(entries[0]["constant_dims"].get<std::vector<int64_t>>() == std::vector<int64_t>{3});
      CHECK(entries[0]["broadcast_axis"] == 1);
      CHECK(report.section("skipped").empty());
      // IR version 3: the new constants are listed as graph inputs too, so the result passes the checker.
      const onnx::ModelProto proto = modelToProto(*model);
      CHECK(listedAsGraphInput(proto, scale->name()));
      CHECK(listedAsGraphInput(proto, shift->name()));
      checkWithOnnx(*model);
    }
  }
}

TEST_CASE("bn-decompose: opset 6 needs no known rank", "[bn-decompose]") {
  // Nothing declares or infers the Transpose output's shape and the BN output is not declared: at opset 7+ this
  // is rank-unknown, at opset 6 axis=1 does the alignment.
  const BnParams p = makeBnParams(3, 31.0);
  auto model = parseModel(legacyBnModel(6, "float[1,4,4,3]", "float[1,3,4,4]", paramInputs(p, {3}),
                                        "  t = Transpose <perm = [0,3,1,2]> (x)\n"
                                        "  n = " + legacyBnAttributes(p, 6) + " (t, s, b, m, v)\n"
                                        "  y = Relu (n)\n"));
  Report report = applyRules(*model, {"bn-decompose"});
  CHECK(opSequence(model->graph()) == "Transpose,Mul,Add,Relu");
  CHECK(report.section("skipped").empty());
  const Node* mul = findNode(model->graph(), "Mul");
  REQUIRE(mul);
  checkLegacyBroadcast(*mul);
  checkLegacyBroadcast(*findNode(model->graph(), "Add"));
  CHECK(mul->input(1)->constantTensor()->dims() == std::vector<int64_t>{3});
  checkClose(mul->input(1)->constantTensor()->toDoubles(), bnMultiplier(p), 1e-7);
  checkWithOnnx(*model);
}

TEST_CASE("bn-decompose: opsets 1 and 6 with spatial=0 keep [C, D1, ...] constants at axis 1", "[bn-decompose]") {
  const BnParams p = makeBnParams(3 * 2 * 2, 32.0);  // one value per element of a [3, 2, 2] sample
  const std::vector<int64_t> dims{3, 2, 2};
  for (int64_t opset : {1, 6}) {
    for (const std::string inputType : {"float[2,3,2,2]", "float[N,3,2,2]"}) {
      CAPTURE(opset, inputType);
      auto model = parseModel(legacyBnModel(opset, inputType, inputType, paramInputs(p, dims),
                                            "  y = " + legacyBnAttributes(p, opset, ", spatial = 0") +
                                                " (x, s, b, m, v)\n"));
      Report report = applyRules(*model, {"bn-decompose"});
      CHECK(opSequence(model->graph()) == "Mul,Add");
      const Node* mul = findNode(model->graph(), "Mul");
      const Node* add = findNode(model->graph(), "Add");
      REQUIRE(mul);
      REQUIRE(add);
      checkLegacyBroadcast(*mul);
      checkLegacyBroadcast(*add);
      CHECK(mul->input(1)->constantTensor()->dims() == dims);
      CHECK(add->input(1)->constantTensor()->dims() == dims);
      // One value per element of a sample.
      checkClose(mul->input(1)->constantTensor()->toDoubles(), bnMultiplier(p), 1e-7);
      checkClose(add->input(1)->constantTensor()->toDoubles(), bnShift(p), 1e-6);
      CHECK(report.section("decomposed").at(0)["constant_dims"].get<std::vector<int64_t>>() == dims);
      checkWithOnnx(*model);
    }
  }
}

TEST_CASE("bn-decompose: opset 6 refusals", "[bn-decompose]") {
  const BnParams p = makeBnParams(3, 33.0);
  auto skipped = [](const std::string& text) {
    auto model = parseModel(text);
    Report report = applyRules(*model, {"bn-decompose"});
    CHECK(countOps(*model, "BatchNormalization") == 1);
    CHECK(report.section("decomposed").empty());
    return skipReason(report, "BatchNormalization_0");
  };
  SECTION("is_test=0 is training mode") {
    CHECK(skipped(legacyBnModel(6, "float[2,3,4]", "float[2,3,4]", paramInputs(p, {3}),
                                "  y = " + bnText(p, ", is_test = 0") + " (x, s, b, m, v)\n")) == "training-mode");
  }
  SECTION("is_test left out is training mode (its default is 0)") {
    CHECK(skipped(legacyBnModel(6, "float[2,3,4]", "float[2,3,4]", paramInputs(p, {3}),
                                "  y = " + bnText(p) + " (x, s, b, m, v)\n")) == "training-mode");
  }
  SECTION("spatial=0 params with size-1 dims: legacy broadcasting cannot expand them") {
    CHECK(skipped(legacyBnModel(6, "float[2,3,2,2]", "float[2,3,2,2]", paramInputs(p, {3, 1, 1}),
                                "  y = " + legacyBnAttributes(p, 6, ", spatial = 0") + " (x, s, b, m, v)\n")) ==
          "param-shape-mismatch");
  }
  SECTION("an input of rank 1 has no channel axis") {
    CHECK(skipped(legacyBnModel(6, "float[3]", "float[3]", paramInputs(p, {3}),
                                "  y = " + legacyBnAttributes(p, 6) + " (x, s, b, m, v)\n")) == "rank-unknown");
  }
  SECTION("a mean fed at run time (IR version 3: an input without an initializer)") {
    const std::string params = tensorText("float", "s", {3}, p.gamma) + ", " +
                               tensorText("float", "b", {3}, p.beta) + ", float[3] m, " +
                               tensorText("float", "v", {3}, p.var);
    CHECK(skipped(legacyBnModel(6, "float[2,3,4]", "float[2,3,4]", params,
                                "  y = " + legacyBnAttributes(p, 6) + " (x, s, b, m, v)\n")) == "params-not-constant");
  }
}

TEST_CASE("bn-decompose: PyTorch's opset-6 BatchNorm models match their test data", "[bn-decompose][ort]") {
  // Each model is one opset-6 BatchNormalization (is_test=1) from the graph input to the graph output, so there
  // is no layer to fold into. ONNX Runtime has no opset-6 kernels: the rewritten model is upgraded to opset 7
  // (upgradeLegacyBroadcastToOpset7) and its outputs on input_0.pb are compared with output_0.pb (computed by
  // PyTorch).
  constexpr double kAtol = 1e-5, kRtol = 1e-4;
  const std::string suite = "/usr/share/libonnx-testdata/data/pytorch-converted/";
  for (const std::string name : {"test_BatchNorm1d_3d_input_eval", "test_BatchNorm2d_eval",
                                 "test_BatchNorm2d_momentum_eval", "test_BatchNorm3d_eval",
                                 "test_BatchNorm3d_momentum_eval"}) {
    CAPTURE(name);
    const std::string dir = suite + name;
    REQUIRE(std::filesystem::exists(dir + "/model.onnx"));
    auto model = loadModel(dir + "/model.onnx");
    REQUIRE(model->opsetVersion("") == 6);
    REQUIRE(opSequence(model->graph()) == "BatchNormalization");

    // Reference constants from the model's own parameters (inputs 1..4 are IR-3 initializers).
    const Node* bn = findNode(model->graph(), "BatchNormalization");
    BnParams p;
    p.gamma = bn->input(1)->initializer()->toDoubles();
    p.beta = bn->input(2)->initializer()->toDoubles();
    p.mean = bn->input(3)->initializer()->toDoubles();
    p.var = bn->input(4)->initializer()->toDoubles();
    p.epsilon = static_cast<double>(bn->attributeFloat("epsilon", 1e-5f));
    const std::string x = bn->input(0)->name(), y = bn->output(0)->name();

    Report report = applyRules(*model, {"bn-decompose"});
    CHECK(countOps(*model, "BatchNormalization") == 0);
    CHECK(opSequence(model->graph()) == "Mul,Add");
    CHECK(report.section("decomposed").size() == 1);
    CHECK(report.section("skipped").empty());
    const Node* mul = findNode(model->graph(), "Mul");
    const Node* add = findNode(model->graph(), "Add");
    REQUIRE(mul);
    REQUIRE(add);
    CHECK(mul->input(0)->name() == x);
    CHECK(add->output(0)->name() == y);
    checkLegacyBroadcast(*mul);
    checkLegacyBroadcast(*add);
    CHECK(mul->input(1)->constantTensor()->dims() == std::vector<int64_t>{static_cast<int64_t>(p.channels())});
    checkClose(mul->input(1)->constantTensor()->toDoubles(), bnMultiplier(p), 1e-6);
    checkClose(add->input(1)->constantTensor()->toDoubles(), bnShift(p), 1e-6);
    checkWithOnnx(*model);

    TempDir temp;
    saveModel(*model, temp.file("rewritten.onnx"));
    // The file as written passes the checker too, and still has no BatchNormalization.
    onnx::ModelProto written;
    {
      std::ifstream in(temp.file("rewritten.onnx"), std::ios::binary);
      REQUIRE(written.ParseFromIstream(&in));
    }
    CHECK_NOTHROW(onnx::checker::check_model(written));
    for (const auto& node : written.graph().node()) CHECK(node.op_type() != "BatchNormalization");

    onnx::ModelProto upgraded = written;
    upgradeLegacyBroadcastToOpset7(upgraded);
    CHECK_NOTHROW(onnx::checker::check_model(upgraded));
    for (const auto& node : upgraded.graph().node()) {
      CHECK(node.op_type() != "BatchNormalization");
      CHECK(node.attribute_size() == 0);
    }
    {
      std::ofstream out(temp.file("upgraded.onnx"), std::ios::binary);
      REQUIRE(upgraded.SerializeToOstream(&out));
    }
    const TestDataComparison comparison = compareWithTestData(temp.file("upgraded.onnx"), dir, kAtol, kRtol);
    INFO(comparison.log);
    CHECK(comparison.exitCode == 0);
    REQUIRE(comparison.result.is_object());
    CHECK(comparison.result["ok"] == true);
    REQUIRE(comparison.result["outputs"].size() == 1);
    const auto& output = comparison.result["outputs"][0];
    INFO("max_abs " << output["max_abs"] << ", max_rel " << output["max_rel"]);
    CHECK(output["ok"] == true);
  }
}
