// norm-decompose (off by default): LayerNormalization, RMSNormalization, GroupNormalization-18/-21 and
// InstanceNormalization become the primitive ops of their ONNX function bodies, in the model's opset form. Each
// case runs with --verify (the reference kernels of lib/verify) and compares original and rewritten model in ONNX
// Runtime, every graph output included (the statistics outputs too).

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "bnfold/rules/builtin_rules.h"
#include "test_bn_fold_support.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
using namespace bnfold::test::bnfold_cases;

namespace {

const std::vector<std::string> kRule{"norm-decompose"};

std::string floats(const std::string& name, const std::vector<int64_t>& dims, double seed, double lo = -2.0,
                   double hi = 2.0) {
  std::size_t count = 1;
  for (int64_t d : dims) count *= static_cast<std::size_t>(d);
  return tensorText("float", name, dims, asFloats(sampleValues(count, seed, lo, hi)));
}

/// Decomposes `text`, checks ORT agrees within atol, that no normalization is left and returns the outcome.
FoldOutcome decompose(const std::string& text, double atol = 1e-5) {
  auto model = parseModel(text);
  FoldOutcome outcome = applyRulesAndCompare(*model, kRule, atol, 1e-4);
  INFO(outcome.comparison.error << " " << outcome.comparison.details.dump());
  CHECK(outcome.comparison.ok);
  for (const char* op : {"LayerNormalization", "RMSNormalization", "GroupNormalization", "InstanceNormalization"})
    CHECK(countOps(*model, op) == 0);
  REQUIRE(outcome.report.section("norms_decomposed").size() == 1);
  CHECK(outcome.report.section("norms_decomposed")[0]["verify"]["passed"] == true);
  return outcome;
}

std::vector<std::string> emittedOps(const FoldOutcome& outcome) {
  return outcome.report.section("norms_decomposed")[0]["ops"].get<std::vector<std::string>>();
}

const nlohmann::json& onlyFailure(const Report& report) {
  const auto& failures = report.section("norms_not_decomposed");
  REQUIRE(failures.size() == 1);
  return failures[0];
}

}  // namespace

TEST_CASE("norm-decompose: LayerNormalization over the last axis, with bias", "[norm-decompose]") {
  const auto outcome = decompose(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,4] x) => (float[2,3,4] y)
<)" + floats("s", {4}, 1.0) + ", " + floats("b", {4}, 2.0) + R"(>
{
  y = LayerNormalization <epsilon = 0.001> (x, s, b)
}
)");
  const auto& entry = outcome.report.section("norms_decomposed")[0];
  CHECK(entry["op"] == "LayerNormalization");
  CHECK(entry["rule"] == "norm-decompose");
  CHECK(entry["axes"] == nlohmann::json::array({-1}));
  CHECK(entry["epsilon"].get<double>() == Approx(0.001));
  CHECK(entry["stash_type"] == "float");
  CHECK(entry["statistics_outputs"].empty());
  CHECK(emittedOps(outcome) == std::vector<std::string>{"ReduceMean", "Sub", "Mul", "ReduceMean", "Add", "Sqrt",
                                                         "Reciprocal", "Mul", "Mul", "Add"});
}

TEST_CASE("norm-decompose: LayerNormalization from a positive axis, no bias, Mean and InvStdDev read",
          "[norm-decompose]") {
  const auto outcome = decompose(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3,4] x) => (float[2,3,4] y, float[2,1,1] mean, float[2,1,1] inv)
<)" + floats("s", {3, 4}, 3.0) + R"(>
{
  y, mean, inv = LayerNormalization <axis = 1> (x, s)
}
)");
  const auto& entry = outcome.report.section("norms_decomposed")[0];
  CHECK(entry["axes"] == nlohmann::json::array({1, 2}));
  CHECK(entry["statistics_outputs"] == nlohmann::json::array({"Mean", "InvStdDev"}));
  CHECK(emittedOps(outcome).back() == "Mul");  // no bias, no Add
}

TEST_CASE("norm-decompose: opset 18 writes ReduceMean's axes as an input", "[norm-decompose]") {
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 18]>
g (float[3,5] x) => (float[3,5] y)
<)" + floats("s", {5}, 4.0) + ", " + floats("b", {5}, 5.0) + R"(>
{
  y = LayerNormalization <epsilon = 0.1> (x, s, b)
}
)");
  const auto outcome = applyRulesAndCompare(*model, kRule, 1e-5, 1e-4);
  CHECK(outcome.comparison.ok);
  const Node* reduce = findNode(model->graph(), "ReduceMean");
  REQUIRE(reduce);
  CHECK(reduce->inputs().size() == 2);
  CHECK_FALSE(reduce->hasAttribute("axes"));
}

TEST_CASE("norm-decompose: float16 LayerNormalization computes in its float stash_type", "[norm-decompose]") {
  const auto outcome = decompose(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float16[2,8] x, float16[8] s, float16[8] b) => (float16[2,8] y)
{
  y = LayerNormalization (x, s, b)
}
)", 1e-2);
  const auto ops = emittedOps(outcome);
  CHECK(ops.front() == "Cast");
  CHECK(std::count(ops.begin(), ops.end(), "Cast") == 2);
  CHECK(outcome.report.section("norms_decomposed")[0]["stash_type"] == "float");
}

