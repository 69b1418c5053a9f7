// Runs onnx::checker on model files (the C++ checker of the libonnx we build against).
//   bnfold_onnx_check MODEL   exit 0 when it passes, 1 with the checker's message on one line when it does not,
//                             2 when the file cannot be read.
//   bnfold_onnx_check --serve reads one model path per line on stdin and answers each on one line of stdout:
//                             "ok", "fail MESSAGE" or "error MESSAGE" (the exit codes 0, 1, 2 above). One process
//                             serves a whole test run: libonnx registers every op schema at start-up, which costs
//                             more than checking a small model.

#include <cstdio>
#include <iostream>
#include <string>

#include <onnx/checker.h>

namespace {

enum class Verdict { kPasses = 0, kFails = 1, kUnreadable = 2 };

std::string oneLine(std::string text) {
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return text;
}

Verdict check(const std::string& path, std::string& message) {
  try {
    onnx::checker::check_model(path);
    return Verdict::kPasses;
  } catch (const onnx::checker::ValidationError& error) {
    message = oneLine(error.what());
    return Verdict::kFails;
  } catch (const std::exception& error) {
    message = oneLine(error.what());
    return Verdict::kUnreadable;
  }
}

int serve() {
  std::string path;
  while (std::getline(std::cin, path)) {
    std::string message;
    switch (check(path, message)) {
      case Verdict::kPasses: std::cout << "ok\n"; break;
      case Verdict::kFails: std::cout << "fail " << path << ": " << message << '\n'; break;
      case Verdict::kUnreadable: std::cout << "error " << path << ": " << message << '\n'; break;
    }
    std::cout.flush();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL.onnx | --serve\n", argv[0]);
    return 2;
  }
  const std::string argument = argv[1];
  if (argument == "--serve") return serve();
  std::string message;
  const Verdict verdict = check(argument, message);
  if (verdict != Verdict::kPasses) std::fprintf(stderr, "%s: %s\n", argument.c_str(), message.c_str());
  return static_cast<int>(verdict);
}
