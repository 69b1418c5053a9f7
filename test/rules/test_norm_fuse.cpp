// norm-fuse: decomposed LayerNorm, RMSNorm and GroupNorm chains, as exporters write them, become
// LayerNormalization (17+), RMSNormalization (23+) and GroupNormalization (21+). Each variant is stated in ONNX text,
// fused, checked for its op sequence and report entry, and compared with the original in ONNX Runtime; each condition
// has a chain that breaks it and the reason code the report gives.

#include <catch2/catch.hpp>

#include <cctype>
#include <set>

#include "bnfold/check/fold.h"
#include "test_bn_fold_support.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;
using json = nlohmann::json;

namespace {

constexpr double kTol = 1e-5;
const std::vector<std::string> kRules = {"norm-fuse"};

/// The pieces of a decomposed LayerNorm over the last axis of x [2, 4, 8] that tests vary: each line of the body is
/// one entry, so a test replaces the one it needs.
struct LayerNormText {
  int opset = 17;
  std::string inputType = "float[2,4,8]";
  std::string outputType = "float[2,4,8]";
  std::string extraInputs;
  std::string extraOutputs;
  std::string initializers;
  std::vector<std::string> body;
  std::vector<int64_t> gammaDims = {8};
  std::vector<int64_t> betaDims = {8};
  std::string epsilon = "float eps = {1e-5}";
  std::string exponent = "float two = {2}";
  /// The element type the float tensors and types become (ONNX text cannot spell float16 literals), except the
  /// initializers and values named in keepFloat.
  int32_t elementType = onnx::TensorProto::FLOAT;
  std::set<std::string> keepFloat = {"eps", "two"};

  std::string text() const {
    const std::size_t gammaCount = product(gammaDims, 0), betaCount = product(betaDims, 0);
    std::string inits = tensorText("float", "gamma", gammaDims, asFloats(sampleValues(gammaCount, 0.3, 0.5, 2.0))) +
                        ", " + tensorText("float", "beta", betaDims, asFloats(sampleValues(betaCount, 0.7))) + ", " +
                        epsilon + ", " + exponent + (initializers.empty() ? "" : ", " + initializers);
    std::string text = "<ir_version: 8, opset_import: [\"\" : " + std::to_string(opset) + "]>\ng (" + inputType +
                       " x" + extraInputs + ") => (" + outputType + " y" + extraOutputs + ")\n<" + inits + ">\n{\n";
    for (const std::string& line : body) text += "  " + line + "\n";
    return text + "}\n";
  }

  std::unique_ptr<Model> build() const {
    return elementType == onnx::TensorProto::FLOAT ? parseModel(text()) : parseModelAs(text(), elementType, keepFloat);
  }
};

LayerNormText pytorchLayerNorm() {
  LayerNormText ln;
  ln.body = {"mean = ReduceMean <axes = [-1]> (x)",
             "d = Sub (x, mean)",
             "sq = Pow (d, two)",
             "var = ReduceMean <axes = [-1]> (sq)",
             "ve = Add (var, eps)",
             "s = Sqrt (ve)",
             "n = Div (d, s)",
             "g = Mul (n, gamma)",
             "y = Add (g, beta)"};
  return ln;
}

/// A LLaMA-style RMSNorm at `opset` (below).
LayerNormText rmsNorm(int opset);

void replaceLine(LayerNormText& ln, const std::string& start, const std::vector<std::string>& with) {
  for (std::size_t i = 0; i < ln.body.size(); ++i) {
    if (ln.body[i].rfind(start, 0) != 0) continue;
    ln.body.erase(ln.body.begin() + static_cast<std::ptrdiff_t>(i));
    ln.body.insert(ln.body.begin() + static_cast<std::ptrdiff_t>(i), with.begin(), with.end());
    return;
  }
  FAIL("no line starts with " << start);
}

/// Fuses and compares in ONNX Runtime; returns the report's one norms_fused entry.
json fuseAndCompare(const LayerNormText& chain, const std::string& expectedOps, double tolerance = kTol) {
  INFO(chain.text());
  auto model = chain.build();
  FoldOutcome outcome = applyRulesAndCompare(*model, kRules, tolerance, tolerance);
  INFO(outcome.report.dump());
  CHECK(opSequence(model->graph()) == expectedOps);
  INFO(outcome.comparison.error);
  CHECK(outcome.comparison.ok);
  const json& fused = outcome.report.section("norms_fused");
  REQUIRE(fused.size() == 1);
  CHECK(outcome.report.section("norms_not_fused").empty());
  return fused[0];
}

/// Runs the rule on a chain it must leave alone: the graph keeps its ops, and the reason reported for the chain.
std::string reasonLeft(const LayerNormText& chain) {
  INFO(chain.text());
  auto model = chain.build();
  const std::string before = opSequence(model->graph());
  const Report report = applyRules(*model, kRules);
  INFO(report.dump());
  CHECK(report.section("norms_fused").empty());
  CHECK(opSequence(model->graph()) == before);
  const json& left = report.section("norms_not_fused");
  REQUIRE(left.size() == 1);
  CHECK(left[0]["rule"] == "norm-fuse");
  return left[0]["reason"].get<std::string>();
}

}  // namespace

TEST_CASE("norm-fuse: the PyTorch LayerNorm chain becomes LayerNormalization", "[norm-fuse]") {
  const json entry = fuseAndCompare(pytorchLayerNorm(), "LayerNormalization");
  CHECK(entry["rule"] == "norm-fuse");
  CHECK(entry["into_op"] == "LayerNormalization");
  CHECK(entry["op"] == "Div");
  CHECK(entry["scale"] == "gamma");
  CHECK(entry["bias"] == "beta");
  CHECK(entry["axis"] == -1);
  CHECK(entry["epsilon"].get<double>() == Approx(1e-5));
  CHECK(entry["casts_absorbed"] == false);
  CHECK(entry["normalized_dims"] == json::array({8}));
  CHECK(entry["replaced_ops"] ==
        json::array({"ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"}));
  CHECK(entry["replaced_nodes"].size() == 9);
}

