// Batch `bnfold fold`: many inputs (files and folders), --out-dir mirroring the layout with a report per model,
// --report-dir, --in-place with backups, --dry-run, --jobs; one bad model does not stop the others.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_support.h"

using bnfold::test::runCommand;
using bnfold::test::TempDir;
using nlohmann::json;
namespace fs = std::filesystem;

using bnfold::test::cli;
using bnfold::test::sample;
using bnfold::test::lines;
using bnfold::test::readFile;
using bnfold::test::writeFile;
namespace {

// Every file below `dir` (relative path -> bytes).
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  if (!fs::exists(dir)) return files;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file())
      files[entry.path().lexically_relative(dir).generic_string()] = readFile(entry.path().string());
  return files;
}

std::vector<std::string> namesOf(const std::map<std::string, std::string>& files) {
  std::vector<std::string> names;
  for (const auto& [name, bytes] : files) names.push_back(name);
  return names;
}

const char* kCleanModel = R"(
<ir_version: 8, opset_import: ["" : 13]>
clean (float[1,2,4,4] x) => (float[1,2,4,4] y)
<float[2,2,1,1] w = {1, 2, 3, 4}>
{
  c = Conv <kernel_shape = [1, 1]> (x, w)
  y = Relu(c)
}
)";

// A folder of models:
//   a_resnet_block.onnx            3 BNs to fold
//   b_clean.onnx                   nothing to do
//   corrupt.onnx                   the first half of a real model
//   nested/deeper/mlp_bn1d.onnx    2 BNs to fold, two levels down
//   notes.txt                      not a model
struct ModelFolder {
  TempDir dir;
  std::string in = dir.file("in");
  ModelFolder() {
    writeFile(in + "/a_resnet_block.onnx", readFile(sample("resnet_block.onnx")));
    std::string clean;
    REQUIRE(bnfold::test::parseModelProto(kCleanModel).SerializeToString(&clean));
    writeFile(in + "/b_clean.onnx", clean);
    const std::string whole = readFile(sample("resnet_block.onnx"));
    writeFile(in + "/corrupt.onnx", whole.substr(0, whole.size() / 2));
    writeFile(in + "/nested/deeper/mlp_bn1d.onnx", readFile(sample("mlp_bn1d.onnx")));
    writeFile(in + "/notes.txt", "not a model\n");
  }
};

// What one-model `fold IN -o OUT --report R` gives: the reference batch results must equal.
struct SingleFold {
  std::string model;
  json report;
};
SingleFold foldAlone(const std::string& input) {
  TempDir dir;
  std::string out, err;
  REQUIRE(runCommand(cli("fold " + input + " -o " + dir.file("m.onnx") + " --report " + dir.file("r.json")), &out,
                     &err) == 0);
  return {readFile(dir.file("m.onnx")), json::parse(readFile(dir.file("r.json")))};
}

// A report with the paths of the run taken out, to compare runs with different paths.
json withoutPaths(json report) {
  report.erase("input");
  report.erase("output");
  return report;
}

// Drops the timing from the summary line ("...; 0.12 s with 2 jobs"), the only part that may differ.
std::string withoutTiming(const std::string& text) {
  return std::regex_replace(text, std::regex("; [0-9.]+ (s|min [0-9]+ s) with [0-9]+ jobs"), "");
}

}  // namespace

