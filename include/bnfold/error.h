#pragma once
/// \file
/// The one error type the library throws. It carries the file it is about so the CLI can print one line.

#include <stdexcept>
#include <string>

namespace bnfold {

/// A problem with an input (or output) file: unreadable, invalid, inconsistent.
/// what() is "FILE: PROBLEM" (or just PROBLEM when no file is known).
class Error : public std::runtime_error {
 public:
  Error(std::string file, const std::string& problem)
      : std::runtime_error(file.empty() ? problem : file + ": " + problem),
        file_(std::move(file)),
        problem_(problem) {}

  const std::string& file() const { return file_; }
  const std::string& problem() const { return problem_; }

 private:
  std::string file_;
  std::string problem_;
};

}  // namespace bnfold
