// `bnfold fold` is idempotent and deterministic: folding its own output again changes no byte and rewrites
// nothing, and two runs on the same input write the same bytes. Checked through the CLI with the default rules
// on every sample model in models/ and on ONNX-text models that give every rule something to do at once.

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "bnfold/report/report.h"
#include "test_bn_fold_support.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;
namespace fs = std::filesystem;

namespace {

std::string readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string quote(const std::string& text) { return "'" + text + "'"; }

/// Runs `bnfold fold` and returns the report.
nlohmann::json fold(const std::string& input, const std::string& output, const std::string& report,
                    const std::string& rules) {
  std::string out, err;
  const std::string command = quote(bnfoldExecutable()) + " fold " + quote(input) + " -o " + quote(output) +
                              " --report " + quote(report) + " --rules " + quote(rules) + " -q";
  const int code = runCommand(command, &out, &err);
  INFO(command << "\n" << err);
  REQUIRE(code == 0);
  return nlohmann::json::parse(readBytes(report));
}

/// Number of entries in the report's rewrite sections (a newer rule's too, such as `norms_fused`).
std::size_t rewrites(const nlohmann::json& report) {
  std::size_t count = 0;
  for (const auto& [key, value] : report.items())
    if (value.is_array() && Report::sectionKind(key) == SectionKind::Rewrites) count += value.size();
  return count;
}

/// The report without the fields that name the files of a run.
nlohmann::json withoutPaths(nlohmann::json report) {
  report.erase("input");
  report.erase("output");
  return report;
}

struct Runs {
  nlohmann::json first, again, second;
};

/// fold(input) twice from the same input, then fold(fold(input)); checks bytes and reports.
Runs checkIdempotentAndDeterministic(const std::string& input, const std::string& rules, const TempDir& dir) {
  Runs runs;
  runs.first = fold(input, dir.file("once.onnx"), dir.file("once.json"), rules);
  runs.again = fold(input, dir.file("once_again.onnx"), dir.file("once_again.json"), rules);
  runs.second = fold(dir.file("once.onnx"), dir.file("twice.onnx"), dir.file("twice.json"), rules);
  const std::string once = readBytes(dir.file("once.onnx"));
  CHECK(readBytes(dir.file("once_again.onnx")) == once);
  CHECK(withoutPaths(runs.again) == withoutPaths(runs.first));
  CHECK(readBytes(dir.file("twice.onnx")) == once);
  CHECK(rewrites(runs.second) == 0);
  // The second run leaves exactly the BatchNormalization nodes the first one left.
  CHECK(runs.second.value("skipped", nlohmann::json::array()).size() ==
        runs.first.value("skipped", nlohmann::json::array()).size());
  return runs;
}

void writeTextModel(const std::string& text, const std::string& path) {
  onnx::ModelProto proto = parseModelProto(text);
  std::ofstream out(path, std::ios::binary);
  REQUIRE(proto.SerializeToOstream(&out));
}

std::string floats(const std::string& name, const std::vector<int64_t>& dims, double seed) {
  return tensorText("float", name, dims, asFloats(sampleValues(product(dims, 0), seed)));
}

std::string bn(const std::string& prefix, std::size_t channels, double seed) {
  return bnInitializers(makeBnParams(channels, seed), prefix);
}

// Every rule has work here: bn-fold (Conv+BN, Gemm+BN1d), bias-add (Add [1,C,1,1], Add(k, X), a 2-D MatMul
// with an [N] Add becoming a Gemm), scale-fold (Mul [C,1,1] after a Conv, a Mul before a Conv), bn-forward (BN on
// the graph input before an unpadded Conv), train-bn-expand (a training-mode BN), and what none may touch: the
// [C] Add on an [N,C,H,W] output with C = W (valid, but it runs along W), and two BNs in a row after a Relu, the
// second before a padded Conv (bn-decompose's cases when it is enabled).
std::string everyRuleModel() {
  return R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,3,8,8] x, float[4,6] v) => (float[1,4,8,8] head, float[1,8,8,8] trap, float[4,5] mlp, float[2,4,8,8] tr,
   float[4] trm, float[4] trv)
<)" + bn("f", 3, 1.0) + ", " + floats("w0", {4, 3, 1, 1}, 2.0) + ", " + bn("a", 4, 3.0) + ", " +
         floats("w1", {4, 4, 3, 3}, 4.0) + R"(, float[1,4,1,1] k1 = {0.5, -0.5, 1, 2},