TEST_CASE("norm-fuse: the fused node reads gamma and beta as they are and keeps the output name", "[norm-fuse]") {
  auto model = parseModel(pytorchLayerNorm().text());
  applyRules(*model, kRules);
  const Node* ln = findNode(model->graph(), "LayerNormalization");
  REQUIRE(ln);
  CHECK(ln->input(0)->name() == "x");
  CHECK(ln->input(1)->name() == "gamma");
  CHECK(ln->input(2)->name() == "beta");
  CHECK(ln->output(0)->name() == "y");
  CHECK(ln->attributeInt("axis", 0) == -1);
  CHECK(ln->attributeInt("stash_type", 0) == 1);
  CHECK(ln->attributeFloat("epsilon", 0) == Approx(1e-5));
}

TEST_CASE("norm-fuse: LayerNorm variants exporters write", "[norm-fuse]") {
  LayerNormText ln = pytorchLayerNorm();
  SECTION("Mul(d, d) for Pow") { replaceLine(ln, "sq =", {"sq = Mul (d, d)"}); }
  SECTION("Reciprocal and Mul for Div") { replaceLine(ln, "n =", {"r = Reciprocal (s)", "n = Mul (d, r)"}); }
  SECTION("Div(1, s) and Mul(r, d) for Div") {
    ln.initializers = "float one = {1}";
    replaceLine(ln, "n =", {"r = Div (one, s)", "n = Mul (r, d)"});
  }
  SECTION("operands in the other order") {
    replaceLine(ln, "ve =", {"ve = Add (eps, var)"});
    replaceLine(ln, "g =", {"g = Mul (gamma, n)"});
    replaceLine(ln, "y =", {"y = Add (beta, g)"});
  }
  SECTION("positive axes") {
    replaceLine(ln, "mean =", {"mean = ReduceMean <axes = [2]> (x)"});
    replaceLine(ln, "var =", {"var = ReduceMean <axes = [2]> (sq)"});
  }
  SECTION("one mean with a negative axis, the other positive") {
    replaceLine(ln, "var =", {"var = ReduceMean <axes = [2]> (sq)"});
  }
  SECTION("axes as an input (opset 18)") {
    ln.opset = 18;
    ln.initializers = "int64[1] axes = {-1}";
    replaceLine(ln, "mean =", {"mean = ReduceMean (x, axes)"});
    replaceLine(ln, "var =", {"var = ReduceMean (sq, axes)"});
  }
  SECTION("two trailing axes, gamma [4, 8] and beta [1, 8]") {
    ln.gammaDims = {4, 8};
    ln.betaDims = {1, 8};
    replaceLine(ln, "mean =", {"mean = ReduceMean <axes = [-2, -1]> (x)"});
    replaceLine(ln, "var =", {"var = ReduceMean <axes = [1, 2]> (sq)"});
  }
  SECTION("gamma [1, 1, 8] and a scalar beta") {
    ln.gammaDims = {1, 1, 8};
    ln.betaDims = {};
  }
  const json entry = fuseAndCompare(ln, "LayerNormalization");
  CHECK(entry["scale"] == "gamma");
  CHECK(entry["bias"] == "beta");
}

TEST_CASE("norm-fuse: the Keras (tf2onnx) form, gamma folded into the scale and beta into the shift", "[norm-fuse]") {
  LayerNormText ln = pytorchLayerNorm();
  ln.body = {"mean = ReduceMean <axes = [-1]> (x)",
             "d = Sub (x, mean)",
             "sq = Mul (d, d)",
             "var = ReduceMean <axes = [-1]> (sq)",
             "ve = Add (var, eps)",
             "s = Sqrt (ve)",
             "r = Reciprocal (s)",
             "k = Mul (r, gamma)",
             "mk = Mul (mean, k)",
             "shift = Sub (beta, mk)",
             "xk = Mul (x, k)",
             "y = Add (xk, shift)"};
  SECTION("as tf2onnx writes it") {
    const json entry = fuseAndCompare(ln, "LayerNormalization");
    CHECK(entry["scale"] == "gamma");
    CHECK(entry["bias"] == "beta");
    CHECK(entry["replaced_nodes"].size() == 12);
  }
  SECTION("operands in the other order") {
    replaceLine(ln, "k =", {"k = Mul (gamma, r)"});
    replaceLine(ln, "mk =", {"mk = Mul (k, mean)"});
    replaceLine(ln, "xk =", {"xk = Mul (k, x)"});
    replaceLine(ln, "y =", {"y = Add (shift, xk)"});
    fuseAndCompare(ln, "LayerNormalization");
  }
  SECTION("a shift that is not beta - mean * s is left alone") {
    replaceLine(ln, "shift =", {"shift = Sub (mk, beta)"});
    CHECK(reasonLeft(ln) == "not-a-norm-chain");
  }
  SECTION("a beta fed at run time is left alone") {
    ln.extraInputs = ", float[8] beta2";
    replaceLine(ln, "shift =", {"shift = Sub (beta2, mk)"});
    CHECK(reasonLeft(ln) == "operand-not-constant");
  }
}

