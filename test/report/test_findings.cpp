// The findings API (bnfold/check/findings.h): a library user gets the same answers as `bnfold check`.

#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "bnfold/error.h"
#include "bnfold/check/findings.h"
#include "test_support.h"

using bnfold::test::TempDir;

namespace {

// A foldable BN, a training-mode BN, a BN after Relu that nothing folds, one kept by name, a bias Add, and a
// graph stored out of order (the Relu before the Add it reads).
constexpr const char* kModelText = R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,4,4] x) => (float[1,2,4,4] y, float[1,2,4,4] t, float[1,2,4,4] k, float[1,2,4,4] a)
<float[2,2,1,1] w = {1, 0, 0, 1}, float[2] s = {2, 3}, float[2] b = {0.5, 1}, float[2] m = {0.1, 0.2},
 float[2] v = {1, 4}, float[2,1,1] bias = {0.25, -0.25}>
{
  r = Relu (a)
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
  t, tm, tv = BatchNormalization <training_mode = 1> (x, s, b, m, v)
  u = BatchNormalization (r, s, b, m, v)
  c2 = Conv (x, w)
  k = BatchNormalization (c2, s, b, m, v)
  c3 = Conv (x, w)
  a = Add (c3, bias)
}
)ONNX";

using Answer = std::tuple<std::string, std::string, std::string, std::string>;  // category, severity, node, message

std::vector<Answer> answersOf(const std::vector<bnfold::Finding>& findings) {
  std::vector<Answer> answers;
  for (const auto& finding : findings)
    answers.emplace_back(finding.category, bnfold::severityName(finding.severity), finding.node, finding.message);
  return answers;
}

}  // namespace

TEST_CASE("findingsOf gives a library user what bnfold check reports", "[report][findings]") {
  onnx::ModelProto proto = bnfold::test::parseModelProto(kModelText);
  // Names for the nodes, so findings can be told apart (the text syntax has none).
  for (int i = 0; i < proto.graph().node_size(); ++i) proto.mutable_graph()->mutable_node(i)->set_name("n" + std::to_string(i));
  TempDir dir;
  const std::string path = dir.file("m.onnx");
  {
    std::ofstream out(path, std::ios::binary);
    REQUIRE(proto.SerializeToOstream(&out));
  }
  const std::string failOnText = "foldable-bn,unfoldable-bn";

  auto model = bnfold::loadModel(path);
  bnfold::Report report;
  report.setReorderedGraphs(model->reorderedGraphs());
  bnfold::DriverOptions options;
  options.rules = bnfold::parseRuleSelection("default");
  options.ruleOptions.keepNodes = {"n6"};
  bnfold::runRules(*model, options, report);
  const auto findings = bnfold::findingsOf(*model, report, bnfold::parseFailOn(failOnText));

  std::string out, err;
  const int code = bnfold::test::runCommand(
      bnfold::test::cli("check " + path + " --keep n6 --format json --fail-on " + failOnText), &out, &err);
  REQUIRE(code == 1);
  const auto document = nlohmann::json::parse(out);
  std::vector<Answer> fromCheck;
  for (const auto& finding : document["models"][0]["findings"])
    fromCheck.emplace_back(finding["category"], finding["severity"], finding.value("node", ""), finding["message"]);
  CHECK(answersOf(findings) == fromCheck);

  // And the answers are the ones this model calls for.
  auto categoryOf = [&](const std::string& node) {
    for (const auto& finding : findings)
      if (finding.node == node) return finding.category + "/" + bnfold::severityName(finding.severity);
    return std::string("none");
  };
  CHECK(categoryOf("n2") == "foldable-bn/error");
  CHECK(categoryOf("n3") == "training-bn/warning");
  CHECK(categoryOf("n4") == "unfoldable-bn/error");
  CHECK(categoryOf("n6") == "kept-bn/warning");
  CHECK(categoryOf("n8") == "bias-add/warning");
  CHECK(findings.front().category == "unsorted-graph");
}

TEST_CASE("parseFailOn takes category names, all and none, and names an unknown category", "[report][findings]") {
  CHECK(bnfold::parseFailOn(bnfold::kDefaultFailOn) == std::set<std::string>{"foldable-bn", "training-bn"});
  CHECK(bnfold::parseFailOn("all").size() == bnfold::findingCategories().size());
  CHECK(bnfold::parseFailOn("all, none , bias-add") == std::set<std::string>{"bias-add"});
  CHECK_THROWS_WITH(bnfold::parseFailOn("foldable-bn,folded-bn"),
                    Catch::Contains("unknown category 'folded-bn'") && Catch::Contains("invalid-model"));
}

TEST_CASE("a model that cannot be read is an invalid-model finding that always fails", "[report][findings]") {
  const bnfold::Finding finding = bnfold::invalidModelFinding("m.onnx: not an ONNX model");
  CHECK(finding.category == "invalid-model");
  CHECK(finding.severity == bnfold::Severity::Error);
  CHECK(finding.message == "m.onnx: not an ONNX model");
}

TEST_CASE("bnfold check --help lists every finding category of the library", "[report][findings][cli]") {
  std::string out, err;
  REQUIRE(bnfold::test::runCommand(bnfold::test::cli("check --help"), &out, &err) == 0);
  for (const auto& category : bnfold::findingCategories()) {
    INFO(category.name);
    CHECK_THAT(out, Catch::Contains(std::string("  ") + category.name + " "));
  }
}
