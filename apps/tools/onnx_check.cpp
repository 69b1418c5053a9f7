// Runs onnx::checker on a model file (the C++ checker of the libonnx we build against). Exit 0 when it
// passes, 1 with the checker's message on one line when it does not, 2 when the file cannot be read.

#include <cstdio>
#include <string>

#include <onnx/checker.h>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s MODEL.onnx\n", argv[0]);
    return 2;
  }
  try {
    onnx::checker::check_model(std::string(argv[1]));
  } catch (const onnx::checker::ValidationError& error) {
    std::string message = error.what();
    for (char& c : message)
      if (c == '\n') c = ' ';
    std::fprintf(stderr, "%s: %s\n", argv[1], message.c_str());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s: %s\n", argv[1], error.what());
    return 2;
  }
  return 0;
}
