#pragma once
// Terminal helpers for the CLI: whether a stream is a terminal, colour that respects NO_COLOR and never reaches
// a pipe or file, a progress bar for stderr, and short duration text.

#include <cstdio>
#include <mutex>
#include <string>

namespace bnfold::cli {

/// True when `stream` is a terminal.
bool isTerminal(std::FILE* stream);

/// True when escape codes may be written to `stream`: it is a terminal, NO_COLOR is unset or empty
/// (https://no-color.org) and TERM is not "dumb".
bool colourAllowed(std::FILE* stream);

enum class Colour { Red, Yellow, Green, Cyan, Bold, Dim };

/// Wraps text in escape codes, or leaves it alone when colour is off.
class Painter {
 public:
  explicit Painter(bool enabled) : enabled_(enabled) {}
  std::string operator()(Colour colour, const std::string& text) const;
  bool enabled() const { return enabled_; }

 private:
  bool enabled_;
};

/// A one-line progress bar redrawn in place on a terminal ("\r[#####.....] 5/10 name"). Thread-safe.
class ProgressBar {
 public:
  ProgressBar(std::FILE* stream, std::size_t total);
  /// Redraws with `done` items finished; `label` names the last one.
  void update(std::size_t done, const std::string& label);
  /// Erases the bar so ordinary lines can follow.
  void clear();

 private:
  std::FILE* stream_;
  std::size_t total_;
  std::mutex mutex_;
  bool drawn_ = false;
};

/// "0.42 s", "12.3 s", "2 min 05 s".
std::string formatDuration(double seconds);

}  // namespace bnfold::cli
