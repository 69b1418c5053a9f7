#include "test_support.h"

#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <catch2/catch.hpp>
#include <onnx/defs/parser.h>

#include "bnfold/check/findings.h"

namespace bnfold::test {
namespace fs = std::filesystem;

std::string sourceDir() { return BNFOLD_TEST_SOURCE_DIR; }
std::string bnfoldExecutable() { return BNFOLD_TEST_EXECUTABLE; }

onnx::ModelProto parseModelProto(const std::string& text) {
  onnx::ModelProto proto;
  auto status = onnx::OnnxParser::Parse(proto, text.c_str());
  if (!status.IsOK()) throw std::runtime_error("ONNX text does not parse: " + status.ErrorMessage());
  return proto;
}

std::unique_ptr<Model> parseModel(const std::string& text) {
  return modelFromProto(parseModelProto(text), "<onnx text>", ".");
}

std::string opSequence(const Graph& graph) {
  std::string out;
  for (const auto& node : graph.nodes()) out += (out.empty() ? "" : ",") + node->opType();
  return out;
}

int countOps(Model& model, const std::string& opType) {
  int count = 0;
  for (Graph* graph : model.allGraphs())
    for (const auto& node : graph->nodes()) count += node->opType() == opType;
  return count;
}

const Node* findNode(const Graph& graph, const std::string& opType) {
  for (const auto& node : graph.nodes())
    if (node->opType() == opType) return node.get();
  return nullptr;
}

const Node* findNodeByName(Model& model, const std::string& name) {
  for (Graph* graph : model.allGraphs())
    for (const auto& node : graph->nodes())
      if (node->name() == name) return node.get();
  return nullptr;
}

Report applyRules(Model& model, const std::vector<std::string>& rules, const RuleOptions& options) {
  Report report;
  DriverOptions driverOptions;
  driverOptions.rules = rules;
  driverOptions.ruleOptions = options;
  driverOptions.verify = true;
  runRules(model, driverOptions, report);
  model.graph().verify();
  // Every rewrite of every rule test is also checked by --verify: it must pass wherever the rules rewrite.
  for (const Finding& failure : failedVerifications(report)) FAIL_CHECK(failure.message);
  return report;
}

TempDir::TempDir() {
  std::string pattern = (fs::temp_directory_path() / "bnfold-test-XXXXXX").string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("cannot create a temp folder");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

int validateReports(const std::vector<std::string>& files, std::string* out) {
  auto quoted = [](const std::string& text) {
    std::string result = "'";
    for (char c : text) result += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return result + "'";
  };
  std::string command = "/usr/bin/python3 " + quoted(sourceDir() + "/scripts/validate_report.py");
  for (const auto& file : files) command += " " + quoted(file);
  std::string err;
  const int code = runCommand(command, out, &err);
  *out += err;
  return code;
}

int runCommand(const std::string& command, std::string* out, std::string* err) {
  TempDir dir;
  const std::string outFile = dir.file("stdout"), errFile = dir.file("stderr");
  const int status = std::system((command + " >" + outFile + " 2>" + errFile).c_str());
  auto slurp = [](const std::string& path) {
    std::ifstream in(path);
    std::stringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
  };
  if (out) *out = slurp(outFile);
  if (err) *err = slurp(errFile);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

namespace {

/// One `node compare.js --serve` for the whole test process, started on the first comparison: loading Node and ONNX
/// Runtime costs far more than comparing two small models. Requests and answers are JSON lines over a socket pair.
/// A server that died (or was never reachable) is started again for the next request.
class OrtServer {
 public:
  ~OrtServer() { stop(); }

  /// The answer line to one request line, or nothing when the server could not be started or died meanwhile.
  std::optional<std::string> ask(const std::string& request, std::string* failure) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (socket_ < 0 && !start(failure)) return std::nullopt;
      if (auto answer = exchange(request)) return answer;
      *failure = "compare.js --serve stopped (" + stop() + ")";
    }
    return std::nullopt;
  }

 private:
  bool start(std::string* failure) {
    int ends[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) {
      *failure = std::string("socketpair: ") + std::strerror(errno);
      return false;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    // dup2 clears close-on-exec on the copies, so the server keeps only its end, as stdin and stdout.
    posix_spawn_file_actions_adddup2(&actions, ends[1], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, ends[1], STDOUT_FILENO);
    const std::string script = sourceDir() + "/scripts/ort/compare.js";
    char* argv[] = {const_cast<char*>("node"), const_cast<char*>(script.c_str()), const_cast<char*>("--serve"),
                    nullptr};
    const int spawned = posix_spawnp(&pid_, "node", &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(ends[1]);
    if (spawned != 0) {
      close(ends[0]);
      pid_ = -1;
      *failure = std::string("cannot start node: ") + std::strerror(spawned);
      return false;
    }
    socket_ = ends[0];
    pending_.clear();
    return true;
  }

  std::optional<std::string> exchange(const std::string& request) {
    const std::string line = request + "\n";
    for (std::size_t sent = 0; sent < line.size();) {
      // MSG_NOSIGNAL: a server that died must not take the test process down with SIGPIPE.
      const ssize_t n = send(socket_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return std::nullopt;
      sent += static_cast<std::size_t>(n);
    }
    for (;;) {
      const std::size_t end = pending_.find('\n');
      if (end != std::string::npos) {
        std::string answer = pending_.substr(0, end);
        pending_.erase(0, end + 1);
        return answer;
      }
      char buffer[65536];
      const ssize_t n = recv(socket_, buffer, sizeof buffer, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return std::nullopt;
      pending_.append(buffer, static_cast<std::size_t>(n));
    }
  }

  /// Ends the server (end of input makes it exit) and says how it ended.
  std::string stop() {
    if (socket_ >= 0) close(socket_);
    socket_ = -1;
    if (pid_ <= 0) return "not running";
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
    return "exit code " + std::to_string(WEXITSTATUS(status));
  }

  pid_t pid_ = -1;
  int socket_ = -1;
  std::string pending_;
};

}  // namespace

OrtComparison compareInOrt(const std::string& modelA, const std::string& modelB, double atol, double rtol) {
  static OrtServer server;
  OrtComparison result;
  const nlohmann::json request = {{"a", modelA}, {"b", modelB}, {"atol", atol}, {"rtol", rtol}};
  std::string failure;
  const std::optional<std::string> answer = server.ask(request.dump(), &failure);
  if (!answer) {
    result.error = failure;
    return result;
  }
  try {
    result.details = nlohmann::json::parse(*answer);
  } catch (const std::exception&) {
    result.error = "compare.js --serve answered what is not JSON: " + *answer;
    return result;
  }
  if (result.details.contains("error") && !result.details["error"].is_null())
    result.error = result.details["error"].dump();
  for (const auto& output : result.details.value("outputs", nlohmann::json::array())) {
    if (output.contains("max_abs") && output["max_abs"].is_number())
      result.maxAbs = std::max(result.maxAbs, output["max_abs"].get<double>());
    if (output.contains("max_rel") && output["max_rel"].is_number())
      result.maxRel = std::max(result.maxRel, output["max_rel"].get<double>());
  }
  result.ok = result.error.empty() && result.details.value("ok", false);
  if (!result.ok && result.error.empty()) result.error = "outputs differ: " + result.details.dump();
  return result;
}

FoldOutcome applyRulesAndCompare(Model& model, const std::vector<std::string>& rules, double atol, double rtol,
                                 const RuleOptions& options) {
  TempDir dir;
  saveModel(model, dir.file("original.onnx"));
  FoldOutcome outcome{applyRules(model, rules, options), {}};
  saveModel(model, dir.file("rewritten.onnx"));
  outcome.comparison = compareInOrt(dir.file("original.onnx"), dir.file("rewritten.onnx"), atol, rtol);
  return outcome;
}

std::string cli(const std::string& args) { return bnfoldExecutable() + " " + args; }

std::string sample(const std::string& name) { return sourceDir() + "/models/" + name; }

std::string readFile(const std::string& path) {
  if (!std::filesystem::is_regular_file(path)) return {};
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void writeFile(const std::string& path, const std::string& bytes) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream(path, std::ios::binary) << bytes;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) out.push_back(line);
  return out;
}

}  // namespace bnfold::test