TEST_CASE("batch fold mirrors a folder into --out-dir with a report per model, and a bad model fails alone",
          "[cli][batch]") {
  ModelFolder folder;
  const std::string out = folder.dir.file("out");
  std::string stdoutText, err;
  CHECK(runCommand(cli("fold " + folder.in + " --out-dir " + out + " --jobs 1"), &stdoutText, &err) == 2);
  CHECK(stdoutText.empty());

  // The tree: every readable model and its report, at the same relative path; nothing for the corrupt one.
  const auto files = snapshot(out);
  CHECK(namesOf(files) == std::vector<std::string>{"a_resnet_block.onnx", "a_resnet_block.report.json",
                                                   "b_clean.onnx", "b_clean.report.json",
                                                   "nested/deeper/mlp_bn1d.onnx",
                                                   "nested/deeper/mlp_bn1d.report.json"});

  // Each result is what folding that model alone gives.
  std::size_t totalFolds = 0;
  for (const std::string name : {"a_resnet_block", "b_clean", "nested/deeper/mlp_bn1d"}) {
    INFO(name);
    const SingleFold alone = foldAlone(folder.in + "/" + name + ".onnx");
    CHECK(files.at(name + ".onnx") == alone.model);
    const json report = json::parse(files.at(name + ".report.json"));
    CHECK(report["input"] == folder.in + "/" + name + ".onnx");
    CHECK(report["output"] == out + "/" + name + ".onnx");
    CHECK(withoutPaths(report) == withoutPaths(alone.report));
    totalFolds += report["folds"].size();
  }
  CHECK(json::parse(files.at("a_resnet_block.report.json"))["folds"].size() == 3);
  CHECK(json::parse(files.at("nested/deeper/mlp_bn1d.report.json"))["folds"].size() == 2);
  const json cleanReport = json::parse(files.at("b_clean.report.json"));
  CHECK(cleanReport["folds"].empty());
  CHECK(cleanReport["skipped"].empty());

  // One line per model in sorted order, then the summary, then the failure named again.
  const auto log = lines(err);
  REQUIRE(log.size() == 6);
  CHECK_THAT(log[0], Catch::StartsWith("[1/4] ok        " + folder.in + "/a_resnet_block.onnx -> " + out +
                                       "/a_resnet_block.onnx: 3 BN folded, 0 expanded, 0 skipped"));
  CHECK_THAT(log[1], Catch::StartsWith("[2/4] ok        " + folder.in + "/b_clean.onnx -> " + out +
                                       "/b_clean.onnx: 0 BN folded, 0 expanded, 0 skipped, 0 other rewrites"));
  CHECK_THAT(log[2], Catch::StartsWith("[3/4] failed    " + folder.in + "/corrupt.onnx: "));
  CHECK_THAT(log[3], Catch::StartsWith("[4/4] ok        " + folder.in + "/nested/deeper/mlp_bn1d.onnx -> " + out +
                                       "/nested/deeper/mlp_bn1d.onnx: 2 BN folded"));
  CHECK_THAT(log[4], Catch::StartsWith("4 models: 3 ok, 1 failed; " + std::to_string(totalFolds) +
                                       " BN folded, 0 expanded, 0 skipped, 0 other rewrites; ") &&
                         Catch::EndsWith(" with 1 jobs"));
  CHECK(log[5] == "failed: " + folder.in + "/corrupt.onnx: " + log[2].substr(log[2].find(".onnx: ") + 7));
  CHECK(err.find('\033') == std::string::npos);  // not a terminal: no escape codes, no progress bar
}

TEST_CASE("batch fold: --jobs 2 gives byte-identical results to --jobs 1", "[cli][batch]") {
  ModelFolder folder;
  // More models than jobs, so several run at the same time.
  for (int copy = 0; copy < 3; ++copy) {
    for (const char* name : {"resnet_block.onnx", "mlp_bn1d.onnx", "decoder_convtranspose.onnx", "training_bn.onnx",
                             "bias_add.onnx", "unfoldable_bn.onnx"})
      writeFile(folder.in + "/copy" + std::to_string(copy) + "/" + name, readFile(sample(name)));
  }
  const std::string out = folder.dir.file("out");
  std::string stdout1, err1, stdout2, err2;
  CHECK(runCommand(cli("fold " + folder.in + " --out-dir " + out + " --jobs 1"), &stdout1, &err1) == 2);
  const auto serial = snapshot(out);
  fs::remove_all(out);
  CHECK(runCommand(cli("fold " + folder.in + " --out-dir " + out + " --jobs 2"), &stdout2, &err2) == 2);
  const auto parallel = snapshot(out);
  CHECK(serial.size() == 2 * (3 + 18));
  CHECK(namesOf(parallel) == namesOf(serial));
  for (const auto& [name, bytes] : serial) {
    INFO(name);
    CHECK(parallel.at(name) == bytes);
  }
  CHECK(withoutTiming(err2) == withoutTiming(err1));
  CHECK_THAT(err1, Catch::Contains("with 1 jobs"));
  CHECK_THAT(err2, Catch::Contains("with 2 jobs"));
}

TEST_CASE("batch fold: --report-dir mirrors the reports elsewhere", "[cli][batch]") {
  ModelFolder folder;
  const std::string out = folder.dir.file("out"), reports = folder.dir.file("reports");
  std::string stdoutText, err;
  CHECK(runCommand(cli("fold " + folder.in + " --out-dir " + out + " --report-dir " + reports), &stdoutText, &err) ==
        2);
  CHECK(namesOf(snapshot(out)) ==
        std::vector<std::string>{"a_resnet_block.onnx", "b_clean.onnx", "nested/deeper/mlp_bn1d.onnx"});
  const auto reportFiles = snapshot(reports);
  CHECK(namesOf(reportFiles) == std::vector<std::string>{"a_resnet_block.report.json", "b_clean.report.json",
                                                         "nested/deeper/mlp_bn1d.report.json"});
  CHECK(json::parse(reportFiles.at("nested/deeper/mlp_bn1d.report.json"))["output"] ==
        out + "/nested/deeper/mlp_bn1d.onnx");
}

