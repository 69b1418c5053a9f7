// `bnfold check` as a CI gate: findings per category, every output format, every exit code, and that it
// predicts what `fold` does without ever writing a model.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_support.h"

using bnfold::test::runCommand;
using bnfold::test::TempDir;
using nlohmann::json;

using bnfold::test::cli;
using bnfold::test::sample;
using bnfold::test::lines;
using bnfold::test::readFile;
namespace {

std::string writeModel(const TempDir& dir, const std::string& name, const std::string& onnxText) {
  std::string bytes;
  REQUIRE(bnfold::test::parseModelProto(onnxText).SerializeToString(&bytes));
  const std::string path = dir.file(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// Every file below `dir` with its bytes: a folder's complete state.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir))
    if (entry.is_regular_file()) files[entry.path().string()] = readFile(entry.path().string());
  return files;
}

// Conv without BN: nothing for any rule to do.
const char* kCleanModel = R"(
<ir_version: 8, opset_import: ["" : 13]>
clean (float[1,2,4,4] x) => (float[1,2,4,4] y)
<float[2,2,1,1] w = {1, 2, 3, 4}>
{
  c = Conv <kernel_shape = [1, 1]> (x, w)
  y = Relu(c)
}
)";

// Conv then inference-mode BN with constant parameters: the textbook fold.
const char* kConvBnModel = R"(
<ir_version: 8, opset_import: ["" : 13]>
conv_bn (float[1,2,4,4] x) => (float[1,2,4,4] y)
<float[2,2,1,1] w = {1, 2, 3, 4}, float[2] s = {1.5, -2}, float[2] b = {0.5, -0.5}, float[2] m = {0.1, 0.2},
 float[2] v = {1, 4}>
{
  c = Conv <kernel_shape = [1, 1]> (x, w)
  y = BatchNormalization <epsilon = 0.001> (c, s, b, m, v)
}
)";

// BN reading a graph input: there is no layer to fold it into, whatever rules exist.
const char* kBnOnInputModel = R"(
<ir_version: 8, opset_import: ["" : 13]>
bn_on_input (float[1,2,4,4] x) => (float[1,2,4,4] y)
<float[2] s = {1.5, -2}, float[2] b = {0.5, -0.5}, float[2] m = {0.1, 0.2}, float[2] v = {1, 4}>
{
  y = BatchNormalization(x, s, b, m, v)
}
)";

// Training-mode BN (opset 15, training_mode=1) after a Conv.
const char* kTrainingBnModel = R"(
<ir_version: 8, opset_import: ["" : 15]>
training (float[2,2,4,4] x) => (float[2,2,4,4] y)
<float[2,2,1,1] w = {1, 2, 3, 4}, float[2] s = {1.5, -2}, float[2] b = {0.5, -0.5}, float[2] m = {0.1, 0.2},
 float[2] v = {1, 4}>
{
  c = Conv <kernel_shape = [1, 1]> (x, w)
  y = BatchNormalization <training_mode = 1> (c, s, b, m, v)
}
)";

json checkJson(const std::string& args, int* exitCode = nullptr) {
  std::string out, err;
  const int code = runCommand(cli("check --format json " + args), &out, &err);
  INFO("stderr: " << err);
  if (exitCode) *exitCode = code;
  return json::parse(out);
}

std::vector<json> findingsOf(const json& document, const std::string& category) {
  std::vector<json> found;
  for (const auto& model : document["models"])
    for (const auto& finding : model["findings"])
      if (finding["category"] == category) found.push_back(finding);
  return found;
}

}  // namespace

TEST_CASE("check: a model without findings passes in every format", "[cli][check]") {
  TempDir dir;
  const std::string model = writeModel(dir, "clean.onnx", kCleanModel);
  std::string out, err;

  CHECK(runCommand(cli("check " + model), &out, &err) == 0);
  CHECK(out == model + ": clean\n\n1 model: 1 clean, 0 with findings, 0 invalid; 0 findings; 0 failing under "
                       "--fail-on foldable-bn,training-bn\n");
  CHECK(err.empty());

  int code = -1;
  const json document = checkJson(model, &code);
  CHECK(code == 0);
  CHECK(document["exit_code"] == 0);
  REQUIRE(document["models"].size() == 1);
  CHECK(document["models"][0]["file"] == model);
  CHECK(document["models"][0]["valid"] == true);
  CHECK(document["models"][0]["opset"] == 13);
  CHECK(document["models"][0]["findings"].empty());
  CHECK(document["summary"]["models"] == 1);
  CHECK(document["summary"]["clean"] == 1);
  CHECK(document["summary"]["findings"] == 0);
  CHECK(document["fail_on"] == json({"foldable-bn", "training-bn"}));

  for (const char* format : {"ndjson", "github"}) {
    CHECK(runCommand(cli(std::string("check --format ") + format + " " + model), &out, &err) == 0);
    CHECK(out.empty());
  }
}