// Keras with scale=False and/or center=False: s is the reciprocal itself, and the shift -mean * s (Neg), or the sum
// a difference x * s - mean * s.
TEST_CASE("norm-fuse: the Keras (tf2onnx) form without gamma or beta", "[norm-fuse]") {
  LayerNormText ln = pytorchLayerNorm();
  ln.body = {"mean = ReduceMean <axes = [-1]> (x)",
             "d = Sub (x, mean)",
             "sq = Mul (d, d)",
             "var = ReduceMean <axes = [-1]> (sq)",
             "ve = Add (var, eps)",
             "s = Sqrt (ve)",
             "r = Reciprocal (s)",
             "k = Mul (r, gamma)",
             "mk = Mul (mean, k)",
             "shift = Sub (beta, mk)",
             "xk = Mul (x, k)",
             "y = Add (xk, shift)"};
  SECTION("no gamma") {
    replaceLine(ln, "k =", {});
    replaceLine(ln, "mk =", {"mk = Mul (mean, r)"});
    replaceLine(ln, "xk =", {"xk = Mul (r, x)"});
    const json entry = fuseAndCompare(ln, "LayerNormalization");
    CHECK(entry["scale"].is_null());
    CHECK(entry["bias"] == "beta");
    CHECK(entry["replaced_nodes"].size() == 11);
  }
  SECTION("no beta: the shift is Neg(mean * s)") {
    replaceLine(ln, "shift =", {"shift = Neg (mk)"});
    const json entry = fuseAndCompare(ln, "LayerNormalization");
    CHECK(entry["scale"] == "gamma");
    CHECK(entry["bias"].is_null());
  }
  SECTION("no beta: x * s - mean * s") {
    replaceLine(ln, "shift =", {});
    replaceLine(ln, "y =", {"y = Sub (xk, mk)"});
    const json entry = fuseAndCompare(ln, "LayerNormalization");
    CHECK(entry["bias"].is_null());
    CHECK(entry["replaced_nodes"].size() == 11);
  }
  SECTION("neither") {
    replaceLine(ln, "k =", {});
    replaceLine(ln, "mk =", {"mk = Mul (r, mean)"});
    replaceLine(ln, "xk =", {"xk = Mul (x, r)"});
    replaceLine(ln, "shift =", {"shift = Neg (mk)"});
    replaceLine(ln, "y =", {"y = Add (shift, xk)"});
    const json entry = fuseAndCompare(ln, "LayerNormalization");
    CHECK(entry["scale"].is_null());
    CHECK(entry["bias"].is_null());
  }
  SECTION("mean * s subtracted from x * s the other way round is left alone") {
    replaceLine(ln, "shift =", {});
    replaceLine(ln, "y =", {"y = Sub (mk, xk)"});
    CHECK(reasonLeft(ln) == "not-a-norm-chain");
  }
  SECTION("x * s read by another node too is left alone") {
    replaceLine(ln, "k =", {});
    replaceLine(ln, "mk =", {"mk = Mul (mean, r)"});
    replaceLine(ln, "xk =", {"xk = Mul (x, r)"});
    ln.extraOutputs = ", float[2,4,8] xk";
    CHECK(reasonLeft(ln) == "intermediate-has-other-readers");
  }
}

TEST_CASE("norm-fuse: the Flax form, variance as E[x^2] - E[x]^2", "[norm-fuse]") {
  LayerNormText ln = pytorchLayerNorm();
  ln.initializers = "float zero = {0}";
  ln.body = {"mean = ReduceMean <axes = [-1]> (x)",
             "xx = Mul (x, x)",
             "meansq = ReduceMean <axes = [-1]> (xx)",
             "mm = Mul (mean, mean)",
             "diff = Sub (meansq, mm)",
             "var = Max (diff, zero)",
             "ve = Add (var, eps)",
             "s = Sqrt (ve)",
             "r = Reciprocal (s)",
             "d = Sub (x, mean)",
             "n = Mul (d, r)",
             "g = Mul (n, gamma)",
             "y = Add (g, beta)"};
  SECTION("clamped by Max(., 0)") {
    const json entry = fuseAndCompare(ln, "LayerNormalization", 1e-4);
    CHECK(entry["replaced_nodes"].size() == 13);
  }
  SECTION("without the clamp, Pow for the squares") {
    replaceLine(ln, "var =", {});
    replaceLine(ln, "ve =", {"ve = Add (diff, eps)"});
    replaceLine(ln, "xx =", {"xx = Pow (x, two)"});
    replaceLine(ln, "mm =", {"mm = Pow (mean, two)"});
    fuseAndCompare(ln, "LayerNormalization", 1e-4);
  }
  SECTION("E[x]^2 of another mean is left alone") {
    ln.extraInputs = ", float[2,4,8] other";
    replaceLine(ln, "mm =", {"om = ReduceMean <axes = [-1]> (other)", "mm = Mul (om, om)"});
    CHECK(reasonLeft(ln) == "not-a-norm-chain");
  }
}

TEST_CASE("norm-fuse: gamma and beta are optional", "[norm-fuse]") {
  LayerNormText ln = pytorchLayerNorm();
  SECTION("neither") {
    replaceLine(ln, "g =", {});
    replaceLine(ln, "y =", {"y = Identity (n)"});
    const json entry = fuseAndCompare(ln, "LayerNormalization,Identity");
    CHECK(entry["scale"].is_null());
    CHECK(entry["bias"].is_null());
  }
  SECTION("no beta") {
    replaceLine(ln, "y =", {"y = Identity (g)"});
    const json entry = fuseAndCompare(ln, "LayerNormalization,Identity");
    CHECK(entry["scale"] == "gamma");
    CHECK(entry["bias"].is_null());
  }
  SECTION("no gamma") {
    replaceLine(ln, "g =", {});
    replaceLine(ln, "y =", {"y = Add (n, beta)"});
    const json entry = fuseAndCompare(ln, "LayerNormalization");
    CHECK(entry["scale"].is_null());
    CHECK(entry["bias"] == "beta");
  }
  SECTION("no gamma, Add(beta, n)") {
    replaceLine(ln, "g =", {});
    replaceLine(ln, "y =", {"y = Add (beta, n)"});
    const json entry = fuseAndCompare(ln, "LayerNormalization");
    CHECK(entry["scale"].is_null());
    CHECK(entry["bias"] == "beta");
  }
  SECTION("no beta, Mul(gamma, n)") {
    replaceLine(ln, "g =", {"g = Mul (gamma, n)"});
    replaceLine(ln, "y =", {"y = Identity (g)"});
    const json entry = fuseAndCompare(ln, "LayerNormalization,Identity");
    CHECK(entry["scale"] == "gamma");
    CHECK(entry["bias"].is_null());
  }
}