TEST_CASE("batch fold: files and folders together, and an --out-dir inside the input folder", "[cli][batch]") {
  TempDir dir;
  writeFile(dir.file("models/x.onnx"), readFile(sample("resnet_block.onnx")));
  writeFile(dir.file("single/y.onnx"), readFile(sample("decoder_convtranspose.onnx")));
  const std::string out = dir.file("models/folded");
  std::string stdoutText, err;
  // The folder and one of its files again: each model once.
  REQUIRE(runCommand(cli("fold " + dir.file("models") + " " + dir.file("single/y.onnx") + " " + dir.file("models/x.onnx") +
                         " --out-dir " + out),
                     &stdoutText, &err) == 0);
  CHECK(namesOf(snapshot(out)) == std::vector<std::string>{"x.onnx", "x.report.json", "y.onnx", "y.report.json"});
  CHECK_THAT(err, Catch::Contains("2 models: 2 ok, 0 failed"));
  // A second run does not pick up the first run's results inside the input folder.
  REQUIRE(runCommand(cli("fold " + dir.file("models") + " --out-dir " + out), &stdoutText, &err) == 0);
  CHECK_THAT(err, Catch::Contains("1 model: 1 ok, 0 failed"));
  CHECK_FALSE(fs::exists(out + "/folded"));
}

TEST_CASE("batch fold --in-place replaces changed models atomically and keeps backups", "[cli][batch]") {
  ModelFolder folder;
  const auto before = snapshot(folder.in);
  std::string stdoutText, err;
  CHECK(runCommand(cli("fold " + folder.in + " --in-place --backup-suffix .orig --jobs 2"), &stdoutText, &err) == 2);
  const auto after = snapshot(folder.in);
  CHECK(namesOf(after) == std::vector<std::string>{"a_resnet_block.onnx", "a_resnet_block.onnx.orig",
                                                   "a_resnet_block.report.json", "b_clean.onnx",
                                                   "b_clean.report.json", "corrupt.onnx",
                                                   "nested/deeper/mlp_bn1d.onnx", "nested/deeper/mlp_bn1d.onnx.orig",
                                                   "nested/deeper/mlp_bn1d.report.json", "notes.txt"});
  // Changed models: the folded model in place, the original beside it.
  for (const std::string name : {"a_resnet_block.onnx", "nested/deeper/mlp_bn1d.onnx"}) {
    INFO(name);
    CHECK(after.at(name + ".orig") == before.at(name));
    CHECK(after.at(name) == foldAlone(sample(name == "a_resnet_block.onnx" ? "resnet_block.onnx" : "mlp_bn1d.onnx")).model);
  }
  // Nothing to change: left alone, no backup. The corrupt model is untouched.
  CHECK(after.at("b_clean.onnx") == before.at("b_clean.onnx"));
  CHECK(after.at("corrupt.onnx") == before.at("corrupt.onnx"));
  CHECK_THAT(err, Catch::Contains("[2/4] unchanged " + folder.in + "/b_clean.onnx: 0 BN folded"));
  const json report = json::parse(after.at("a_resnet_block.report.json"));
  CHECK(report["input"] == folder.in + "/a_resnet_block.onnx");
  CHECK(report["output"] == folder.in + "/a_resnet_block.onnx");
  CHECK(report["folds"].size() == 3);

  // Running again changes nothing more: the folded models are clean now.
  CHECK(runCommand(cli("fold " + folder.in + " --in-place --backup-suffix .orig"), &stdoutText, &err) == 2);
  const auto again = snapshot(folder.in);
  for (const std::string name : {"a_resnet_block.onnx", "a_resnet_block.onnx.orig", "nested/deeper/mlp_bn1d.onnx"})
    CHECK(again.at(name) == after.at(name));
  CHECK_THAT(err, Catch::Contains("[1/4] unchanged ") && Catch::Contains("4 models: 3 ok, 1 failed; 0 BN folded"));
}

