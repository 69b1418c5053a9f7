// Older PyTorch exports list every initializer as a graph input (IR >= 4), so by policy nothing folds. bnfold keeps
// the policy but says what --input-defaults-are-constant would change: one line from `fold`, one finding per model
// from `check`, and `would_fold_with` on the report's skipped entries.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "test_support.h"

using namespace bnfold::test;
using nlohmann::json;

namespace {

// Two Conv+BN blocks whose weights and parameters are all initializers listed as graph inputs, and a third BN that
// follows a Relu (left for another reason).
const char* const kModel = R"(<ir_version: 7, opset_import: ["" : 13]>
g (float[1,2,3,3] x, float[2,2,1,1] w, float[2] s, float[2] b, float[2] m, float[2] v)
  => (float[1,2,3,3] y, float[1,2,3,3] z) <
  float[2,2,1,1] w = {0.5, -1.25, 2, 0.75}, float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1},
  float[2] m = {0.125, -0.375}, float[2] v = {0.5, 2}> {
  c1 = Conv (x, w)
  n1 = BatchNormalization <epsilon = 0.001> (c1, s, b, m, v)
  c2 = Conv (n1, w)
  y = BatchNormalization <epsilon = 0.001> (c2, s, b, m, v)
  r = Relu (x)
  z = BatchNormalization <epsilon = 0.001> (r, s, b, m, v)
}
)";

std::string writeModel(const TempDir& dir) {
  std::string bytes;
  REQUIRE(parseModelProto(kModel).SerializeToString(&bytes));
  writeFile(dir.file("in.onnx"), bytes);
  return dir.file("in.onnx");
}

}  // namespace

TEST_CASE("input defaults: fold says in one line how many BNs the flag would fold", "[cli][input-defaults]") {
  TempDir dir;
  const std::string in = writeModel(dir);
  std::string out, err;
  REQUIRE(runCommand(cli("fold " + in + " -o " + dir.file("out.onnx") + " --report " + dir.file("r.json")), &out, &err) == 0);
  const auto hintLines = [&] {
    int count = 0;
    for (const std::string& line : lines(err))
      if (line.find("would fold with --input-defaults-are-constant") != std::string::npos) ++count;
    return count;
  };
  CHECK(hintLines() == 1);
  CHECK(err.find("2 BatchNormalization would fold with --input-defaults-are-constant: every initializer of this "
                 "model is also a graph input") != std::string::npos);
  const json report = json::parse(readFile(dir.file("r.json")));
  CHECK(report["folds"].empty());
  int marked = 0;
  for (const auto& entry : report["skipped"])
    if (entry.contains("would_fold_with")) ++marked;
  CHECK(marked == 2);

  SECTION("with the flag they fold, and ONNX Runtime agrees") {
    REQUIRE(runCommand(cli("fold " + in + " -o " + dir.file("flag.onnx") + " --input-defaults-are-constant --report " +
                           dir.file("f.json")),
                       &out, &err) == 0);
    CHECK(err.find("would fold") == std::string::npos);
    const json folded = json::parse(readFile(dir.file("f.json")));
    CHECK(folded["folds"].size() == 2);
    const auto comparison = compareInOrt(in, dir.file("flag.onnx"), 1e-5, 1e-4);
    INFO(comparison.error);
    CHECK(comparison.ok);
  }
}

TEST_CASE("input defaults: check makes one finding for the model, not one per BN", "[cli][input-defaults]") {
  TempDir dir;
  const std::string in = writeModel(dir);
  std::string out, err;
  const int code = runCommand(cli("check " + in), &out, &err);
  CHECK(code == 0);  // not a failing category by default
  int hints = 0, unfoldable = 0;
  for (const std::string& line : lines(out)) {
    if (line.find("warning  input-defaults") != std::string::npos) ++hints;  // finding lines, not the summary
    if (line.find("warning  unfoldable-bn") != std::string::npos) ++unfoldable;
  }
  INFO(out);
  CHECK(hints == 1);
  CHECK(unfoldable == 1);  // the BN after the Relu keeps its own finding
  CHECK(out.find("2 BatchNormalization would fold with --input-defaults-are-constant") != std::string::npos);
  CHECK(runCommand(cli("check --fail-on input-defaults " + in), &out, &err) == 1);
}
