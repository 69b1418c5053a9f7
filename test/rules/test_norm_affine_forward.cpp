// norm-affine-forward: a LayerNormalization's or RMSNormalization's scale g and bias b move into the MatMul/Gemm
// layers that read its output (W'[d, :] = g[d] * W[d, :], bias += b . W), and the norm keeps scale 1 and no bias.
// Expected weights and biases are computed here by plain loops; every rewrite is also run in ONNX Runtime and
// checked by --verify.

#include <catch2/catch.hpp>

#include "bnfold/check/fold.h"
#include "bnfold/rules/builtin_rules.h"
#include "test_bn_fold_support.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;

namespace {

constexpr double kTol = 1e-5;

std::vector<double> seeded(const std::vector<int64_t>& dims, double seed, double lo = -1.0, double hi = 1.0) {
  return asFloats(sampleValues(product(dims, 0), seed, lo, hi));
}

std::string floats(const std::string& name, const std::vector<int64_t>& dims, const std::vector<double>& values) {
  return tensorText("float", name, dims, values);
}

std::vector<double> valuesOf(const Value* value) {
  REQUIRE(value);
  REQUIRE(value->constantTensor());
  return value->constantTensor()->toDoubles();
}

/// W [K, N] (or [N, K] when transposed) with row d (input feature) scaled by g[d].
std::vector<double> scaledRows(const std::vector<double>& w, const std::vector<double>& g, int64_t k, int64_t n,
                               bool transposed = false) {
  std::vector<double> out(w.size());
  for (int64_t d = 0; d < k; ++d)
    for (int64_t j = 0; j < n; ++j) {
      const auto i = static_cast<std::size_t>(transposed ? j * k + d : d * n + j);
      out[i] = w[i] * g[static_cast<std::size_t>(d)];
    }
  return out;
}

/// b . W per output column, plus `bias` (times `beta`) when given.
std::vector<double> shiftThrough(const std::vector<double>& w, const std::vector<double>& b, int64_t k, int64_t n,
                                 bool transposed = false, double alpha = 1.0, const std::vector<double>& bias = {},
                                 double beta = 1.0) {
  std::vector<double> out(static_cast<std::size_t>(n), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    double sum = 0.0;
    for (int64_t d = 0; d < k; ++d)
      sum += b[static_cast<std::size_t>(d)] * w[static_cast<std::size_t>(transposed ? j * k + d : d * n + j)];
    out[static_cast<std::size_t>(j)] = alpha * sum + (bias.empty() ? 0.0 : beta * bias[static_cast<std::size_t>(j)]);
  }
  return out;
}

void checkInOrt(const FoldOutcome& outcome, double limit = 1e-4) {
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  CHECK(outcome.comparison.maxAbs < limit);
}

const nlohmann::json& forwarded(const Report& report) { return report.section("norm_affine_forwarded"); }

/// The reason of the one norm_affine_not_forwarded entry for `norm`.
std::string reasonLeft(const Report& report, const std::string& norm) {
  for (const auto& entry : report.section("norm_affine_not_forwarded"))
    if (entry["node"] == norm) return entry["reason"].get<std::string>();
  FAIL("no norm_affine_not_forwarded entry for " << norm << ": "
                                                  << report.section("norm_affine_not_forwarded").dump());
  return "";
}

/// The norm reads scale 1 and no bias.
void checkUnitNorm(const Node* norm) {
  REQUIRE(norm);
  for (double v : valuesOf(norm->input(1))) CHECK(v == 1.0);
  CHECK((norm->inputs().size() < 3 || norm->input(2) == nullptr));
}

/// A model left alone by the rule keeps its text's ops and has the reason for the norm computing `normOutput`.
void expectLeftAlone(const std::string& text, const std::string& normOutput, const std::string& reason) {
  auto model = parseModel(text);
  const std::string before = opSequence(model->graph());
  Report report = applyRules(*model, {"norm-affine-forward"});
  CHECK(forwarded(report).empty());
  CHECK(reasonLeft(report, model->graph().findLocal(normOutput)->producer()->name()) == reason);
  CHECK(opSequence(model->graph()) == before);
}

}  // namespace