TEST_CASE("check: a BN on a graph input is an unfoldable-bn warning with fold's reason", "[cli][check]") {
  TempDir dir;
  const std::string model = writeModel(dir, "bn_on_input.onnx", kBnOnInputModel);

  // What fold would report for it: check must predict exactly that.
  std::string out, err;
  REQUIRE(runCommand(cli("fold " + model + " -o " + dir.file("folded.onnx") + " --report " + dir.file("r.json")), &out,
                     &err) == 0);
  const json report = json::parse(readFile(dir.file("r.json")));
  REQUIRE(report["skipped"].size() == 1);
  const std::string reason = report["skipped"][0]["reason"];
  const std::string node = report["skipped"][0]["node"];
  CHECK_FALSE(reason.empty());
  CHECK(reason != "no-rule-enabled");  // default rules include one rooted at BatchNormalization

  int code = -1;
  const json document = checkJson(model, &code);
  CHECK(code == 0);  // unfoldable-bn is not in the default --fail-on
  const auto findings = findingsOf(document, "unfoldable-bn");
  REQUIRE(findings.size() == 1);
  REQUIRE(document["models"][0]["findings"].size() == 1);
  CHECK(findings[0]["reason"] == reason);
  CHECK(findings[0]["node"] == node);
  CHECK(findings[0]["op"] == "BatchNormalization");
  CHECK(findings[0]["severity"] == "warning");
  CHECK_THAT(findings[0]["message"].get<std::string>(), Catch::Contains(reason) && Catch::Contains(node));

  // Text: one warning line under the file name.
  REQUIRE(runCommand(cli("check " + model), &out, &err) == 0);
  auto text = lines(out);
  REQUIRE(text.size() >= 2);
  CHECK(text[0] == model);
  CHECK_THAT(text[1], Catch::StartsWith("  warning  unfoldable-bn ") && Catch::Contains(reason));

  // Failing on it: exit 1, and the finding becomes an error.
  REQUIRE(runCommand(cli("check --fail-on unfoldable-bn --format github " + model), &out, &err) == 1);
  CHECK(out == "::error file=" + model + ",title=bnfold unfoldable-bn::" +
                   findings[0]["message"].get<std::string>() + "\n");
  REQUIRE(runCommand(cli("check --format github " + model), &out, &err) == 0);
  CHECK_THAT(out, Catch::StartsWith("::warning file=" + model + ",title=bnfold unfoldable-bn::"));
}

TEST_CASE("check: a training-mode BN is a failing training-bn finding, expanded or not", "[cli][check]") {
  TempDir dir;
  const std::string model = writeModel(dir, "training.onnx", kTrainingBnModel);
  // With the default rules, with no rules at all (left in place), and with only bn-fold (which refuses it),
  // the BN is found by its form.
  for (const std::string rules : {"default", "none", "bn-fold"}) {
    INFO("--rules " << rules);
    int code = -1;
    const json document = checkJson("--rules " + rules + " " + model, &code);
    CHECK(code == 1);
    CHECK(document["exit_code"] == 1);
    const auto findings = findingsOf(document, "training-bn");
    REQUIRE(findings.size() == 1);
    CHECK(findings[0]["severity"] == "error");
    CHECK_THAT(findings[0]["message"].get<std::string>(), Catch::Contains("training_mode=1"));
    CHECK(findingsOf(document, "foldable-bn").empty());
    CHECK(document["summary"]["failing"] == 1);
    CHECK(document["summary"]["failing_by_category"]["training-bn"] == 1);
  }
  std::string out, err;
  CHECK(runCommand(cli("check --fail-on none " + model), &out, &err) == 0);
  CHECK_THAT(out, Catch::Contains("warning  training-bn"));
  CHECK(runCommand(cli("check --fail-on foldable-bn " + model), &out, &err) == 0);
  // Keeping it does not make it an inference model.
  int code = -1;
  const json kept = checkJson("--keep-op BatchNormalization " + model, &code);
  CHECK(code == 1);
  REQUIRE(findingsOf(kept, "training-bn").size() == 1);
  CHECK(findingsOf(kept, "training-bn")[0]["reason"] == "kept-by-user");
}

