// The closed list of reason codes (bnfold/report/reason_codes.h): the list, the README's table and the report
// schema agree, and no rule emits a code outside the list on any model we have.

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bnfold/error.h"
#include "bnfold/io/model_io.h"
#include "bnfold/report/reason_codes.h"
#include "bnfold/report/report.h"
#include "bnfold/check/fold.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
namespace fs = std::filesystem;

namespace {

std::set<std::string> listedCodes() {
  std::set<std::string> codes;
  for (const ReasonCodeInfo& info : reasonCodes()) codes.insert(info.code.str());
  return codes;
}

/// The README's "### Reason codes" table: code -> meaning.
std::map<std::string, std::string> readmeTable() {
  const std::string readme = readFile(sourceDir() + "/README.md");
  const std::size_t start = readme.find("### Reason codes");
  REQUIRE(start != std::string::npos);
  const std::size_t end = readme.find("\n#", start + 1);
  const std::string section = readme.substr(start, end == std::string::npos ? std::string::npos : end - start);
  std::map<std::string, std::string> table;
  static const std::regex row(R"(\| `([a-z0-9-]+)` \| (.*) \|)");
  bool inTable = false;  // the first table only: the second maps format 1's spellings
  for (const std::string& line : lines(section)) {
    if (line.rfind("| reason code | meaning |", 0) == 0) inTable = true;
    else if (inTable && line.rfind("|", 0) != 0) break;
    std::smatch m;
    if (inTable && std::regex_match(line, m, row)) table[m[1]] = m[2];
  }
  return table;
}

/// Every reason code any rule gives for any node it is rooted at, in `model`, by code.
void collectCodes(Model& model, std::map<std::string, std::string>& seen, const std::string& where) {
  RuleOptions options;
  RuleContext context(model, options);
  std::vector<const Graph*> graphs{&model.graph()};
  for (std::size_t g = 0; g < graphs.size(); ++g) {
    for (const auto& node : graphs[g]->nodes()) {
      for (const SubgraphSlot& slot : node->subgraphs()) graphs.push_back(slot.graph.get());
      for (const auto& rule : builtinRules()) {
        const auto roots = rule->rootOps();
        if (!node->domain().empty() || std::find(roots.begin(), roots.end(), node->opType()) == roots.end())
          continue;
        MatchResult result = rule->match(*node, context);
        if (!result.matched()) seen.emplace(result.failure().code.str(), where + ": " + rule->name() + " on " +
                                                                             node->opType() + " '" + node->name() + "'");
      }
    }
  }
}

/// Small models where rules refuse for reasons the sample and conformance models rarely give.
const std::vector<std::string> kCraftedModels = {
    // A BN before a padded Conv (bn-forward: layer-pads-input), invalid variance, a shape mismatch.
    R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,4,4] x, float[2,2,3,3] wr) => (float[1,2,4,4] y, float[1,2,4,4] z, float[1,2,4,4] q, float[1,2,2,2] r)
<float[2,2,3,3] w = {1,0,1,0,1,0,1,0,1, 1,0,1,0,1,0,1,0,1, 1,0,1,0,1,0,1,0,1, 1,0,1,0,1,0,1,0,1},
 float[2] s = {1, 2}, float[2] b = {0.5, 1}, float[2] m = {0, 0}, float[2] v = {1, 1}, float[2] neg = {-1, -2},
 float[3] s3 = {1, 2, 3}>
{
  n = BatchNormalization (x, s, b, m, v)
  y = Conv <pads = [1, 1, 1, 1]> (n, w)
  c = Conv <pads = [1, 1, 1, 1]> (x, w)
  z = BatchNormalization (c, s, b, m, neg)
  c2 = Conv <pads = [1, 1, 1, 1]> (x, w)
  q = BatchNormalization (c2, s3, b, m, v)
  c3 = Conv (x, wr)
  r = BatchNormalization (c3, s, b, m, v)
}
)",
    // Unknown rank and type (an opaque op feeds the BN), a Mul with no constant, a Mul that may broadcast.
    R"(<ir_version: 8, opset_import: ["" : 15, "com.example" : 1]>
g (float[1,2,4,4] x, float[1,2,4,4] x2, float[2] sr) => (y, float[1,2,4,4] t, tm, tv, float[1,2,4,4] p, u)
<float[2,2,1,1] w = {1, 0, 0, 1}, float[2] s = {1, 2}, float[2] b = {0.5, 1}, float[2] m = {0, 0},
 float[2] v = {1, 1}, float[2,1,1] k = {2, 3}>
{
  o = com.example.Opaque (x)
  y = BatchNormalization (o, s, b, m, v)
  t, tm, tv = BatchNormalization <training_mode = 1> (o, s, b, m, v)
  c = Conv (x, w)
  p = Mul (c, x2)
  c2 = Conv (x, w)
  u = Mul (c2, k)
  c4 = Conv (x, w)
  v4 = BatchNormalization (c4, sr, b, m, v)
}
)",
    // A BN in a subgraph after a layer of the enclosing graph.
    R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,4,4] x, bool cond) => (float[1,2,4,4] y)
<float[2,2,1,1] w = {1, 0, 0, 1}, float[2] s = {1, 2}, float[2] b = {0.5, 1}, float[2] m = {0, 0},
 float[2] v = {1, 1}>
{
  c = Conv (x, w)
  y = If (cond) <
    then_branch = t () => (float[1,2,4,4] ty) { ty = BatchNormalization (c, s, b, m, v) },
    else_branch = e () => (float[1,2,4,4] ey) { ey = Identity (x) }>
}
)",
};

}  // namespace