TEST_CASE("norm-decompose: RMSNormalization over the last two axes", "[norm-decompose]") {
  const auto outcome = decompose(R"(<ir_version: 10, opset_import: ["" : 23]>
g (float[2,3,4] x) => (float[2,3,4] y)
<)" + floats("s", {3, 4}, 6.0) + R"(>
{
  y = RMSNormalization <axis = -2, epsilon = 0.01> (x, s)
}
)");
  CHECK(emittedOps(outcome) ==
        std::vector<std::string>{"Mul", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul", "Mul"});
  CHECK(outcome.report.section("norms_decomposed")[0]["axes"] == nlohmann::json::array({-2, -1}));
}

TEST_CASE("norm-decompose: GroupNormalization-18 with per-group scale and bias", "[norm-decompose]") {
  const auto outcome = decompose(R"(<ir_version: 8, opset_import: ["" : 18]>
g (float[2,6,3,3] x) => (float[2,6,3,3] y)
<)" + floats("s", {3}, 7.0) + ", " + floats("b", {3}, 8.0) + R"(>
{
  y = GroupNormalization <num_groups = 3, epsilon = 0.001> (x, s, b)
}
)");
  const auto& entry = outcome.report.section("norms_decomposed")[0];
  CHECK(entry["num_groups"] == 3);
  const auto ops = emittedOps(outcome);
  CHECK(ops.front() == "Reshape");
  CHECK(ops.back() == "Reshape");  // the per-group affine comes before reshaping back
}

TEST_CASE("norm-decompose: GroupNormalization-21 with per-channel scale and bias, dynamic batch",
          "[norm-decompose]") {
  const auto outcome = decompose(R"(<ir_version: 10, opset_import: ["" : 21]>
g (float[N,4,5] x) => (float[N,4,5] y)
<)" + floats("s", {4}, 9.0) + ", " + floats("b", {4}, 10.0) + R"(>
{
  y = GroupNormalization <num_groups = 2> (x, s, b)
}
)");
  const auto ops = emittedOps(outcome);
  CHECK(ops.back() == "Add");
  CHECK(std::count(ops.begin(), ops.end(), "Unsqueeze") == 2);
}

TEST_CASE("norm-decompose: InstanceNormalization", "[norm-decompose]") {
  const auto outcome = decompose(R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[2,3,4,4] x) => (float[2,3,4,4] y)
<)" + floats("s", {3}, 11.0) + ", " + floats("b", {3}, 12.0) + R"(>
{
  y = InstanceNormalization <epsilon = 0.01> (x, s, b)
}
)");
  CHECK(outcome.report.section("norms_decomposed")[0]["axes"] == nlohmann::json::array({2, 3}));
}

TEST_CASE("norm-decompose refuses what it cannot write, with reasons", "[norm-decompose]") {
  SECTION("a positive axis of an input of unknown rank") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[] x, float[] s) => (float[] y)
{
  y = LayerNormalization <axis = 1> (x, s)
}
)");
    const Report report = applyRules(*model, kRule);
    CHECK(onlyFailure(report)["reason"] == "rank-unknown");
    CHECK(countOps(*model, "LayerNormalization") == 1);
  }
  SECTION("InstanceNormalization before opset 7") {
    auto model = parseModel(R"(<ir_version: 3, opset_import: ["" : 6]>
g (float[1,2,3] x, float[2] s, float[2] b) => (float[1,2,3] y)
{
  y = InstanceNormalization (x, s, b)
}
)");
    const Report report = applyRules(*model, kRule);
    CHECK(onlyFailure(report)["reason"] == "unsupported-opset");
    CHECK(countOps(*model, "InstanceNormalization") == 1);
  }
  SECTION("GroupNormalization with two unknown spatial dims") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 18]>
g (float[1,4,H,W] x, float[2] s, float[2] b) => (float[1,4,H,W] y)
{
  y = GroupNormalization <num_groups = 2> (x, s, b)
}
)");
    const Report report = applyRules(*model, kRule);
    CHECK(onlyFailure(report)["reason"] == "rank-unknown");
  }
  SECTION("an input whose element type is not known") {
    auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 17]>
g (x, float[4] s) => (y)
{
  y = LayerNormalization (x, s)
}
)");
    const Report report = applyRules(*model, kRule);
    CHECK(onlyFailure(report)["reason"] == "type-unknown");
  }
}

TEST_CASE("norm-decompose is off by default", "[norm-decompose]") {
  const auto defaults = parseRuleSelection("default");
  CHECK(std::find(defaults.begin(), defaults.end(), "norm-decompose") == defaults.end());
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4] x, float[4] s) => (float[2,4] y)
{
  y = LayerNormalization (x, s)
}
)");
  const Report report = applyRules(*model, parseRuleSelection("default"));
  CHECK(countOps(*model, "LayerNormalization") == 1);
}

TEST_CASE("norm-decompose: asked for with norm-fuse (--rules all), it wins and the two never undo each other",
          "[norm-decompose]") {
  auto has = [](const std::vector<std::string>& rules, const std::string& name) {
    return std::find(rules.begin(), rules.end(), name) != rules.end();
  };
  const std::vector<std::string> all = bnfold::parseRuleSelection("all");
  CHECK(has(all, "norm-decompose"));
  CHECK_FALSE(has(all, "norm-fuse"));
  CHECK_FALSE(has(bnfold::parseRuleSelection("+norm-decompose"), "norm-fuse"));
  CHECK(has(bnfold::parseRuleSelection("default"), "norm-fuse"));
}