TEST_CASE("check: a foldable BN fails by default and check never writes", "[cli][check]") {
  TempDir dir;
  const std::string model = writeModel(dir, "conv_bn.onnx", kConvBnModel);
  const auto before = snapshot(dir.path());

  int code = -1;
  const json document = checkJson(model, &code);
  CHECK(snapshot(dir.path()) == before);  // no model, no report, no temp file
  CHECK(code == 1);
  const auto folds = findingsOf(document, "foldable-bn");
  REQUIRE(folds.size() == 1);
  CHECK(document["models"][0]["findings"].size() == 1);
  CHECK(folds[0]["severity"] == "error");
  CHECK(folds[0]["op"] == "BatchNormalization");
  CHECK_FALSE(folds[0]["rule"].get<std::string>().empty());

  // The same BN fold would fold, by the same rule.
  std::string out, err;
  REQUIRE(runCommand(cli("fold " + model + " -o " + dir.file("folded.onnx") + " --report -"), &out, &err) == 0);
  const json report = json::parse(out);
  REQUIRE(report["folds"].size() == 1);
  CHECK(folds[0]["rule"] == report["folds"][0]["rule"]);
  CHECK(folds[0]["entry"] == report["folds"][0]);
  // The folded model is clean.
  CHECK(runCommand(cli("check " + dir.file("folded.onnx")), &out, &err) == 0);
  CHECK_THAT(out, Catch::StartsWith(dir.file("folded.onnx") + ": clean\n"));

  // Kept by the user: kept-bn, which does not fail unless asked.
  const json kept = checkJson("--keep-op BatchNormalization " + model, &code);
  CHECK(code == 0);
  REQUIRE(findingsOf(kept, "kept-bn").size() == 1);
  CHECK(findingsOf(kept, "kept-bn")[0]["reason"] == "kept-by-user");
  CHECK(findingsOf(kept, "foldable-bn").empty());
  CHECK(runCommand(cli("check --keep-op BatchNormalization --fail-on kept-bn " + model), &out, &err) == 1);
  // --fail-on none never fails on findings; all fails on any.
  CHECK(runCommand(cli("check --fail-on none " + model), &out, &err) == 0);
  CHECK(runCommand(cli("check --fail-on all " + dir.file("folded.onnx")), &out, &err) == 0);
  CHECK(runCommand(cli("check --fail-on all --keep-op BatchNormalization " + model), &out, &err) == 1);
}

TEST_CASE("check predicts fold on every sample model", "[cli][check]") {
  // Sections of fold's report -> category of check's findings.
  const std::vector<std::pair<std::string, std::string>> categories = {
      {"folds", "foldable-bn"},  {"expanded", "training-bn"},   {"frozen", "training-bn"},
      {"bias_absorbed", "bias-add"}, {"scale_folded", "scale-fold"}, {"decomposed", "decomposable-bn"}};
  TempDir dir;
  for (const char* name : {"resnet_block.onnx", "mlp_bn1d.onnx", "decoder_convtranspose.onnx", "training_bn.onnx",
                           "bias_add.onnx", "unfoldable_bn.onnx"}) {
    INFO(name);
    std::string out, err;
    REQUIRE(runCommand(cli("fold " + sample(name) + " -o " + dir.file(name) + " --report -"), &out, &err) == 0);
    const json report = json::parse(out);
    int code = -1;
    const json document = checkJson(sample(name), &code);
    std::map<std::string, std::size_t> expected;
    for (const auto& [section, category] : categories) expected[category] += report[section].size();
    for (const auto& [category, count] : expected) {
      INFO(category);
      if (category != "training-bn") CHECK(findingsOf(document, category).size() == count);
    }
    // Every BN fold leaves in place is a finding: unfoldable, kept, or training-mode (beyond those rewritten).
    const std::size_t trainingLeft = findingsOf(document, "training-bn").size() - expected["training-bn"];
    CHECK(findingsOf(document, "training-bn").size() >= expected["training-bn"]);
    CHECK(findingsOf(document, "unfoldable-bn").size() + findingsOf(document, "kept-bn").size() + trainingLeft ==
          report["skipped"].size());
    const std::size_t failing = expected["foldable-bn"] + findingsOf(document, "training-bn").size();
    CHECK(code == (failing > 0 ? 1 : 0));
    CHECK(document["summary"]["failing"] == failing);
    CHECK(document["summary"]["findings"] == document["models"][0]["findings"].size());
  }
}