float[4,1,1] s1 = {2, 0.5, -1, 1.5}, float[8] k1b = {1, 2, 3, 4, 5, 6, 7, 8},
float[4,1,1] pre = {0.5, 1.5, -2, 1}, )" + floats("w2", {4, 4, 1, 1}, 5.0) + ", " +
         floats("w3", {4, 4, 3, 3}, 6.0) + ", " + bn("r", 4, 7.0) + ", " + bn("p", 4, 8.0) + ", " +
         floats("w4", {8, 4, 3, 3}, 9.0) + ", " + floats("wm", {6, 5}, 10.0) + R"(, float[5] bm = {1, -1, 0.5, 2, 0},
)" + floats("wg", {5, 5}, 11.0) + ", " + bn("g", 5, 12.0) + ", " + bn("t", 4, 13.0) + ", " +
         floats("wt", {4, 3, 1, 1}, 14.0) + R"(>
{
  xf = BatchNormalization (x, fs, fb, fm, fv)
  c0 = Conv (xf, w0)
  c0n = BatchNormalization (c0, as, ab, am, av)
  c0r = Relu (c0n)
  c1 = Conv <pads = [1,1,1,1]> (c0r, w1)
  c1b = Add (k1, c1)
  c1s = Mul (c1b, s1)
  c1r = Relu (c1s)
  m = Mul (c1r, pre)
  c2 = Conv (m, w2)
  head = Relu (c2)
  c3 = Conv <pads = [1,1,1,1]> (c1r, w3)
  c3r = Relu (c3)
  c3n = BatchNormalization (c3r, rs, rb, rm, rv)
  c3p = BatchNormalization (c3n, ps, pb, pm, pv)
  c4 = Conv <pads = [1,1,1,1]> (c3p, w4)
  trap = Add (c4, k1b)
  mm = MatMul (v, wm)
  mb = Add (mm, bm)
  g0 = Gemm (mb, wg)
  g0n = BatchNormalization (g0, gs, gb, gm, gv)
  mlp = Relu (g0n)
  xt = Concat <axis = 0> (x, x)
  ct = Conv (xt, wt)
  tr, trm, trv = BatchNormalization <training_mode = 1> (ct, ts, tb, tm, tv)
}
)";
}

// Opset 13, 2-D layers: BN1d before a Gemm with C and beta (bn-forward), two Muls after that Gemm, a Mul before
// the next Gemm (its input channels known only by following Relu and Gemm back to a weight), and a grouped
// ConvTranspose with an Add of a Constant node and a Mul after it.
std::string layersModel() {
  return R"(<ir_version: 7, opset_import: ["" : 13]>
g (float[3,4] x, float[1,2,5,5] y) => (float[3,2] out, float[1,4,10,10] up)
<)" + bn("n", 4, 21.0) + ", " + floats("wg", {3, 4}, 22.0) + R"(, float[3] cg = {0.5, 1, 1.5},
float[3] sg = {2, -1, 0.5}, )" + floats("wh", {3, 2}, 23.0) + R"(, float[3] pre = {1, 2, 3},
)" + floats("wt", {2, 2, 2, 2}, 24.0) + R"(, float[4,1,1] st = {1, 0.5, 2, -1}>
{
  xn = BatchNormalization (x, ns, nb, nm, nv)
  g1 = Gemm <transB = 1, beta = 0.5> (xn, wg, cg)
  g1s = Mul (g1, sg)
  g1m = Mul (g1s, sg)
  g1r = Relu (g1m)
  g1p = Mul (g1r, pre)
  out = Gemm (g1p, wh)
  kt = Constant <value = float[1,4,1,1] {0.25, 0.5, 0.75, 1}> ()
  t = ConvTranspose <group = 2, strides = [2,2]> (y, wt)
  tb = Add (t, kt)
  up = Mul (tb, st)
}
)";
}

}  // namespace

TEST_CASE("fold is idempotent and deterministic on every sample model", "[idempotence]") {
  std::vector<std::string> models;
  for (const auto& entry : fs::directory_iterator(sourceDir() + "/models"))
    if (entry.path().extension() == ".onnx") models.push_back(entry.path().string());
  std::sort(models.begin(), models.end());
  REQUIRE_FALSE(models.empty());
  for (const std::string& model : models) {
    DYNAMIC_SECTION(fs::path(model).filename().string()) {
      TempDir dir;
      checkIdempotentAndDeterministic(model, "default", dir);
    }
  }
}

TEST_CASE("fold is idempotent and deterministic when every rule has work", "[idempotence]") {
  const std::vector<std::pair<std::string, std::string>> models = {{"every-rule", everyRuleModel()},
                                                                   {"layers", layersModel()}};
  for (const auto& [name, text] : models) {
    for (const char* rules : {"default", "+bn-decompose"}) {
      DYNAMIC_SECTION(name << " --rules " << rules) {
        TempDir dir;
        const std::string input = dir.file("input.onnx");
        writeTextModel(text, input);
        const Runs runs = checkIdempotentAndDeterministic(input, rules, dir);
        // The first run did real work, and the result still computes the same function.
        CHECK(rewrites(runs.first) >= 6);
        const OrtComparison comparison = compareInOrt(input, dir.file("once.onnx"), 1e-4, 1e-4);
        INFO(comparison.error);
        CHECK(comparison.ok);
      }
    }
  }
}

TEST_CASE("the every-rule model exercises each default rule", "[idempotence]") {
  TempDir dir;
  const std::string input = dir.file("input.onnx");
  writeTextModel(everyRuleModel(), input);
  const nlohmann::json report = fold(input, dir.file("out.onnx"), dir.file("out.json"), "default");
  std::set<std::string> rulesSeen;
  for (const char* section : kReportSections)
    if (std::string(section) != "skipped" && report.contains(section))
      for (const auto& entry : report[section]) rulesSeen.insert(entry.value("rule", ""));
  for (const char* rule : {"bn-fold", "bn-forward", "bias-add", "scale-fold", "train-bn-expand"}) {
    INFO("rule " << rule << " in " << report.dump(1));
    CHECK(rulesSeen.count(rule) == 1);
  }
  // The entries (including bn-forward's `folds` entry with direction "forward") follow the report schema.
  std::string out;
  const int valid = validateReports({dir.file("out.json")}, &out);
  INFO(out);
  CHECK(valid == 0);
  // Left alone: the [C] Add (runs along W) and the BNs after a Relu in front of a padded Conv.
  auto model = loadModel(dir.file("out.onnx"));
  CHECK(model->graph().findLocal("trap")->producer()->opType() == "Add");
  CHECK(countOps(*model, "BatchNormalization") == 2);
}