TEST_CASE("norm-fuse: an fp16 LayerNorm with its statistics in float between Casts", "[norm-fuse]") {
  LayerNormText ln = pytorchLayerNorm();
  ln.elementType = onnx::TensorProto::FLOAT16;
  ln.keepFloat = {"eps", "two", "xf", "mean", "d", "sq", "var", "ve", "s", "nf"};
  ln.body.insert(ln.body.begin(), "xf = Cast <to = 1> (x)");
  replaceLine(ln, "mean =", {"mean = ReduceMean <axes = [-1]> (xf)"});
  replaceLine(ln, "d =", {"d = Sub (xf, mean)"});
  replaceLine(ln, "n =", {"nf = Div (d, s)", "n = Cast <to = 10> (nf)"});
  const json entry = fuseAndCompare(ln, "LayerNormalization", 2e-3);
  CHECK(entry["casts_absorbed"] == true);
  CHECK(entry["input"] == "x");
  CHECK(entry["replaced_ops"].front() == "Cast");
}

// Fusing would change the outputs: the chain rounds every step to float16, LayerNormalization does not (in ONNX
// Runtime 1.30 stash_type 10 gives the same outputs as 1, off from the chain's by up to one fp16 ulp, docs/rules.md).
TEST_CASE("norm-fuse: fp16 chains that compute their statistics in fp16 (no Casts) are left alone", "[norm-fuse]") {
  SECTION("LayerNorm") {
    LayerNormText ln = pytorchLayerNorm();
    ln.elementType = onnx::TensorProto::FLOAT16;
    ln.keepFloat = {};
    CHECK(reasonLeft(ln) == "unsupported-type");
  }
  SECTION("RMSNorm") {
    LayerNormText rms = rmsNorm(23);
    rms.elementType = onnx::TensorProto::FLOAT16;
    rms.keepFloat = {};
    CHECK(reasonLeft(rms) == "unsupported-type");
  }
  SECTION("only the leading Cast to float") {
    LayerNormText ln = pytorchLayerNorm();
    ln.elementType = onnx::TensorProto::FLOAT16;
    ln.keepFloat = {"eps", "two", "xf", "mean", "d", "sq", "var", "ve", "s", "n", "g", "y", "gamma", "beta"};
    ln.outputType = "float[2,4,8]";
    ln.body.insert(ln.body.begin(), "xf = Cast <to = 1> (x)");
    replaceLine(ln, "mean =", {"mean = ReduceMean <axes = [-1]> (xf)"});
    replaceLine(ln, "d =", {"d = Sub (xf, mean)"});
    // A float LayerNorm of the cast input: fused, the Cast stays.
    const json entry = fuseAndCompare(ln, "Cast,LayerNormalization", 2e-3);
    CHECK(entry["casts_absorbed"] == false);
  }
}

TEST_CASE("norm-fuse: a residual Add after the norm stays after the fused op", "[norm-fuse]") {
  LayerNormText ln = pytorchLayerNorm();
  replaceLine(ln, "y =", {"y = Add (g, x)"});
  const json entry = fuseAndCompare(ln, "LayerNormalization,Add");
  CHECK(entry["bias"].is_null());
  CHECK(entry["scale"] == "gamma");
}

TEST_CASE("norm-fuse: two norms sharing gamma and beta both fuse, reading them unchanged", "[norm-fuse]") {
  LayerNormText ln = pytorchLayerNorm();
  ln.extraInputs = ", float[2,4,8] x2";
  ln.extraOutputs = ", float[2,4,8] y2";
  const std::vector<std::string> first = ln.body;
  for (std::string line : first) {
    for (const char* name : {"mean", "d", "sq", "var", "ve", "s", "n", "g", "y", "x"}) {
      // Rename every value of the chain (whole words only) for the second copy.
      const std::string word = name;
      for (std::size_t at = line.find(word); at != std::string::npos; at = line.find(word, at + word.size() + 1)) {
        const bool startOk = at == 0 || !std::isalnum(static_cast<unsigned char>(line[at - 1]));
        const bool endOk = at + word.size() >= line.size() || !std::isalnum(static_cast<unsigned char>(line[at + word.size()]));
        if (startOk && endOk) line.insert(at + word.size(), "2");
      }
    }
    ln.body.push_back(line);
  }
  auto model = parseModel(ln.text());
  const std::vector<double> gammaBefore = model->graph().findLocal("gamma")->initializer()->toDoubles();
  FoldOutcome outcome = applyRulesAndCompare(*model, kRules, kTol, kTol);
  INFO(outcome.report.dump());
  CHECK(outcome.comparison.ok);
  CHECK(opSequence(model->graph()) == "LayerNormalization,LayerNormalization");
  CHECK(outcome.report.section("norms_fused").size() == 2);
  const Value* gamma = model->graph().findLocal("gamma");
  REQUIRE(gamma);
  CHECK(gamma->uses().size() == 2);
  CHECK(gamma->initializer()->toDoubles() == gammaBefore);
}