TEST_CASE("check: bias Adds and scale Muls are findings that fail only when asked", "[cli][check]") {
  // models/bias_add.onnx: branch A's Add [1,C,1,1] and Mul [C,1,1] after a bias-less Conv.
  int code = -1;
  const json document = checkJson(sample("bias_add.onnx"), &code);
  CHECK(code == 0);
  const auto adds = findingsOf(document, "bias-add");
  const auto muls = findingsOf(document, "scale-fold");
  REQUIRE(adds.size() == 1);
  REQUIRE(muls.size() == 1);
  CHECK(adds[0]["node"] == "branch_a/add_bias");
  CHECK(adds[0]["op"] == "Add");
  CHECK(muls[0]["node"] == "branch_a/mul_scale");
  CHECK(muls[0]["op"] == "Mul");
  CHECK_THAT(adds[0]["message"].get<std::string>(), Catch::Contains("Conv 'branch_a/conv'"));
  std::string out, err;
  CHECK(runCommand(cli("check --fail-on bias-add " + sample("bias_add.onnx")), &out, &err) == 1);
  CHECK(runCommand(cli("check --fail-on scale-fold " + sample("bias_add.onnx")), &out, &err) == 1);
  CHECK(runCommand(cli("check --rules -bias-add,-scale-fold --fail-on all " + sample("bias_add.onnx")), &out, &err) ==
        0);
}

TEST_CASE("check: an unreadable model is an invalid-model finding and exit code 2", "[cli][check]") {
  TempDir dir;
  const std::string good = writeModel(dir, "a_conv_bn.onnx", kConvBnModel);
  const std::string clean = writeModel(dir, "b_clean.onnx", kCleanModel);
  const std::string corrupt = dir.file("c_corrupt.onnx");
  const std::string original = readFile(sample("resnet_block.onnx"));
  std::ofstream(corrupt, std::ios::binary) << original.substr(0, original.size() / 2);
  const std::string missing = dir.file("d_missing.onnx");

  int code = -1;
  // Invalid input wins over everything, --fail-on none included; the other models are still checked.
  const json document = checkJson("--fail-on none " + dir.path() + " " + missing, &code);
  CHECK(code == 2);
  CHECK(document["exit_code"] == 2);
  REQUIRE(document["models"].size() == 4);
  CHECK(document["models"][0]["file"] == good);  // folder contents sorted, then the next argument
  CHECK(document["models"][1]["file"] == clean);
  CHECK(document["models"][2]["file"] == corrupt);
  CHECK(document["models"][3]["file"] == missing);
  CHECK(document["models"][0]["valid"] == true);
  CHECK(document["models"][0]["findings"].size() == 1);
  for (int i : {2, 3}) {
    const auto& model = document["models"][i];
    CHECK(model["valid"] == false);
    REQUIRE(model["findings"].size() == 1);
    CHECK(model["findings"][0]["category"] == "invalid-model");
    CHECK(model["findings"][0]["severity"] == "error");
    CHECK_FALSE(model["findings"][0]["message"].get<std::string>().empty());
  }
  CHECK(document["summary"]["invalid"] == 2);
  CHECK(document["summary"]["clean"] == 1);

  std::string out, err;
  CHECK(runCommand(cli("check --format ndjson " + corrupt + " " + good), &out, &err) == 2);
  const auto ndjson = lines(out);
  REQUIRE(ndjson.size() == 2);
  CHECK(json::parse(ndjson[0])["category"] == "invalid-model");
  CHECK(json::parse(ndjson[0])["file"] == corrupt);
  CHECK(json::parse(ndjson[1])["category"] == "foldable-bn");

  CHECK(runCommand(cli("check --format github " + corrupt), &out, &err) == 2);
  CHECK_THAT(out, Catch::StartsWith("::error file=" + corrupt + ",title=bnfold invalid-model::"));

  CHECK(runCommand(cli("check " + corrupt), &out, &err) == 2);
  CHECK_THAT(out, Catch::Contains("error    invalid-model") && Catch::Contains("1 invalid"));
}

