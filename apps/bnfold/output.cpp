#include "output.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace bnfold::cli {

bool isTerminal(std::FILE* stream) { return ::isatty(::fileno(stream)) == 1; }

bool colourAllowed(std::FILE* stream) {
  const char* noColour = std::getenv("NO_COLOR");
  if (noColour && *noColour) return false;
  const char* term = std::getenv("TERM");
  if (term && std::strcmp(term, "dumb") == 0) return false;
  return isTerminal(stream);
}

std::string Painter::operator()(Colour colour, const std::string& text) const {
  if (!enabled_) return text;
  const char* code = "";
  switch (colour) {
    case Colour::Red: code = "\033[31m"; break;
    case Colour::Yellow: code = "\033[33m"; break;
    case Colour::Green: code = "\033[32m"; break;
    case Colour::Cyan: code = "\033[36m"; break;
    case Colour::Bold: code = "\033[1m"; break;
    case Colour::Dim: code = "\033[2m"; break;
  }
  return code + text + "\033[0m";
}

namespace {
int terminalWidth(std::FILE* stream) {
  winsize size{};
  if (::ioctl(::fileno(stream), TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}
}  // namespace

ProgressBar::ProgressBar(std::FILE* stream, std::size_t total) : stream_(stream), total_(total) {}

void ProgressBar::update(std::size_t done, const std::string& label) {
  std::lock_guard<std::mutex> lock(mutex_);
  constexpr std::size_t kBarWidth = 24;
  const std::size_t filled = total_ == 0 ? kBarWidth : done * kBarWidth / total_;
  std::string line = "[" + std::string(filled, '#') + std::string(kBarWidth - filled, '.') + "] " +
                     std::to_string(done) + "/" + std::to_string(total_) + " " + label;
  // Never wrap: a wrapped line cannot be redrawn with '\r'.
  const std::size_t width = static_cast<std::size_t>(terminalWidth(stream_)) - 1;
  if (line.size() > width) line = line.substr(0, width);
  // "\033[K" erases what a longer previous label left behind.
  std::fprintf(stream_, "\r%s\033[K", line.c_str());
  std::fflush(stream_);
  drawn_ = true;
}

void ProgressBar::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!drawn_) return;
  std::fprintf(stream_, "\r\033[K");
  std::fflush(stream_);
  drawn_ = false;
}

std::string formatDuration(double seconds) {
  char text[32];
  if (seconds < 10) std::snprintf(text, sizeof text, "%.2f s", seconds);
  else if (seconds < 60) std::snprintf(text, sizeof text, "%.1f s", seconds);
  else {
    const long total = std::lround(seconds);
    std::snprintf(text, sizeof text, "%ld min %02ld s", total / 60, total % 60);
  }
  return text;
}

}  // namespace bnfold::cli
