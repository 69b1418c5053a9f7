// Opsets a rule does not know (issue: "Opsets a rule does not know"): the table of op versions agrees with
// libonnx's schemas, every rule declares versions from it, and a model from a newer opset than bnfold knows is
// left alone with unsupported-opset rather than rewritten with the forms of an older one.

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include <onnx/defs/schema.h>

#include "bnfold/check/fold.h"
#include "rewrite/op_versions.h"
#include "test_bn_fold_support.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;

namespace {

std::vector<int64_t> tableVersions(const std::string& op) {
  for (const OpVersions& known : knownOpVersions())
    if (known.op == op) return known.versions;
  return {};
}

// A Conv + BN to fold, and a training-mode BN whose expansion needs ReduceMean (whose form changed at 18).
std::string modelAtOpset(int64_t opset) {
  return R"(<ir_version: 8, opset_import: ["" : )" + std::to_string(opset) + R"(]>
g (float[1,2,3,3] x) => (float[1,2,3,3] y, float[1,2,3,3] t)
<float[2,2,1,1] w = {1, 0, 0, 1}, float[2] s = {1, 2}, float[2] b = {0.5, 1}, float[2] m = {0.1, 0.2},
 float[2] v = {1, 4}>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
  t, tm, tv = BatchNormalization <training_mode = 1> (x, s, b, m, v)
}
)";
}

}  // namespace

TEST_CASE("op versions: the table agrees with libonnx's schemas for every opset libonnx knows", "[opset-versions]") {
  const auto& registry = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  const int64_t libonnxNewest = registry.at("").second;
  INFO("libonnx knows ai.onnx opsets through " << libonnxNewest);
  REQUIRE(libonnxNewest >= 15);
  REQUIRE(libonnxNewest <= kNewestKnownOpset);
  for (const OpVersions& known : knownOpVersions()) {
    CHECK(std::is_sorted(known.versions.begin(), known.versions.end()));
    for (int64_t opset = 1; opset <= libonnxNewest; ++opset) {
      const onnx::OpSchema* schema = onnx::OpSchemaRegistry::Schema(known.op, static_cast<int>(opset), "");
      INFO(known.op << " at opset " << opset);
      if (!schema) {
        CHECK_FALSE(opVersionAt(known.op, opset).has_value());
      } else {
        CHECK(opVersionAt(known.op, opset) == std::optional<int64_t>(schema->since_version()));
      }
    }
  }
  CHECK_FALSE(opVersionAt("BatchNormalization", kNewestKnownOpset + 1).has_value());
  CHECK_FALSE(opVersionAt("NoSuchOp", 13).has_value());
}

TEST_CASE("op versions: every rule declares real versions of ops in the table", "[opset-versions]") {
  for (const auto& rule : builtinRules()) {
    const auto declared = rule->opVersions();
    INFO(rule->name());
    CHECK_FALSE(declared.empty());
    for (const std::string& root : rule->rootOps())
      CHECK(std::any_of(declared.begin(), declared.end(), [&](const OpVersions& op) { return op.op == root; }));
    for (const OpVersions& op : declared) {
      INFO(op.op);
      const auto real = tableVersions(op.op);
      REQUIRE_FALSE(real.empty());
      CHECK(std::is_sorted(op.versions.begin(), op.versions.end()));
      for (int64_t version : op.versions) CHECK(std::count(real.begin(), real.end(), version) == 1);
    }
  }
}

TEST_CASE("op versions: which rules work at which opset", "[opset-versions]") {
  for (const auto& rule : builtinRules()) {
    const std::string name = rule->name();
    // Add and Mul broadcast numpy-style from opset 7; before it bias-add and scale-fold do not read them.
    const bool needsNumpyBroadcast = name == "bias-add" || name == "scale-fold";
    for (int64_t opset = 1; opset <= kNewestKnownOpset; ++opset) {
      INFO(name << " at opset " << opset);
      const auto problem = opsetProblem(rule->opVersions(), opset, "rule " + name);
      CHECK(problem.has_value() == (needsNumpyBroadcast && opset < 7));
      if (problem) CHECK_THAT(*problem, Catch::Contains("-" + std::to_string(opset < 6 ? 1 : 6)));
    }
    const auto future = opsetProblem(rule->opVersions(), kNewestKnownOpset + 1, "rule " + name);
    REQUIRE(future.has_value());
    CHECK_THAT(*future, Catch::Contains(std::to_string(kNewestKnownOpset + 1)));
  }
}

TEST_CASE("op versions: an op version a component was not written for is named", "[opset-versions]") {
  // A component that knows Add only up to version 13 meets opset 14's Add-14.
  const auto problem = opsetProblem({{"Add", {7, 13}}}, 14, "the test component");
  REQUIRE(problem.has_value());
  CHECK_THAT(*problem, Catch::Contains("Add-14") && Catch::Contains("the test component") &&
                           Catch::Contains("7, 13"));
  CHECK_FALSE(opsetProblem({{"Add", {7, 13}}}, 13, "the test component").has_value());
  // An op that does not exist yet at the opset is nothing to misread.
  CHECK_FALSE(opsetProblem({{"Expand", {8, 13}}}, 7, "the test component").has_value());
}

TEST_CASE("op versions: a model of a future opset is left alone, with the opset named", "[opset-versions]") {
  for (int64_t opset : {kNewestKnownOpset + 1, int64_t{99999}}) {
    DYNAMIC_SECTION("opset " << opset) {
      auto model = parseModel(modelAtOpset(opset));
      const std::string before = opSequence(model->graph());
      Report report = applyRules(*model, parseRuleSelection("all"));
      INFO(report.dump());
      CHECK(opSequence(model->graph()) == before);  // no BN folded, no ReduceMean emitted
      for (const char* section : {"folds", "expanded", "decomposed", "frozen", "bias_absorbed", "scale_folded"})
        CHECK(report.section(section).empty());
      REQUIRE(report.section("skipped").size() == 2);
      for (const auto& entry : report.section("skipped")) {
        CHECK(entry.at("reason") == "unsupported-opset");
        CHECK_THAT(entry.at("message").get<std::string>(), Catch::Contains(std::to_string(opset)) &&
                                                              Catch::Contains(std::to_string(kNewestKnownOpset)));
        for (const auto& detail : entry.at("details")) CHECK(detail.at("reason") == "unsupported-opset");
      }
    }
  }
  SECTION("the same model at the newest known opset is rewritten") {
    auto model = parseModel(modelAtOpset(kNewestKnownOpset));
    Report report = applyRules(*model, parseRuleSelection("default"));
    INFO(report.dump());
    CHECK(report.section("folds").size() == 1);
    CHECK(report.section("expanded").size() == 1);
    CHECK(countOps(*model, "BatchNormalization") == 0);
  }
}

TEST_CASE("op versions: the CLI leaves a future-opset model unchanged and says why", "[opset-versions][cli]") {
  TempDir dir;
  const std::string input = dir.path() + "/future.onnx";
  std::string bytes;
  REQUIRE(parseModelProto(modelAtOpset(99999)).SerializeToString(&bytes));
  writeFile(input, bytes);
  std::string out, err;
  const int status = runCommand(cli("check " + input + " --fail-on none"), &out, &err);
  INFO(out << err);
  CHECK(status == 0);
  CHECK_THAT(out, Catch::Contains("unsupported-opset") && Catch::Contains("99999"));
  CHECK(readFile(input) == bytes);
}