TEST_CASE("norm-fuse: a chain that breaks a condition is left with its reason", "[norm-fuse]") {
  LayerNormText ln = pytorchLayerNorm();
  SECTION("opset 16 has no LayerNormalization") {
    ln.opset = 16;
    CHECK(reasonLeft(ln) == "norm-op-not-in-opset");
  }
  SECTION("axes not trailing") {
    replaceLine(ln, "mean =", {"mean = ReduceMean <axes = [1]> (x)"});
    replaceLine(ln, "var =", {"var = ReduceMean <axes = [1]> (sq)"});
    CHECK(reasonLeft(ln) == "axes-not-trailing");
  }
  SECTION("different axes in the two means") {
    replaceLine(ln, "var =", {"var = ReduceMean <axes = [-2, -1]> (sq)"});
    CHECK(reasonLeft(ln) == "axes-differ");
  }
  SECTION("exponent 3") {
    ln.exponent = "float two = {3}";
    CHECK(reasonLeft(ln) == "exponent-not-two");
  }
  SECTION("a product of two different values for the square") {
    replaceLine(ln, "sq =", {"sq = Mul (d, x)"});
    CHECK(reasonLeft(ln) == "exponent-not-two");
  }
  SECTION("gamma of the wrong shape") {
    ln.gammaDims = {4, 1};
    CHECK(reasonLeft(ln) == "param-shape-mismatch");
  }
  SECTION("beta that would broadcast along a non-normalized axis") {
    ln.betaDims = {2, 1, 8};
    CHECK(reasonLeft(ln) == "param-shape-mismatch");
  }
  SECTION("an intermediate with another reader") {
    ln.extraOutputs = ", float[2,4,1] var2";
    ln.body.push_back("var2 = Identity (var)");
    CHECK(reasonLeft(ln) == "intermediate-has-other-readers");
  }
  SECTION("an intermediate that is a graph output") {
    ln.extraOutputs = ", float[2,4,8] d";
    CHECK(reasonLeft(ln) == "intermediate-has-other-readers");
  }
  SECTION("epsilon not a scalar") {
    ln.epsilon = tensorText("float", "eps", {8}, std::vector<double>(8, 1e-5));
    CHECK(reasonLeft(ln) == "epsilon-not-scalar");
  }
  SECTION("epsilon fed at run time") {
    ln.epsilon = "float unused = {0}";
    ln.extraInputs = ", float eps";
    CHECK(reasonLeft(ln) == "operand-not-constant");
  }
  SECTION("the mean of another value than the one divided") {
    ln.extraInputs = ", float[2,4,8] other";
    replaceLine(ln, "n =", {"n = Div (other, s)"});
    CHECK(reasonLeft(ln) == "not-a-norm-chain");
  }
  SECTION("statistics in double") {
    ln.elementType = onnx::TensorProto::DOUBLE;
    ln.keepFloat = {};
    CHECK(reasonLeft(ln) == "unsupported-type");
  }
  SECTION("axes given as floats (an invalid model: axes are int64)") {
    ln.opset = 18;
    ln.initializers = "float[1] axes = {-1}";
    replaceLine(ln, "mean =", {"mean = ReduceMean (x, axes)"});
    replaceLine(ln, "var =", {"var = ReduceMean (sq, axes)"});
    CHECK(reasonLeft(ln) == "unsupported-type");
  }
  SECTION("input rank unknown") {
    ln.inputType = "float[]";
    ln.outputType = "float[]";
    CHECK(reasonLeft(ln) == "rank-unknown");
  }
  // Declared dims have no data behind them: expanding gamma and beta to them, or writing the ones of an absent
  // gamma, would ask for 2^59 bytes.
  const std::string hugeType = "float[2,4,72057594037927939]";
  SECTION("gamma and beta of one value, expanded beyond --max-constant-size") {
    ln.inputType = ln.outputType = hugeType;
    ln.gammaDims = ln.betaDims = {1};
    CHECK(reasonLeft(ln) == "constant-too-large");
  }
  SECTION("no gamma or beta, whose ones would exceed --max-constant-size") {
    ln.inputType = ln.outputType = hugeType;
    replaceLine(ln, "n =", {"y = Div (d, s)"});
    replaceLine(ln, "g =", {});
    replaceLine(ln, "y = Add", {});
    CHECK(reasonLeft(ln) == "constant-too-large");
  }
}

namespace {

/// A LLaMA-style RMSNorm over the last axis: Pow(2), ReduceMean, Add(eps), Sqrt, Reciprocal, Mul, Mul(gamma).
LayerNormText rmsNorm(int opset) {
  LayerNormText rms;
  rms.opset = opset;
  rms.body = {"sq = Pow (x, two)",
              "var = ReduceMean <axes = [-1]> (sq)",
              "ve = Add (var, eps)",
              "s = Sqrt (ve)",
              "r = Reciprocal (s)",
              "n = Mul (x, r)",
              "g = Mul (gamma, n)",
              "y = Add (g, beta)"};
  if (opset >= 18) {
    rms.initializers = "int64[1] axes = {-1}";
    replaceLine(rms, "var =", {"var = ReduceMean (sq, axes)"});
  }
  return rms;
}

}  // namespace