TEST_CASE("norm-affine-forward: LayerNorm into the Q, K and V MatMuls of a [B, T, D] input", "[norm-affine]") {
  const std::vector<double> g = seeded({4}, 1.0, 0.5, 2.0), b = seeded({4}, 2.0);
  const std::vector<double> wq = seeded({4, 4}, 3.0), wk = seeded({4, 4}, 4.0), wv = seeded({4, 6}, 5.0);
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,4] x) => (float[2,3,4] q, float[2,3,4] k, float[2,3,6] v)
<)" + floats("gamma", {4}, g) + ", " + floats("beta", {4}, b) + ", " + floats("wq", {4, 4}, wq) + ", " +
                          floats("wk", {4, 4}, wk) + ", " + floats("wv", {4, 6}, wv) + R"(>
{
  n = LayerNormalization <epsilon = 0.001> (x, gamma, beta)
  q = MatMul (n, wq)
  k = MatMul (n, wk)
  v = MatMul (n, wv)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"norm-affine-forward"}, kTol, kTol);
  checkInOrt(outcome);
  const Graph& graph = model->graph();
  CHECK(opSequence(graph) == "LayerNormalization,MatMul,Add,MatMul,Add,MatMul,Add");
  checkUnitNorm(findNode(graph, "LayerNormalization"));
  struct Expect {
    const char* output;
    const std::vector<double>* w;
    int64_t n;
  };
  for (const Expect& e : {Expect{"q", &wq, 4}, Expect{"k", &wk, 4}, Expect{"v", &wv, 6}}) {
    INFO(e.output);
    const Value* out = graph.findLocal(e.output);
    REQUIRE(out);
    const Node* add = out->producer();
    REQUIRE(add->isOnnxOp("Add"));
    const Node* matMul = add->input(0)->producer();
    REQUIRE(matMul->isOnnxOp("MatMul"));
    CHECK(matMul->input(0)->producer()->isOnnxOp("LayerNormalization"));
    checkClose(valuesOf(matMul->input(1)), asFloats(scaledRows(*e.w, g, 4, e.n)), 1e-6);
    checkClose(valuesOf(add->input(1)), asFloats(shiftThrough(*e.w, b, 4, e.n)), 1e-6);
  }
  const auto& entries = forwarded(outcome.report);
  REQUIRE(entries.size() == 1);
  const auto& entry = entries[0];
  CHECK(entry["op"] == "LayerNormalization");
  CHECK(entry["scale"] == "gamma");
  CHECK(entry["bias"] == "beta");
  CHECK(entry["features"] == 4);
  REQUIRE(entry["layers"].size() == 3);
  for (const auto& layer : entry["layers"]) {
    CHECK(layer["op"] == "MatMul");
    CHECK(layer["bias_form"] == "add");
    CHECK(layer["bias_before"].is_null());
    CHECK(layer["weight_after"] != layer["weight_before"]);
    CHECK(layer.contains("bias_add"));
  }
  CHECK(entry["verify"]["passed"] == true);
}

TEST_CASE("norm-affine-forward: a 2-D MatMul head becomes a Gemm with the bias", "[norm-affine]") {
  const std::vector<double> g = seeded({5}, 11.0, -2.0, 2.0), b = seeded({5}, 12.0), w = seeded({5, 3}, 13.0);
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[4,5] x) => (float[4,3] y)
<)" + floats("gamma", {5}, g) + ", " + floats("beta", {5}, b) + ", " + floats("w", {5, 3}, w) + R"(>
{
  n = LayerNormalization (x, gamma, beta)
  y = MatMul (n, w)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"norm-affine-forward"}, kTol, kTol);
  checkInOrt(outcome);
  CHECK(opSequence(model->graph()) == "LayerNormalization,Gemm");
  const Node* gemm = findNode(model->graph(), "Gemm");
  CHECK(gemm->output(0)->name() == "y");
  checkClose(valuesOf(gemm->input(1)), asFloats(scaledRows(w, g, 5, 3)), 1e-6);
  checkClose(valuesOf(gemm->input(2)), asFloats(shiftThrough(w, b, 5, 3)), 1e-6);
  const auto& layer = forwarded(outcome.report)[0]["layers"][0];
  CHECK(layer["bias_form"] == "gemm");
  CHECK(layer["replaced_by"] == gemm->name());
}

