// The bnfold command line as a user meets it: help, version, info, fold --rules none, usage errors.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "bnfold/version.h"
#include "test_support.h"

using bnfold::test::runCommand;
using bnfold::test::TempDir;

using bnfold::test::cli;
using bnfold::test::sample;
using bnfold::test::readFile;

TEST_CASE("the version flag prints the version", "[cli]") {
  std::string out;
  CHECK(runCommand(cli("--version"), &out) == 0);
  CHECK(out == std::string("bnfold ") + bnfold::kVersion + "\n");
}

TEST_CASE("cli: --help shows examples and exit codes", "[cli]") {
  std::string out;
  CHECK(runCommand(cli("--help"), &out) == 0);
  CHECK_THAT(out, Catch::Contains("Examples:") && Catch::Contains("bnfold fold model.onnx -o") &&
                      Catch::Contains("Exit codes:") && Catch::Contains("2  usage error"));
  CHECK(runCommand(cli("fold --help"), &out) == 0);
  CHECK_THAT(out, Catch::Contains("--rules") && Catch::Contains("--keep") && Catch::Contains("--report"));
}

TEST_CASE("usage errors exit 2 with one line", "[cli]") {
  std::string out, err;
  CHECK(runCommand(cli(""), &out, &err) == 2);
  CHECK(runCommand(cli("fold " + sample("resnet_block.onnx")), &out, &err) == 2);  // no -o
  CHECK_THAT(err, Catch::Contains("--output"));
  CHECK(runCommand(cli("frobnicate"), &out, &err) == 2);
  TempDir dir;
  CHECK(runCommand(cli("fold " + sample("resnet_block.onnx") + " -o " + dir.file("o.onnx") + " --rules no-such-rule"),
                   &out, &err) == 2);
  CHECK_THAT(err, Catch::Contains("unknown rule 'no-such-rule'"));
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  CHECK_FALSE(std::filesystem::exists(dir.file("o.onnx")));
}

TEST_CASE("info reports opsets, an op histogram and BatchNormalization producers", "[cli]") {
  std::string out;
  REQUIRE(runCommand(cli("info " + sample("resnet_block.onnx")), &out) == 0);
  CHECK_THAT(out, Catch::Contains("ai.onnx=13") && Catch::Contains("BatchNormalization: 3 (input produced by: Conv 3)"));
  REQUIRE(runCommand(cli("info --json " + sample("unfoldable_bn.onnx")), &out) == 0);
  auto info = nlohmann::json::parse(out);
  CHECK(info["opsets"]["ai.onnx"] == 13);
  const auto& producers = info["batch_normalization"]["input_producers"];
  CHECK(info["batch_normalization"]["count"] == 3);
  CHECK(producers.contains("(graph input)"));
  CHECK(producers.contains("Relu"));
  int64_t histogramTotal = 0;
  for (const auto& op : info["ops"]) histogramTotal += op["count"].get<int64_t>();
  CHECK(histogramTotal == info["nodes"].get<int64_t>());
}

TEST_CASE("fold --rules none is a pure round trip that still writes a report", "[cli]") {
  TempDir dir;
  std::string out, err;
  const std::string input = sample("resnet_block.onnx");
  REQUIRE(runCommand(cli("fold " + input + " -o " + dir.file("rt.onnx") + " --report " + dir.file("r.json") +
                            " --rules none"),
                     &out, &err) == 0);
  CHECK(err.empty());  // quiet by default: warnings only
  CHECK(readFile(dir.file("rt.onnx")) == readFile(input));
  auto report = nlohmann::json::parse(readFile(dir.file("r.json")));
  CHECK(report["folds"].empty());
  CHECK(report["input"] == input);
  CHECK(report["output"] == dir.file("rt.onnx"));
  CHECK(report["opset"] == 13);
  CHECK(report["rules"].empty());
  CHECK(report["skipped"].size() == 3);
  CHECK(report["skipped"][0]["reason"] == "no-rule-enabled");
}

TEST_CASE("fold refuses to overwrite its input", "[cli]") {
  TempDir dir;
  std::filesystem::copy_file(sample("resnet_block.onnx"), dir.file("m.onnx"));
  const std::string before = readFile(dir.file("m.onnx"));
  std::string out, err;
  CHECK(runCommand(cli("fold " + dir.file("m.onnx") + " -o " + dir.file("m.onnx")), &out, &err) == 2);
  CHECK_THAT(err, Catch::Contains("overwrite the input"));
  CHECK(readFile(dir.file("m.onnx")) == before);
}

TEST_CASE("verbose logs go to stderr, quiet silences them, stdout stays clean", "[cli]") {
  TempDir dir;
  std::string out, err;
  REQUIRE(runCommand(cli("-v fold " + sample("resnet_block.onnx") + " -o " + dir.file("a.onnx")), &out, &err) == 0);
  CHECK(out.empty());
  CHECK_THAT(err, Catch::Contains("bnfold: info:"));
  REQUIRE(runCommand(cli("-q fold " + sample("resnet_block.onnx") + " -o " + dir.file("b.onnx")), &out, &err) == 0);
  CHECK(err.empty());
}

TEST_CASE("fold --timings prints load, rules and save times on stderr even with -q", "[cli]") {
  TempDir dir;
  std::string out, err;
  REQUIRE(runCommand(cli("-q fold " + sample("resnet_block.onnx") + " -o " + dir.file("a.onnx") + " --timings"), &out,
                     &err) == 0);
  CHECK(out.empty());
  const std::regex line(R"(bnfold: timings: load [0-9.]+ s, rules [0-9.]+ s, save [0-9.]+ s, total [0-9.]+ s\n)");
  CHECK(std::regex_match(err, line));
  // Several models: one line per model, named.
  REQUIRE(runCommand(cli("-q fold " + sample("resnet_block.onnx") + " " + sample("unfoldable_bn.onnx") +
                         " --out-dir " + dir.file("out") + " --timings --jobs 1"),
                     &out, &err) == 0);
  CHECK_THAT(err, Catch::Contains("bnfold: timings: " + sample("resnet_block.onnx") + ": load ") &&
                      Catch::Contains("bnfold: timings: " + sample("unfoldable_bn.onnx") + ": load "));
  // Without the flag, nothing.
  REQUIRE(runCommand(cli("-q fold " + sample("resnet_block.onnx") + " -o " + dir.file("b.onnx")), &out, &err) == 0);
  CHECK(err.empty());
}