TEST_CASE("check: ndjson has one JSON object per finding, the same as the json document", "[cli][check]") {
  std::string out, err;
  const std::string models = sample("resnet_block.onnx") + " " + sample("unfoldable_bn.onnx") + " " +
                             sample("training_bn.onnx");
  REQUIRE(runCommand(cli("check --format ndjson " + models), &out, &err) == 1);
  const json document = checkJson(models);
  std::vector<json> expected;
  for (const auto& model : document["models"]) {
    for (json finding : model["findings"]) {
      finding["file"] = model["file"];
      expected.push_back(finding);
    }
  }
  const auto got = lines(out);
  REQUIRE(got.size() == expected.size());
  REQUIRE(got.size() == document["summary"]["findings"].get<std::size_t>());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(json::parse(got[i]) == expected[i]);
}

TEST_CASE("check: github annotations escape what the workflow-command syntax reserves", "[cli][check]") {
  TempDir dir;
  const std::string model = writeModel(dir, "a,b:c.onnx", kBnOnInputModel);
  std::string out, err;
  REQUIRE(runCommand(cli("check --format github '" + model + "'"), &out, &err) == 0);
  CHECK_THAT(out, Catch::StartsWith("::warning file=" + dir.path() + "/a%2Cb%3Ac.onnx,title=bnfold unfoldable-bn::"));
  CHECK(lines(out).size() == 1);
}

TEST_CASE("check: usage errors exit 2 with one line on stderr", "[cli][check]") {
  TempDir dir;
  const std::string model = writeModel(dir, "clean.onnx", kCleanModel);
  std::string out, err;
  CHECK(runCommand(cli("check --fail-on foldable-bn,bogus " + model), &out, &err) == 2);
  CHECK_THAT(err, Catch::Contains("--fail-on: unknown category 'bogus'"));
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  CHECK(out.empty());
  CHECK(runCommand(cli("check --format xml " + model), &out, &err) == 2);
  CHECK(runCommand(cli("check --rules no-such-rule " + model), &out, &err) == 2);
  CHECK_THAT(err, Catch::Contains("unknown rule 'no-such-rule'"));
  CHECK(runCommand(cli("check"), &out, &err) == 2);
  std::filesystem::create_directory(dir.file("empty"));
  CHECK(runCommand(cli("check " + dir.file("empty")), &out, &err) == 2);
  CHECK_THAT(err, Catch::Contains("no *.onnx file"));
}

TEST_CASE("check: colour only on a terminal and never with NO_COLOR", "[cli][check]") {
  const std::string model = sample("resnet_block.onnx");
  std::string out, err;
  // Not a terminal (a file): plain text.
  REQUIRE(runCommand("env -u NO_COLOR TERM=xterm " + cli("check " + model), &out, &err) == 1);
  CHECK(out.find('\033') == std::string::npos);
  // A terminal, through script(1), which gives the command a pseudo-terminal.
  if (runCommand("script -qec true /dev/null") != 0) {
    WARN("script(1) cannot allocate a pseudo-terminal here; the terminal half of this test is skipped");
    return;
  }
  const std::string inTerminal = "script -qec '" + cli("check " + model) + "' /dev/null";
  REQUIRE(runCommand("env -u NO_COLOR TERM=xterm " + inTerminal, &out, &err) == 1);
  CHECK_THAT(out, Catch::Contains("\033[31merror\033[0m"));
  REQUIRE(runCommand("env NO_COLOR=1 TERM=xterm " + inTerminal, &out, &err) == 1);
  CHECK_THAT(out, Catch::Contains("error    foldable-bn"));
  CHECK(out.find('\033') == std::string::npos);
  // Machine formats never carry colour.
  REQUIRE(runCommand("env -u NO_COLOR TERM=xterm script -qec '" + cli("check --format github " + model) + "' /dev/null",
                     &out, &err) == 1);
  CHECK(out.find('\033') == std::string::npos);
}

TEST_CASE("check --help and --help-all document categories, exit codes and examples", "[cli][check]") {
  std::string out, err;
  REQUIRE(runCommand(cli("check --help"), &out, &err) == 0);
  CHECK_THAT(out, Catch::Contains("--fail-on") && Catch::Contains("--format") && Catch::Contains("Examples:") &&
                      Catch::Contains("foldable-bn") && Catch::Contains("invalid-model") &&
                      Catch::Contains("Exit codes:"));
  REQUIRE(runCommand(cli("--help-all"), &out, &err) == 0);
  CHECK_THAT(out, Catch::Contains("--fail-on") && Catch::Contains("--out-dir") && Catch::Contains("--json"));
  REQUIRE(runCommand(cli("--help"), &out, &err) == 0);
  CHECK_THAT(out, Catch::Contains("bnfold check") && Catch::Contains("--out-dir"));
}