TEST_CASE("norm-affine-forward: Gemm with transB, alpha, beta and a bias", "[norm-affine]") {
  const std::vector<double> g = seeded({6}, 21.0, 0.2, 1.5), b = seeded({6}, 22.0);
  const std::vector<double> w = seeded({3, 6}, 23.0), c = seeded({3}, 24.0);
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2,6] x) => (float[2,3] y)
<)" + floats("gamma", {6}, g) + ", " + floats("beta", {6}, b) + ", " + floats("w", {3, 6}, w) + ", " +
                          floats("c", {3}, c) + R"(>
{
  n = LayerNormalization (x, gamma, beta)
  y = Gemm <transB = 1, alpha = 0.5, beta = 2.0> (n, w, c)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"norm-affine-forward"}, kTol, kTol);
  checkInOrt(outcome);
  CHECK(opSequence(model->graph()) == "LayerNormalization,Gemm");
  const Node* gemm = findNode(model->graph(), "Gemm");
  checkClose(valuesOf(gemm->input(1)), asFloats(scaledRows(w, g, 6, 3, true)), 1e-6);
  checkClose(valuesOf(gemm->input(2)), asFloats(shiftThrough(w, b, 6, 3, true, 0.5, c, 2.0)), 1e-6);
  CHECK(gemm->attributeFloat("beta", 1.0f) == 1.0f);
  CHECK(gemm->attributeFloat("alpha", 1.0f) == 0.5f);
  checkUnitNorm(findNode(model->graph(), "LayerNormalization"));
  CHECK(forwarded(outcome.report)[0]["layers"][0]["bias_form"] == "bias");
}

TEST_CASE("norm-affine-forward: RMSNormalization into a MatMul (opset 23)", "[norm-affine]") {
  const std::vector<double> g = seeded({4}, 31.0, -1.5, 1.5), w = seeded({4, 5}, 32.0);
  auto model = parseModel(R"(<ir_version: 11, opset_import: ["" : 23]>
g (float[2,3,4] x) => (float[2,3,5] y)
<)" + floats("gamma", {4}, g) + ", " + floats("w", {4, 5}, w) + R"(>
{
  n = RMSNormalization <epsilon = 0.0001> (x, gamma)
  y = MatMul (n, w)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"norm-affine-forward"}, kTol, kTol);
  checkInOrt(outcome);
  CHECK(opSequence(model->graph()) == "RMSNormalization,MatMul");
  checkUnitNorm(findNode(model->graph(), "RMSNormalization"));
  checkClose(valuesOf(findNode(model->graph(), "MatMul")->input(1)), asFloats(scaledRows(w, g, 4, 5)), 1e-6);
  const auto& entry = forwarded(outcome.report)[0];
  CHECK(entry["op"] == "RMSNormalization");
  CHECK(entry["bias"].is_null());
  CHECK(entry["layers"][0]["bias_form"] == "none");
}

TEST_CASE("norm-affine-forward: LayerNorm without a bias only scales the weights", "[norm-affine]") {
  const std::vector<double> g = seeded({4}, 41.0, 0.5, 3.0), w = seeded({4, 2}, 42.0);
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[3,4] x) => (float[3,2] y)
<)" + floats("gamma", {4}, g) + ", " + floats("w", {4, 2}, w) + R"(>
{
  n = LayerNormalization (x, gamma)
  y = MatMul (n, w)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"norm-affine-forward"}, kTol, kTol);
  checkInOrt(outcome);
  CHECK(opSequence(model->graph()) == "LayerNormalization,MatMul");
  checkClose(valuesOf(findNode(model->graph(), "MatMul")->input(1)), asFloats(scaledRows(w, g, 4, 2)), 1e-6);
  // A second run finds scale 1 and no bias: nothing more to do, and nothing to report.
  Report again = applyRules(*model, {"norm-affine-forward"});
  CHECK(forwarded(again).empty());
  CHECK(again.section("norm_affine_not_forwarded").empty());
}

