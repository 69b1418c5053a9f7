// relu6-to-relu: Clip(0, 6) between two layers replaced with Relu, only when asked for, because it changes the
// function. ONNX Runtime shows where: nowhere while the first layer's output stays at or below 6, and by at most the
// excess above 6 where it does not. Every node left alone is left quietly (Clips are common).

#include <catch2/catch.hpp>
#include <filesystem>

#include "bnfold/io/model_io.h"
#include "test_bn_fold_support.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;
using json = nlohmann::json;

namespace {

constexpr double kTol = 1e-4;

std::string header(int opset = 13) { return "<ir_version: 8, opset_import: [\"\" : " + std::to_string(opset) + "]>\n"; }

/// x (uniform in [-1, 1) in ONNX Runtime) -> Conv with weight k * I -> ReLU6 -> Conv with weight I: the output is
/// ReLU6(k x) element for element, so with k <= 6 no value reaches above 6.
std::string identityPair(double k, const std::string& clip, int opset = 13, const std::string& extraInits = "") {
  const std::string kText = std::to_string(k);
  return header(opset) + R"(g (float[1,3,4,4] x) => (float[1,3,4,4] y)
<float[3,3,1,1] w1 = {)" + kText + ",0,0, 0," + kText + ",0, 0,0," + kText + R"(},
 float[3,3,1,1] w2 = {1,0,0, 0,1,0, 0,0,1}, float lo = {0}, float hi = {6})" + extraInits + R"(>
{
  c1 = Conv (x, w1)
  )" + clip + R"(
  y = Conv (r1, w2)
}
)";
}

const json& onlyEntry(const Report& report, const std::string& section) {
  INFO(report.dump());
  REQUIRE(report.section(section).size() == 1);
  return report.section(section)[0];
}

}  // namespace

TEST_CASE("relu6-to-relu: Clip(0, 6) between two layers becomes Relu, and equalize then reaches the link",
          "[relu6]") {
  // w1's output channels span three orders of magnitude, as after a BN fold.
  const std::vector<double> rowScale = {100, 1, 0.1, 30, 2, 0.05, 8, 0.5};
  std::vector<double> w1 = sampleValues(216, 300.0);
  for (std::size_t i = 0; i < w1.size(); ++i) w1[i] *= rowScale[i / 27];
  auto model = parseModel(header() + R"(g (float[1,3,6,6] x) => (float[1,8,6,6] y)
<)" + tensorText("float", "w1", {8, 3, 3, 3}, asFloats(w1)) +
                          ", " + tensorText("float", "w2", {8, 8, 1, 1}, asFloats(sampleValues(64, 301.0))) + R"(,
 float lo = {0}, float hi = {6}>
{
  c1 = Conv <pads = [1,1,1,1]> (x, w1)
  r1 = Clip (c1, lo, hi)
  y = Conv (r1, w2)
}
)");
  const Report report = applyRules(*model, {"relu6-to-relu", "equalize"});
  CHECK(opSequence(model->graph()) == "Conv,Relu,Conv");
  const json& entry = onlyEntry(report, "relu6_replaced");
  CHECK(entry["node"] == "Clip_0");
  CHECK(entry["layer"] == "Conv_0");
  CHECK(entry["readers"] == json::array({"Conv_1"}));
  CHECK(entry["warning"].get<std::string>().find("CHANGES THE FUNCTION") != std::string::npos);
  // --verify does not call it exact: it checks it only where the layer's output stays in [-6, 6), and says so.
  REQUIRE(entry.contains("verify"));
  CHECK(entry["verify"]["passed"] == true);
  REQUIRE(entry["verify"]["assumptions"].size() == 1);
  CHECK(entry["verify"]["assumptions"][0]["value"] == "c1");
  CHECK(entry["verify"]["assumptions"][0]["statement"] == entry["warning"]);
  CHECK(entry["verify"]["assumptions"][0]["sampled"].get<std::string>().find("[0, 12)") != std::string::npos);
  const json& link = onlyEntry(report, "equalized");
  CHECK(link["layer1"] == "Conv_0");
  CHECK(link["activation"] == "Relu");
}

