// Which report sections list rewrites and which list nodes left alone (Report::sectionKind): every rule's
// failureSection and every section of the schema are classified, and a model whose only entries say what was left
// alone counts as unchanged in the CLI (--in-place leaves the file, the summary counts no rewrite, check finds nothing).

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "bnfold/report/report.h"
#include "bnfold/rules/builtin_rules.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
using nlohmann::json;

namespace {

// A PyTorch-style LayerNorm chain at opset 14: norm-fuse (on by default) leaves it with a reason, as
// LayerNormalization needs opset 17, and no other rule has anything to do.
const char* kLayerNormChainOpset14 = R"(
<ir_version: 8, opset_import: ["" : 14]>
layer_norm_chain (float[2,4,8] x) => (float[2,4,8] y)
<float two = {2}, float eps = {1e-5}, float[8] gamma = {1, 2, 3, 4, 5, 6, 7, 8},
 float[8] beta = {0.5, 0.5, 0.5, 0.5, -0.5, -0.5, -0.5, -0.5}>
{
  mean = ReduceMean <axes = [-1]> (x)
  d = Sub (x, mean)
  sq = Pow (d, two)
  var = ReduceMean <axes = [-1]> (sq)
  ve = Add (var, eps)
  s = Sqrt (ve)
  n = Div (d, s)
  g = Mul (n, gamma)
  y = Add (g, beta)
}
)";

std::string writeModel(const TempDir& dir, const std::string& name, const std::string& onnxText) {
  std::string bytes;
  REQUIRE(parseModelProto(onnxText).SerializeToString(&bytes));
  const std::string path = dir.file(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

}  // namespace

TEST_CASE("report sections: every rule's failureSection lists nodes left alone", "[report][sections]") {
  std::size_t withFailureSection = 0;
  for (const auto& rule : builtinRules()) {
    const char* section = rule->failureSection();
    if (!section) continue;
    ++withFailureSection;
    INFO("rule " << rule->name() << ", section " << section);
    CHECK(Report::sectionKind(section) == SectionKind::LeftAlone);
  }
  CHECK(withFailureSection > 0);  // the check above looked at something
}

TEST_CASE("report sections: every array section of the schema is classified as the table says", "[report][sections]") {
  const json schema = json::parse(readFile(sourceDir() + "/schema/report.schema.json"));
  std::size_t arrays = 0;
  for (const auto& [key, property] : schema.at("properties").items()) {
    const bool isArray = (property.contains("type") && property.at("type") == "array") || property.contains("$ref");
    if (!isArray) continue;
    ++arrays;
    INFO("section " << key);
    // Left-alone sections are named "skipped", "not_..." or "..._not_...", rewrite sections are not.
    const bool namedLeftAlone =
        key == "skipped" || key.rfind("not_", 0) == 0 || key.find("_not_") != std::string::npos;
    if (key == "rules" || key == kReorderedSection)
      CHECK(Report::sectionKind(key) == SectionKind::Other);
    else
      CHECK(Report::sectionKind(key) == (namedLeftAlone ? SectionKind::LeftAlone : SectionKind::Rewrites));
  }
  CHECK(arrays > 10);
}

TEST_CASE("report sections: entries of left-alone sections are not rewrites", "[report][sections]") {
  Report report;
  for (const char* section : {"skipped", "not_equalized", "high_bias_not_absorbed", "norms_not_fused",
                              "norms_not_decomposed", "norm_affine_not_forwarded"})
    report.add(section, json{{"node", "n"}, {"reason", "opset-too-old"}});
  CHECK(report.rewriteCount() == 0);
  report.add("norms_fused", json{{"node", "n"}, {"rule", "norm-fuse"}});
  CHECK(report.rewriteCount() == 1);
  // A section a newer rule adds lists rewrites unless the table says otherwise.
  report.add("some_future_rewrite", json{{"node", "n"}, {"rule", "future"}});
  CHECK(report.rewriteCount() == 2);
}

TEST_CASE("fold --in-place leaves a model whose norm chain was only left alone, and counts no rewrite",
          "[report][sections][cli]") {
  TempDir dir;
  const std::string model = writeModel(dir, "layer_norm_chain.onnx", kLayerNormChainOpset14);
  const std::string before = readFile(model);
  std::string out, err;
  REQUIRE(runCommand(cli("fold " + model + " --in-place --backup-suffix .bak"), &out, &err) == 0);
  INFO(err);
  const json report = json::parse(readFile(dir.file("layer_norm_chain.report.json")));
  INFO(report.dump(1));
  REQUIRE(report.at("norms_not_fused").size() == 1);  // what the test is about: the chain left alone
  CHECK(report.value("norms_fused", json::array()).empty());
  CHECK(readFile(model) == before);
  CHECK_FALSE(std::filesystem::exists(model + ".bak"));  // nothing replaced, so nothing backed up
  CHECK_THAT(err, Catch::Contains("unchanged " + model + ": 0 BN folded, 0 expanded, 0 skipped, 0 other rewrites"));

  // check: nothing to report, whatever --fail-on asks for.
  REQUIRE(runCommand(cli("check " + model + " --fail-on all"), &out, &err) == 0);
  INFO(out);
  CHECK_THAT(out, Catch::Contains("1 clean") && Catch::Contains("0 findings"));
}