TEST_CASE("norm-affine-forward: float16 weights and scale", "[norm-affine]") {
  auto model = parseModelAs(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,8] x) => (float[2,3,4] y)
<)" + floats("gamma", {8}, seeded({8}, 51.0, 0.5, 1.5)) + ", " + floats("beta", {8}, seeded({8}, 52.0)) + ", " +
                                floats("w", {8, 4}, seeded({8, 4}, 53.0)) + R"(>
{
  n = LayerNormalization (x, gamma, beta)
  y = MatMul (n, w)
}
)",
                            onnx::TensorProto::FLOAT16);
  FoldOutcome outcome = applyRulesAndCompare(*model, {"norm-affine-forward"}, 2e-2, 2e-2);
  checkInOrt(outcome, 5e-2);
  CHECK(opSequence(model->graph()) == "LayerNormalization,MatMul,Add");
  const Node* add = findNode(model->graph(), "Add");
  CHECK(add->input(1)->constantTensor()->dataType() == DataType::Float16);
  CHECK(add->input(0)->producer()->input(1)->constantTensor()->dataType() == DataType::Float16);
  CHECK(findNode(model->graph(), "LayerNormalization")->input(1)->constantTensor()->dataType() == DataType::Float16);
}

TEST_CASE("norm-affine-forward: a weight shared with another layer is copied", "[norm-affine]") {
  const std::vector<double> g = seeded({4}, 61.0, 0.5, 2.0), b = seeded({4}, 62.0), w = seeded({4, 4}, 63.0);
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4] x, float[2,4] other) => (float[2,4] y, float[2,4] z)
<)" + floats("gamma", {4}, g) + ", " + floats("beta", {4}, b) + ", " + floats("w", {4, 4}, w) + R"(>
{
  n = LayerNormalization (x, gamma, beta)
  y = MatMul (n, w)
  z = MatMul (other, w)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"norm-affine-forward"}, kTol, kTol);
  checkInOrt(outcome);
  const Node* other = model->graph().findLocal("z")->producer();
  CHECK(other->input(1)->name() == "w");
  CHECK(valuesOf(other->input(1)) == w);
  const Node* gemm = model->graph().findLocal("y")->producer();
  REQUIRE(gemm->isOnnxOp("Gemm"));
  CHECK(gemm->input(1)->name() != "w");
  checkClose(valuesOf(gemm->input(1)), asFloats(scaledRows(w, g, 4, 4)), 1e-6);
}

TEST_CASE("norm-affine-forward: a scale shared with another norm is left to that norm", "[norm-affine]") {
  const std::vector<double> g = seeded({4}, 71.0, 0.5, 2.0), w = seeded({4, 3}, 72.0);
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4] x, float[2,4] r) => (float[2,3] y, float[2,4] z)
<)" + floats("gamma", {4}, g) + ", " + floats("w", {4, 3}, w) + R"(>
{
  n = LayerNormalization (x, gamma)
  y = MatMul (n, w)
  m = LayerNormalization (r, gamma)
  z = Add (m, r)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"norm-affine-forward"}, kTol, kTol);
  checkInOrt(outcome);
  REQUIRE(forwarded(outcome.report).size() == 1);
  const Node* second = model->graph().findLocal("m")->producer();
  CHECK(second->input(1)->name() == "gamma");
  CHECK(valuesOf(second->input(1)) == g);
  CHECK(reasonLeft(outcome.report, second->name()) == "residual-add");
  checkUnitNorm(model->graph().findLocal("n")->producer());
}