TEST_CASE("reason codes: the list is kebab-case, sorted, unique, and explained", "[reason-codes]") {
  const auto& codes = reasonCodes();
  REQUIRE(codes.size() >= 30);
  static const std::regex kebab("[a-z][a-z0-9]*(-[a-z0-9]+)+");
  for (std::size_t i = 0; i < codes.size(); ++i) {
    INFO(codes[i].code.str());
    CHECK(std::regex_match(codes[i].code.str(), kebab));
    CHECK(std::string(codes[i].meaning).size() > 10);
    if (i > 0) CHECK(std::string(codes[i - 1].code.str()) < codes[i].code.str());
  }
}

TEST_CASE("reason codes: retired spellings of format 1 still read as the codes they became", "[reason-codes]") {
  CHECK(findReasonCode("rank-unknown") == reason::kRankUnknown);
  CHECK(findReasonCode("unknown-rank") == reason::kRankUnknown);
  CHECK(findReasonCode("layer-in-outer-graph") == reason::kLayerInOtherGraph);
  CHECK(findReasonCode("bad-param-shape") == reason::kParamShapeMismatch);
  CHECK(findReasonCode("unknown-type") == reason::kTypeUnknown);
  CHECK_FALSE(findReasonCode("no-such-reason").has_value());
  const std::set<std::string> current = listedCodes();
  for (const RetiredReasonCode& old : retiredReasonCodes()) {
    INFO(old.spelling);
    CHECK(current.count(old.spelling) == 0);      // a retired spelling is never written again
    CHECK(current.count(old.current.str()) == 1);  // and maps to a current code
    CHECK(old.lastFormatVersion < Report::kFormatVersion);
  }
}

TEST_CASE("reason codes: the README table says exactly what the list says", "[reason-codes]") {
  const auto table = readmeTable();
  std::map<std::string, std::string> expected;
  for (const ReasonCodeInfo& info : reasonCodes()) expected[info.code.str()] = info.meaning;
  for (const auto& [code, meaning] : expected) {
    INFO(code);
    REQUIRE(table.count(code) == 1);
    CHECK(table.at(code) == meaning);
  }
  for (const auto& [code, meaning] : table) {
    INFO("README lists " << code << ", which reason_codes.h does not");
    CHECK(expected.count(code) == 1);
  }
  // The README says what changed from format_version 1.
  const std::string readme = readFile(sourceDir() + "/README.md");
  for (const RetiredReasonCode& old : retiredReasonCodes()) {
    INFO(old.spelling);
    CHECK(readme.find("`" + std::string(old.spelling) + "` | `" + old.current.str() + "`") != std::string::npos);
  }
}

TEST_CASE("reason codes: the report schema enumerates exactly the list", "[reason-codes]") {
  const auto schema = nlohmann::json::parse(readFile(sourceDir() + "/schema/report.schema.json"));
  std::set<std::string> enumerated;
  for (const auto& code : schema.at("definitions").at("reasonCode").at("enum")) enumerated.insert(code.get<std::string>());
  CHECK(enumerated == listedCodes());
  CHECK(schema.at("properties").at("format_version").at("const") == Report::kFormatVersion);
}

TEST_CASE("reason codes: no rule emits a code outside the list", "[reason-codes]") {
  // Every rule on every node it is rooted at, over the sample models and ONNX's own node tests: the refusals
  // the driver reports and those it does not (Add, Mul roots) alike.
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(sourceDir() + "/models"))
    if (entry.path().extension() == ".onnx") files.push_back(entry.path().string());
  const fs::path testdata = "/usr/share/libonnx-testdata/data/node";
  if (fs::is_directory(testdata))
    for (const auto& entry : fs::directory_iterator(testdata))
      if (fs::is_regular_file(entry.path() / "model.onnx")) files.push_back((entry.path() / "model.onnx").string());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() > 5);

  std::map<std::string, std::string> seen;  // code -> first place it was seen
  int loaded = 0;
  for (const std::string& file : files) {
    std::unique_ptr<Model> model;
    try {
      model = loadModel(file);
    } catch (const Error&) {
      continue;  // models bnfold refuses to load (bad input tests of ONNX's own) have no rule verdicts
    }
    ++loaded;
    collectCodes(*model, seen, fs::path(file).parent_path().filename().string());
  }
  CHECK(loaded > 5);
  for (std::size_t i = 0; i < kCraftedModels.size(); ++i) {
    auto model = parseModel(kCraftedModels[i]);
    collectCodes(*model, seen, "crafted model " + std::to_string(i));
  }
  const std::set<std::string> listed = listedCodes();
  for (const auto& [code, where] : seen) {
    INFO(code << " (first seen " << where << ")");
    CHECK(listed.count(code) == 1);
  }
  // Enough variety that this test means something: refusals of several kinds, from several rules.
  CHECK(seen.size() >= 16);
}

TEST_CASE("reason codes: library code names codes only through the constants", "[reason-codes]") {
  // ReasonCode has no implicit conversion from a string; an explicit ReasonCode("...") outside the list would
  // be a code nobody documented.
  static const std::regex literalCode(R"re(ReasonCode\s*[({]\s*")re");
  int scanned = 0;
  for (const auto& entry : fs::recursive_directory_iterator(sourceDir() + "/lib")) {
    if (!entry.is_regular_file() || entry.path().filename() == "reason_codes.cpp") continue;
    const std::string text = readFile(entry.path().string());
    ++scanned;
    INFO(entry.path().string());
    CHECK_FALSE(std::regex_search(text, literalCode));
  }
  CHECK(scanned > 10);
}
