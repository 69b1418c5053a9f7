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

/// The model being read cannot be read or is invalid: what loading throws (bnfold/io/model_io.h), so that a caller
/// can tell a bad input from a problem with an output or an option.
class InvalidModelError : public Error {
 public:
  using Error::Error;
};

}  // namespace bnfold