TEST_CASE("norm-affine-forward: norms it leaves alone, with reasons", "[norm-affine]") {
  struct Case {
    const char* name;
    std::string signature;  // the graph's inputs and outputs
    std::string nodes;      // n is the norm
    const char* reason;
  };
  const std::vector<Case> cases = {
      {"a residual Add reads the norm's output", "(float[2,4] x) => (float[2,4] y, float[2,4] z)",
       "n = LayerNormalization (x, gamma, beta)\n y = MatMul (n, w)\n z = Add (n, x)", "residual-add"},
      {"a MatMul reads it as its second input, contracting another axis", "(float[2,4] x) => (float[3,4] y)",
       "n = LayerNormalization (x, gamma, beta)\n at = Transpose (a)\n y = MatMul (at, n)",
       "reader-contracts-other-axis"},
      {"a Gemm with transA=1 contracts the first axis", "(float[4,4] x) => (float[4,4] y)",
       "n = LayerNormalization (x, gamma, beta)\n y = Gemm <transA = 1> (n, w)", "reader-contracts-other-axis"},
      {"a LayerNorm over the last two axes with a scale that varies along both", "(float[2,3,4] x) => (float[2,3,4] y)",
       "n = LayerNormalization <axis = -2> (x, g2)\n y = MatMul (n, w)", "affine-varies-off-axis"},
      {"a Conv reads the norm's output", "(float[1,4,3] x) => (float[1,2,1] y)",
       "n = LayerNormalization (x, g3)\n y = Conv (n, cw)", "reader-not-layer"},
      {"the norm's output is a graph output", "(float[2,4] x) => (float[2,4] y, float[2,4] n)",
       "n = LayerNormalization (x, gamma, beta)\n y = MatMul (n, w)", "reader-not-layer"},
      {"a scale computed at run time", "(float[2,4] x, float[4] s) => (float[2,4] y)",
       "n = LayerNormalization (x, s, beta)\n y = MatMul (n, w)", "params-not-constant"},
  };
  const std::string inits = "<" + floats("gamma", {4}, seeded({4}, 81.0, 0.5, 2.0)) + ", " +
                            floats("beta", {4}, seeded({4}, 82.0)) + ", " + floats("w", {4, 4}, seeded({4, 4}, 83.0)) +
                            ", " + floats("a", {2, 3}, seeded({2, 3}, 84.0)) + ", " +
                            floats("g2", {3, 4}, seeded({3, 4}, 85.0, 0.5, 2.0)) + ", " +
                            floats("g3", {3}, seeded({3}, 86.0, 0.5, 2.0)) + ", " +
                            floats("cw", {2, 4, 3}, seeded({2, 4, 3}, 87.0)) + ">";
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      expectLeftAlone("<ir_version: 8, opset_import: [\"\" : 17]>\ng " + c.signature + "\n" + inits + "\n{\n " +
                          c.nodes + "\n}\n",
                      "n", c.reason);
    }
  }
}

TEST_CASE("norm-affine-forward: a LayerNorm over two axes with a scale along the last one folds", "[norm-affine]") {
  const std::vector<double> g = seeded({1, 4}, 91.0, 0.5, 2.0), b = seeded({1, 4}, 92.0), w = seeded({4, 4}, 93.0);
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,4] x) => (float[2,3,4] y)
<)" + floats("gamma", {1, 4}, g) + ", " + floats("beta", {1, 4}, b) + ", " + floats("w", {4, 4}, w) + R"(>
{
  n = LayerNormalization <axis = -2> (x, gamma, beta)
  y = MatMul (n, w)
}
)");
  FoldOutcome outcome = applyRulesAndCompare(*model, {"norm-affine-forward"}, kTol, kTol);
  checkInOrt(outcome);
  REQUIRE(forwarded(outcome.report).size() == 1);
  checkUnitNorm(findNode(model->graph(), "LayerNormalization"));
  CHECK(valuesOf(findNode(model->graph(), "LayerNormalization")->input(1)).size() == 4);
}