TEST_CASE("norm-fuse: an RMSNorm chain becomes RMSNormalization at opset 23", "[norm-fuse]") {
  SECTION("float, reciprocal form") {
    const json entry = fuseAndCompare(rmsNorm(23), "RMSNormalization,Add");
    CHECK(entry["into_op"] == "RMSNormalization");
    CHECK(entry["op"] == "Mul");
    CHECK(entry["scale"] == "gamma");
    CHECK(entry["bias"].is_null());
    CHECK(entry["replaced_ops"] == json::array({"Pow", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul", "Mul"}));
  }
  SECTION("float, Div form") {
    LayerNormText rms = rmsNorm(23);
    replaceLine(rms, "r =", {});
    replaceLine(rms, "n =", {"n = Div (x, s)"});
    fuseAndCompare(rms, "RMSNormalization,Add");
  }
  SECTION("fp16 with the statistics in float between Casts (LLaMA)") {
    LayerNormText rms = rmsNorm(23);
    rms.elementType = onnx::TensorProto::FLOAT16;
    rms.keepFloat = {"eps", "two", "xf", "sq", "var", "ve", "s", "r", "nf"};
    rms.body = {"xf = Cast <to = 1> (x)",
                "sq = Pow (xf, two)",
                "var = ReduceMean (sq, axes)",
                "ve = Add (var, eps)",
                "s = Sqrt (ve)",
                "r = Reciprocal (s)",
                "nf = Mul (xf, r)",
                "n = Cast <to = 10> (nf)",
                "y = Mul (gamma, n)"};
    const json entry = fuseAndCompare(rms, "RMSNormalization", 2e-3);
    CHECK(entry["casts_absorbed"] == true);
  }
}

TEST_CASE("norm-fuse: an RMSNorm below opset 23 is left with its reason", "[norm-fuse]") {
  LayerNormText rms = rmsNorm(22);
  replaceLine(rms, "y =", {"y = Identity (g)"});
  CHECK(reasonLeft(rms) == "norm-op-not-in-opset");
}

namespace {

/// diffusers' GroupNorm: 8 channels in 2 groups through InstanceNormalization, then gamma and beta per channel.
LayerNormText groupNorm(int opset) {
  LayerNormText gn;
  gn.opset = opset;
  gn.inputType = gn.outputType = "float[2,8,3,3]";
  gn.gammaDims = gn.betaDims = {8, 1, 1};
  gn.initializers = "int64[3] grouped = {2, 2, -1}, int64[4] back = {2, 8, 3, 3}, float[2] ones = {1, 1}, "
                    "float[2] zeros = {0, 0}";
  gn.body = {"xg = Reshape (x, grouped)",
             "ng = InstanceNormalization <epsilon = 1e-5> (xg, ones, zeros)",
             "n = Reshape (ng, back)",
             "g = Mul (n, gamma)",
             "y = Add (g, beta)"};
  return gn;
}

}  // namespace

TEST_CASE("norm-fuse: GroupNorm through InstanceNormalization becomes GroupNormalization-21", "[norm-fuse]") {
  LayerNormText gn = groupNorm(21);
  SECTION("gamma and beta [C, 1, 1]") {
    const json entry = fuseAndCompare(gn, "GroupNormalization", 1e-4);
    CHECK(entry["into_op"] == "GroupNormalization");
    CHECK(entry["op"] == "InstanceNormalization");
    CHECK(entry["num_groups"] == 2);
    CHECK(entry["replaced_ops"] == json::array({"Reshape", "InstanceNormalization", "Reshape", "Mul", "Add"}));
  }
  SECTION("no beta, a scalar gamma") {
    gn.gammaDims = {};
    replaceLine(gn, "y =", {"y = Identity (g)"});
    const json entry = fuseAndCompare(gn, "GroupNormalization,Identity", 1e-4);
    CHECK(entry["bias"].is_null());
  }
}

TEST_CASE("norm-fuse: a GroupNorm that breaks a condition is left with its reason", "[norm-fuse]") {
  LayerNormText gn = groupNorm(21);
  SECTION("opset 20") {
    gn.opset = 20;
    CHECK(reasonLeft(gn) == "norm-op-not-in-opset");
  }
  SECTION("an InstanceNormalization scale other than 1") {
    gn.initializers = "int64[3] grouped = {2, 2, -1}, int64[4] back = {2, 8, 3, 3}, float[2] ones = {1, 2}, "
                      "float[2] zeros = {0, 0}";
    CHECK(reasonLeft(gn) == "not-a-norm-chain");
  }
  SECTION("gamma along the last axis instead of the channels") {
    gn.gammaDims = {3};
    CHECK(reasonLeft(gn) == "param-shape-mismatch");
  }
  SECTION("groups that split a channel") {
    gn.initializers = "int64[3] grouped = {2, 3, -1}, int64[4] back = {2, 8, 3, 3}, float[3] ones = {1, 1, 1}, "
                      "float[3] zeros = {0, 0, 0}";
    CHECK(reasonLeft(gn) == "not-a-norm-chain");
  }
  SECTION("one gamma and beta for 2^56 declared channels, expanded beyond --max-constant-size") {
    gn.inputType = gn.outputType = "float[2,72057594037927938,3,3]";
    gn.initializers = "int64[3] grouped = {2, 2, -1}, int64[4] back = {2, 72057594037927938, 3, 3}, "
                      "float[2] ones = {1, 1}, float[2] zeros = {0, 0}";
    gn.gammaDims = gn.betaDims = {};
    CHECK(reasonLeft(gn) == "constant-too-large");
  }
}

namespace {

/// The same GroupNorm with its statistics written out: ReduceMean over the grouped view's last axis, ..., Div.
TEST_CASE("norm-fuse: a deprecated GroupNormalization-18 stays with its reason, a -21 is not reported", "[norm-fuse]") {
  LayerNormText gn;
  gn.inputType = gn.outputType = "float[2,8,3,3]";
  gn.body = {"y = GroupNormalization <num_groups = 2, epsilon = 1e-5> (x, gamma, beta)"};
  for (int opset : {18, 20}) {
    gn.opset = opset;
    gn.gammaDims = gn.betaDims = {2};  // per group
    INFO(gn.text());
    auto model = gn.build();
    const Report report = applyRules(*model, kRules);
    CHECK(opSequence(model->graph()) == "GroupNormalization");
    const json& left = report.section("norms_not_fused");
    REQUIRE(left.size() == 1);
    CHECK(left[0]["reason"] == "norm-op-not-in-opset");
    CHECK(left[0]["message"].get<std::string>().find("GroupNormalization-18") != std::string::npos);
  }
  gn.opset = 21;
  gn.gammaDims = gn.betaDims = {8};  // per channel
  auto model = gn.build();
  const Report report = applyRules(*model, kRules);
  CHECK(report.section("norms_not_fused").empty());
  CHECK(report.section("norms_fused").empty());
}

LayerNormText groupNormReduceMean(int opset) {
  LayerNormText gn = groupNorm(opset);
  gn.initializers = "int64[3] grouped = {2, 2, -1}, int64[4] back = {2, 8, 3, 3}, int64[1] axes = {-1}";
  gn.body = {"xg = Reshape (x, grouped)",
             "mean = ReduceMean (xg, axes)",
             "d = Sub (xg, mean)",
             "sq = Pow (d, two)",
             "var = ReduceMean (sq, axes)",
             "ve = Add (var, eps)",
             "s = Sqrt (ve)",
             "ng = Div (d, s)",
             "n = Reshape (ng, back)",
             "g = Mul (n, gamma)",
             "y = Add (g, beta)"};
  return gn;
}

}  // namespace

TEST_CASE("norm-fuse: GroupNorm in the ReduceMean form becomes GroupNormalization-21", "[norm-fuse]") {
  LayerNormText gn = groupNormReduceMean(21);
  SECTION("gamma and beta [C, 1, 1]") {
    const json entry = fuseAndCompare(gn, "GroupNormalization", 1e-4);
    CHECK(entry["into_op"] == "GroupNormalization");
    CHECK(entry["op"] == "Div");
    CHECK(entry["num_groups"] == 2);
    CHECK(entry["input"] == "x");
    CHECK(entry["replaced_ops"] == json::array({"Reshape", "ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt",
                                                "Div", "Reshape", "Mul", "Add"}));
  }
  SECTION("Reciprocal and Mul, gamma in the other operand order, no beta") {
    replaceLine(gn, "ng =", {"r = Reciprocal (s)", "ng = Mul (d, r)"});
    replaceLine(gn, "g =", {"g = Mul (gamma, n)"});
    replaceLine(gn, "y =", {"y = Identity (g)"});
    const json entry = fuseAndCompare(gn, "GroupNormalization,Identity", 1e-4);
    CHECK(entry["scale"] == "gamma");
    CHECK(entry["bias"].is_null());
  }
  SECTION("the Flax statistics") {
    replaceLine(gn, "d =", {});
    replaceLine(gn, "sq =", {"xx = Mul (xg, xg)", "meansq = ReduceMean (xx, axes)", "mm = Mul (mean, mean)"});
    replaceLine(gn, "var =", {"var = Sub (meansq, mm)"});
    replaceLine(gn, "ng =", {"d = Sub (xg, mean)", "ng = Div (d, s)"});
    fuseAndCompare(gn, "GroupNormalization", 1e-4);
  }
}

// Where a condition of GroupNormalization-21 fails, the chain is still the LayerNorm of the grouped view, exactly.
TEST_CASE("norm-fuse: a GroupNorm in the ReduceMean form that is no GroupNormalization-21", "[norm-fuse]") {
  LayerNormText gn = groupNormReduceMean(21);
  SECTION("below opset 21 it is a LayerNorm of the grouped view") {
    gn.opset = 18;
    const json entry = fuseAndCompare(gn, "Reshape,LayerNormalization,Reshape,Mul,Add", 1e-4);
    CHECK(entry["into_op"] == "LayerNormalization");
  }
  SECTION("groups that split a channel: a LayerNorm of the grouped view") {
    gn.initializers = "int64[3] grouped = {2, 3, -1}, int64[4] back = {2, 8, 3, 3}, int64[1] axes = {-1}";
    const json entry = fuseAndCompare(gn, "Reshape,LayerNormalization,Reshape,Mul,Add", 1e-4);
    CHECK(entry["into_op"] == "LayerNormalization");
  }
  SECTION("statistics over the whole grouped value, not per group: a LayerNorm of it") {
    gn.initializers = "int64[3] grouped = {2, 2, -1}, int64[4] back = {2, 8, 3, 3}, int64[2] axes = {1, 2}";
    const json entry = fuseAndCompare(gn, "Reshape,LayerNormalization,Reshape,Mul,Add", 1e-4);
    CHECK(entry["into_op"] == "LayerNormalization");
  }
  SECTION("gamma along the last axis instead of the channels: a LayerNorm of the grouped view") {
    gn.gammaDims = {3};
    const json entry = fuseAndCompare(gn, "Reshape,LayerNormalization,Reshape,Mul,Add", 1e-4);
    CHECK(entry["into_op"] == "LayerNormalization");
  }
  SECTION("the grouped value also a graph output: a LayerNorm of the grouped view") {
    gn.extraOutputs = ", float[2,2,36] xg";
    const json entry = fuseAndCompare(gn, "Reshape,LayerNormalization,Reshape,Mul,Add", 1e-4);
    CHECK(entry["into_op"] == "LayerNormalization");
  }
}

// JAX/Flax writes means as ReduceSum times 1/n (or divided by n); tf2onnx sometimes averages with GlobalAveragePool on
// a view [P, 1, R] reshaped back. n and the view are checked against the reduced dims.
TEST_CASE("norm-fuse: means as ReduceSum / n and as GlobalAveragePool of a view", "[norm-fuse]") {
  LayerNormText ln = pytorchLayerNorm();
  ln.initializers = "int64[1] axes = {-1}, float inv = {0.125}, float count = {8}";
  SECTION("ReduceSum times 1/n in both means") {
    replaceLine(ln, "mean =", {"xs = ReduceSum (x, axes)", "mean = Mul (xs, inv)"});
    replaceLine(ln, "var =", {"qs = ReduceSum (sq, axes)", "var = Mul (inv, qs)"});
    const json entry = fuseAndCompare(ln, "LayerNormalization");
    CHECK(entry["replaced_nodes"].size() == 11);
  }
  SECTION("ReduceSum divided by n, and a ReduceMean") {
    replaceLine(ln, "var =", {"qs = ReduceSum (sq, axes)", "var = Div (qs, count)"});
    fuseAndCompare(ln, "LayerNormalization");
  }
  SECTION("ReduceSum over two axes, axes as an attribute (opset 12): all but the opset matches") {
    ln.opset = 12;
    ln.initializers = "float inv = {0.03125}";
    replaceLine(ln, "mean =", {"xs = ReduceSum <axes = [1, 2]> (x)", "mean = Mul (xs, inv)"});
    replaceLine(ln, "var =", {"var = ReduceMean <axes = [-2, -1]> (sq)"});
    CHECK(reasonLeft(ln) == "norm-op-not-in-opset");
  }
  SECTION("the Flax statistics with ReduceSum / n") {
    ln.body = {"xs = ReduceSum (x, axes)",
               "mean = Mul (xs, inv)",
               "xx = Mul (x, x)",
               "xxs = ReduceSum (xx, axes)",
               "meansq = Mul (xxs, inv)",
               "mm = Mul (mean, mean)",
               "var = Sub (meansq, mm)",
               "ve = Add (var, eps)",
               "s = Sqrt (ve)",
               "r = Reciprocal (s)",
               "d = Sub (x, mean)",
               "n1 = Mul (d, r)",
               "g = Mul (n1, gamma)",
               "y = Add (g, beta)"};
    fuseAndCompare(ln, "LayerNormalization", 1e-4);
  }
  SECTION("GlobalAveragePool of a view [8, 1, 8] reshaped back, in both means") {
    ln.initializers = "int64[3] view = {8, 1, 8}, int64[3] back = {2, 4, 1}";
    replaceLine(ln, "mean =", {"xv = Reshape (x, view)", "xp = GlobalAveragePool (xv)", "mean = Reshape (xp, back)"});
    replaceLine(ln, "var =", {"qv = Reshape (sq, view)", "qp = GlobalAveragePool (qv)", "var = Reshape (qp, back)"});
    const json entry = fuseAndCompare(ln, "LayerNormalization");
    CHECK(entry["normalized_dims"] == json::array({8}));
    CHECK(entry["replaced_nodes"].size() == 13);
  }
  SECTION("GlobalAveragePool of a view [2, 1, 32]: the last two axes") {
    ln.initializers = "int64[3] view = {2, 1, 32}, int64[3] back = {2, 1, 1}";
    ln.gammaDims = {4, 8};
    replaceLine(ln, "mean =", {"xv = Reshape (x, view)", "xp = GlobalAveragePool (xv)", "mean = Reshape (xp, back)"});
    replaceLine(ln, "var =", {"var = ReduceMean <axes = [1, 2]> (sq)"});
    const json entry = fuseAndCompare(ln, "LayerNormalization");
    CHECK(entry["axis"] == -2);
  }
  SECTION("an RMSNorm with ReduceSum / n") {
    LayerNormText rms = rmsNorm(23);
    rms.initializers = "int64[1] axes = {-1}, float inv = {0.125}";
    replaceLine(rms, "var =", {"qs = ReduceSum (sq, axes)", "var = Mul (qs, inv)"});
    fuseAndCompare(rms, "RMSNormalization,Add");
  }
}

TEST_CASE("norm-fuse: a ReduceSum or GlobalAveragePool that is not the mean is left with its reason", "[norm-fuse]") {
  LayerNormText ln = pytorchLayerNorm();
  ln.initializers = "int64[1] axes = {-1}, float inv = {0.25}, float count = {4}";
  SECTION("times 1/4 for 8 elements") {
    replaceLine(ln, "mean =", {"xs = ReduceSum (x, axes)", "mean = Mul (xs, inv)"});
    CHECK(reasonLeft(ln) == "mean-count-mismatch");
  }
  SECTION("divided by 4 for 8 elements") {
    replaceLine(ln, "var =", {"qs = ReduceSum (sq, axes)", "var = Div (qs, count)"});
    CHECK(reasonLeft(ln) == "mean-count-mismatch");
  }
  SECTION("a sum over other axes than the other mean") {
    ln.initializers = "int64[2] axes = {-2, -1}, float inv = {0.03125}";
    replaceLine(ln, "var =", {"qs = ReduceSum (sq, axes)", "var = Mul (qs, inv)"});
    CHECK(reasonLeft(ln) == "axes-differ");
  }
  SECTION("a GlobalAveragePool whose means are reshaped back along another axis") {
    // x [2, 4, 4]: the means of the last axis, [8, 1, 1], reshaped to [2, 1, 4] broadcast, but along the wrong axis.
    ln.inputType = ln.outputType = "float[2,4,4]";
    ln.gammaDims = ln.betaDims = {4};
    ln.initializers = "int64[3] view = {8, 1, 4}, int64[3] back = {2, 1, 4}";
    replaceLine(ln, "var =", {"qv = Reshape (sq, view)", "qp = GlobalAveragePool (qv)", "var = Reshape (qp, back)"});
    CHECK(reasonLeft(ln) == "not-a-norm-chain");
  }
}