TEST_CASE("batch fold --dry-run writes nothing and shows the plan on stdout", "[cli][batch]") {
  ModelFolder folder;
  const std::string out = folder.dir.file("out");
  const auto before = snapshot(folder.dir.path());
  std::string stdoutText, err;
  CHECK(runCommand(cli("fold " + folder.in + " --out-dir " + out + " --dry-run"), &stdoutText, &err) == 2);
  CHECK(snapshot(folder.dir.path()) == before);
  CHECK_FALSE(fs::exists(out));
  CHECK(err.empty());
  const auto plan = lines(stdoutText);
  REQUIRE(plan.size() == 6);
  CHECK(plan[0] == "[1/4] dry-run   " + folder.in + "/a_resnet_block.onnx -> " + out +
                       "/a_resnet_block.onnx: 3 BN folded, 0 expanded, 0 skipped, 0 other rewrites");
  CHECK_THAT(plan[2], Catch::StartsWith("[3/4] failed    " + folder.in + "/corrupt.onnx: "));
  CHECK_THAT(plan[4], Catch::StartsWith("dry run, nothing written: 4 models: 3 ok, 1 failed; 5 BN folded"));
  // Without a destination it still shows what the rules would do; in place neither.
  CHECK(runCommand(cli("fold " + folder.in + "/a_resnet_block.onnx --dry-run"), &stdoutText, &err) == 0);
  CHECK_THAT(stdoutText, Catch::StartsWith("[1/1] dry-run   " + folder.in + "/a_resnet_block.onnx: 3 BN folded"));
  CHECK(runCommand(cli("fold " + folder.in + " --in-place --dry-run"), &stdoutText, &err) == 2);
  CHECK(snapshot(folder.dir.path()) == before);
}

TEST_CASE("batch fold: -q keeps only the failures, and a terminal gets a progress bar", "[cli][batch]") {
  ModelFolder folder;
  std::string stdoutText, err;
  CHECK(runCommand(cli("-q fold " + folder.in + " --out-dir " + folder.dir.file("q")), &stdoutText, &err) == 2);
  const auto log = lines(err);
  REQUIRE(log.size() == 2);
  CHECK_THAT(log[0], Catch::StartsWith("[3/4] failed    "));
  CHECK_THAT(log[1], Catch::StartsWith("failed: " + folder.in + "/corrupt.onnx: "));

  if (runCommand("script -qec true /dev/null") != 0) {
    WARN("script(1) cannot allocate a pseudo-terminal here; the progress-bar half of this test is skipped");
    return;
  }
  // script(1) gives the command a terminal (stdout and stderr both end up in `stdoutText`).
  REQUIRE(runCommand("script -qec '" + cli("fold " + folder.in + " --out-dir " + folder.dir.file("tty")) + "' /dev/null",
                     &stdoutText, &err) == 2);
  CHECK_THAT(stdoutText, Catch::Contains("\r[") && Catch::Contains("] 4/4 ") &&
                             Catch::Contains("4 models: 3 ok, 1 failed") && Catch::Contains("failed: "));
  CHECK_THAT(stdoutText, !Catch::Contains("[1/4] ok"));  // the bar replaces the per-model lines
  CHECK(snapshot(folder.dir.file("tty")).size() == 6);
}

TEST_CASE("batch fold: usage errors exit 2 before anything is written", "[cli][batch]") {
  ModelFolder folder;
  const std::string a = sample("resnet_block.onnx"), b = sample("mlp_bn1d.onnx");
  const std::string out = folder.dir.file("out");
  std::string stdoutText, err;
  auto usageError = [&](const std::string& args, const std::string& expected) {
    INFO(args);
    CHECK(runCommand(cli(args), &stdoutText, &err) == 2);
    CHECK_THAT(err, Catch::Contains(expected));
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
    CHECK_FALSE(fs::exists(out));
  };
  usageError("fold " + a + " " + b + " -o " + out, "--out-dir");
  usageError("fold " + folder.in + " -o " + out, "folder");
  usageError("fold " + a + " " + b, "--output");
  usageError("fold " + a + " --out-dir " + out + " --in-place", "--in-place");
  usageError("fold " + a + " --out-dir " + out + " --report r.json", "--report-dir");
  usageError("fold " + a + " --out-dir " + out + " --backup-suffix .bak", "--backup-suffix");
  usageError("fold " + a + " --out-dir " + out + " --jobs -1", "--jobs");
  // Two inputs that would land on the same output.
  writeFile(folder.dir.file("other/a_resnet_block.onnx"), readFile(a));
  usageError("fold " + folder.in + " " + folder.dir.file("other") + " --out-dir " + out, "would both be written to");
}

TEST_CASE("fold --help shows the batch options and examples", "[cli][batch]") {
  std::string out, err;
  REQUIRE(runCommand(cli("fold --help"), &out, &err) == 0);
  CHECK_THAT(out, Catch::Contains("--out-dir") && Catch::Contains("--in-place") && Catch::Contains("--jobs") &&
                      Catch::Contains("--dry-run") && Catch::Contains("--backup-suffix") &&
                      Catch::Contains("--report-dir") && Catch::Contains("bnfold fold models/ --out-dir"));
}
