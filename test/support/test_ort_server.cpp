// compareInOrt's ONNX Runtime server (one `compare.js --serve` per test process): comparisons give the same verdicts
// as the command line, a comparison that cannot run says why, and a server that died is replaced.

#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "test_support.h"

using namespace bnfold::test;

namespace {

/// Process ids of this process's children whose command line names compare.js (the server), read from /proc.
std::vector<pid_t> ortServerChildren() {
  std::vector<pid_t> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream statFile(entry.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(statFile)), {});
    // pid (comm) state ppid ...: comm may hold spaces, so read after its closing parenthesis.
    const std::size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    pid_t parent = 0;
    rest >> state >> parent;
    if (parent != getpid()) continue;
    std::ifstream cmdlineFile(entry.path() / "cmdline");
    const std::string cmdline((std::istreambuf_iterator<char>(cmdlineFile)), {});
    if (cmdline.find("compare.js") != std::string::npos) found.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return found;
}

}  // namespace

TEST_CASE("ORT server: equal models pass, a changed one fails, a missing file is an error", "[ort-server]") {
  const std::string original = sample("resnet_block.onnx");
  TempDir dir;
  const std::string folded = dir.file("folded.onnx");
  REQUIRE(runCommand(cli("fold '" + original + "' -o '" + folded + "' -q")) == 0);

  const OrtComparison same = compareInOrt(original, original, 0, 0);
  INFO(same.error);
  CHECK(same.ok);
  CHECK(same.maxAbs == 0);

  // Folding rounds the weights: equal within the usual tolerance, not bit for bit.
  CHECK(compareInOrt(original, folded, 1e-5, 1e-4).ok);
  const OrtComparison exact = compareInOrt(original, folded, 0, 0);
  CHECK_FALSE(exact.ok);
  CHECK(exact.maxAbs > 0);

  const OrtComparison missing = compareInOrt(dir.file("nothing.onnx"), original, 0, 0);
  CHECK_FALSE(missing.ok);
  CHECK_THAT(missing.error, Catch::Contains("no such file"));
}

TEST_CASE("ORT server: a server that died is started again for the next comparison", "[ort-server]") {
  const std::string model = sample("resnet_block.onnx");
  REQUIRE(compareInOrt(model, model, 0, 0).ok);
  const std::vector<pid_t> before = ortServerChildren();
  REQUIRE(before.size() == 1);

  REQUIRE(kill(before[0], SIGKILL) == 0);
  const OrtComparison again = compareInOrt(model, model, 0, 0);
  INFO(again.error);
  CHECK(again.ok);
  const std::vector<pid_t> after = ortServerChildren();
  REQUIRE(after.size() == 1);
  CHECK(after[0] != before[0]);
}