TEST_CASE("relu6-to-relu: ONNX Runtime agrees while the layer's output stays at or below 6, and differs only by "
          "the excess above it",
          "[relu6]") {
  SECTION("k = 5: every value below 6, the same function") {
    auto model = parseModel(identityPair(5.0, "r1 = Clip (c1, lo, hi)"));
    FoldOutcome outcome = applyRulesAndCompare(*model, {"relu6-to-relu"}, kTol, kTol);
    CHECK(opSequence(model->graph()) == "Conv,Relu,Conv");
    INFO(outcome.comparison.error << outcome.comparison.details.dump());
    CHECK(outcome.comparison.ok);
    CHECK(outcome.comparison.maxAbs == 0.0);
  }
  SECTION("k = 10: values up to 10, changed by at most 10 - 6") {
    auto model = parseModel(identityPair(10.0, "r1 = Clip (c1, lo, hi)"));
    FoldOutcome outcome = applyRulesAndCompare(*model, {"relu6-to-relu"}, kTol, kTol);
    CHECK(opSequence(model->graph()) == "Conv,Relu,Conv");
    INFO(outcome.comparison.error << outcome.comparison.details.dump());
    CHECK_FALSE(outcome.comparison.ok);  // the comparison ran and found the outputs differ
    CHECK(outcome.comparison.details.dump().find("outside tolerance") != std::string::npos);
    CHECK(outcome.comparison.maxAbs > 0.5);
    CHECK(outcome.comparison.maxAbs <= 4.0 + 1e-5);
    // --verify passed: it compared where the assumption holds, and the entry says what that is.
    CHECK(onlyEntry(outcome.report, "relu6_replaced")["verify"]["passed"] == true);
  }
  SECTION("Clip-6 with min and max attributes (opset 10)") {
    auto model = parseModel(identityPair(5.0, "r1 = Clip <min = 0.0, max = 6.0> (c1)", 10));
    FoldOutcome outcome = applyRulesAndCompare(*model, {"relu6-to-relu"}, kTol, kTol);
    CHECK(opSequence(model->graph()) == "Conv,Relu,Conv");
    CHECK(outcome.comparison.ok);
  }
}

TEST_CASE("relu6-to-relu: other Clips, and Clips not between layers, are left alone quietly", "[relu6]") {
  auto leftAlone = [](const std::string& text) {
    auto model = parseModel(text);
    const std::string before = opSequence(model->graph());
    const Report report = applyRules(*model, {"relu6-to-relu"});
    CHECK(report.rewriteCount() == 0);
    CHECK(opSequence(model->graph()) == before);
    CHECK(report.section("relu6_replaced").empty());
  };
  // Other bounds.
  leftAlone(identityPair(5.0, "r1 = Clip (c1, lo, five)", 13, ", float five = {5}"));
  leftAlone(identityPair(5.0, "r1 = Clip (c1, hi, hi)"));
  leftAlone(identityPair(5.0, "r1 = Clip (c1, lo)"));  // no max: Relu already in effect, not a ReLU6
  // Read by something that is not a layer.
  leftAlone(header() + R"(g (float[1,3,4,4] x) => (float[1,3,4,4] y)
<float[3,3,1,1] w1 = {1,0,0, 0,1,0, 0,0,1}, float lo = {0}, float hi = {6}>
{
  c1 = Conv (x, w1)
  r1 = Clip (c1, lo, hi)
  y = Add (r1, x)
}
)");
  // Not after a layer.
  leftAlone(header() + R"(g (float[1,3,4,4] x) => (float[1,3,4,4] y)
<float[3,3,1,1] w2 = {1,0,0, 0,1,0, 0,0,1}, float lo = {0}, float hi = {6}>
{
  r1 = Clip (x, lo, hi)
  y = Conv (r1, w2)
}
)");
}

TEST_CASE("relu6-to-relu: the flag needs --equalize, and without it equalize stops at the ReLU6", "[relu6][cli]") {
  TempDir dir;
  auto model = parseModel(identityPair(5.0, "r1 = Clip (c1, lo, hi)"));
  saveModel(*model, dir.file("m.onnx"));
  std::string out, err;
  CHECK(runCommand(cli("fold " + dir.file("m.onnx") + " -o " + dir.file("o.onnx") + " --relu6-to-relu"), &out,
                   &err) == 2);
  CHECK(err.find("--relu6-to-relu needs --equalize") != std::string::npos);
  CHECK(runCommand(cli("fold " + dir.file("m.onnx") + " -o " + dir.file("o.onnx") + " --rules +relu6-to-relu"), &out,
                   &err) == 2);
  CHECK_FALSE(std::filesystem::exists(dir.file("o.onnx")));
  // --equalize alone leaves the Clip, with its reason.
  REQUIRE(runCommand(cli("fold " + dir.file("m.onnx") + " -o " + dir.file("o.onnx") + " --equalize --report " +
                         dir.file("e.json")),
                     &out, &err) == 0);
  const json plain = json::parse(readFile(dir.file("e.json")));
  CHECK_FALSE(plain.contains("relu6_replaced"));
  REQUIRE(plain.at("not_equalized").size() == 1);
  CHECK(plain["not_equalized"][0]["reason"] == "non-homogeneous-activation");
  // Both flags: replaced, verified under its assumption, the report in the schema.
  REQUIRE(runCommand(cli("fold " + dir.file("m.onnx") + " -o " + dir.file("o.onnx") +
                         " --equalize --relu6-to-relu --verify --report " + dir.file("r.json")),
                     &out, &err) == 0);
  const json report = json::parse(readFile(dir.file("r.json")));
  INFO(report.dump());
  CHECK(report.at("relu6_replaced").size() == 1);
  CHECK(report["verification"]["failed"] == 0);
  out.clear();
  CHECK(validateReports({dir.file("r.json")}, &out) == 0);
  INFO(out);
  CHECK(out.empty());
}