TEST_CASE("norm-affine-forward: a pre-norm transformer block folds end to end", "[norm-affine]") {
  const int64_t d = 8, hidden = 16;
  std::string inits;
  auto add = [&](const std::string& name, const std::vector<int64_t>& dims, double seed, double lo = -1.0,
                 double hi = 1.0) { inits += (inits.empty() ? "" : ", ") + floats(name, dims, seeded(dims, seed, lo, hi)); };
  add("ln1_g", {d}, 101.0, 0.5, 1.5);
  add("ln1_b", {d}, 102.0);
  add("wq", {d, d}, 103.0);
  add("bq", {d}, 104.0);
  add("wk", {d, d}, 105.0);
  add("bk", {d}, 106.0);
  add("wv", {d, d}, 107.0);
  add("bv", {d}, 108.0);
  add("wo", {d, d}, 109.0);
  add("bo", {d}, 110.0);
  add("ln2_g", {d}, 111.0, 0.5, 1.5);
  add("ln2_b", {d}, 112.0);
  add("w1", {d, hidden}, 113.0);
  add("b1", {hidden}, 114.0);
  add("w2", {hidden, d}, 115.0);
  add("b2", {d}, 116.0);
  inits += ", float scale = {0.35355339}";
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 17]>
block (float[2,5,8] x) => (float[2,5,8] out)
<)" + inits + R"(>
{
  h1 = LayerNormalization <epsilon = 0.00001> (x, ln1_g, ln1_b)
  q0 = MatMul (h1, wq)
  q = Add (q0, bq)
  k0 = MatMul (h1, wk)
  k = Add (k0, bk)
  v0 = MatMul (h1, wv)
  v = Add (v0, bv)
  kt = Transpose <perm = [0, 2, 1]> (k)
  s0 = MatMul (q, kt)
  s = Mul (s0, scale)
  p = Softmax <axis = -1> (s)
  a = MatMul (p, v)
  o0 = MatMul (a, wo)
  o = Add (o0, bo)
  r1 = Add (x, o)
  h2 = LayerNormalization <epsilon = 0.00001> (r1, ln2_g, ln2_b)
  f0 = MatMul (h2, w1)
  f1 = Add (f0, b1)
  f2 = Relu (f1)
  f3 = MatMul (f2, w2)
  f4 = Add (f3, b2)
  out = Add (r1, f4)
}
)");
  // The default rules: norm-affine-forward is on by default.
  FoldOutcome outcome = applyRulesAndCompare(*model, parseRuleSelection("default"), 1e-4, 1e-4);
  checkInOrt(outcome);
  const auto& entries = forwarded(outcome.report);
  REQUIRE(entries.size() == 2);
  CHECK(entries[0]["layers"].size() + entries[1]["layers"].size() == 4);
  for (const auto& entry : entries) CHECK(entry["verify"]["passed"] == true);
  for (const auto& node : model->graph().nodes())
    if (node->isOnnxOp("LayerNormalization")) checkUnitNorm(node.get());
}

TEST_CASE("norm-affine-forward: fold --verify through the CLI writes a report the schema accepts", "[norm-affine]") {
  TempDir dir;
  const onnx::ModelProto proto = parseModelProto(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,4] x) => (float[2,3,4] y, float[2,3,4] z)
<)" + floats("gamma", {4}, seeded({4}, 121.0, 0.5, 2.0)) + ", " + floats("beta", {4}, seeded({4}, 122.0)) + ", " +
                                                   floats("w", {4, 4}, seeded({4, 4}, 123.0)) + R"(>
{
  n = LayerNormalization (x, gamma, beta)
  y = MatMul (n, w)
  m = LayerNormalization (y, gamma, beta)
  z = Add (m, y)
}
)");
  writeFile(dir.file("in.onnx"), proto.SerializeAsString());
  std::string out, err;
  const std::string fold = cli("fold '" + dir.file("in.onnx") + "' -o '" + dir.file("out.onnx") + "' --report '" +
                               dir.file("report.json") + "' --verify -q");
  REQUIRE(runCommand(fold, &out, &err) == 0);
  const nlohmann::json report = nlohmann::json::parse(readFile(dir.file("report.json")));
  REQUIRE(report["norm_affine_forwarded"].size() == 1);
  CHECK(report["norm_affine_forwarded"][0]["verify"]["passed"] == true);
  REQUIRE(report["norm_affine_not_forwarded"].size() == 1);
  CHECK(report["norm_affine_not_forwarded"][0]["reason"] == "residual-add");
  std::string validation;
  const int valid = validateReports({dir.file("report.json")}, &validation);
  INFO(validation);
  CHECK(valid == 0);
  OrtComparison comparison = compareInOrt(dir.file("in.onnx"), dir.file("out.onnx"), 1e-4, 1e-4);
  INFO(comparison.error);
  CHECK(comparison.ok);
}
