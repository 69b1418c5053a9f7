#include "atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "bnfold/error.h"

namespace bnfold {
namespace fs = std::filesystem;

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  const fs::path target(path_);
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(folder, ec)) throw Error(path_, "cannot write: folder '" + folder.string() + "' does not exist");
  std::string pattern = (folder / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  fd_ = mkstemp(buffer.data());
  if (fd_ < 0) throw Error(path_, std::string("cannot write: ") + std::strerror(errno));
  tempPath_ = buffer.data();
  // mkstemp creates 0600; give the file the mode a plain create would have.
  const mode_t mask = umask(0);
  umask(mask);
  fchmod(fd_, 0666 & ~mask);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) close(fd_);
  if (!committed_ && !tempPath_.empty()) unlink(tempPath_.c_str());
}

void AtomicFile::commit() {
  if (fd_ >= 0) {
    const int result = close(fd_);
    fd_ = -1;
    if (result != 0) throw Error(path_, std::string("cannot write: ") + std::strerror(errno));
  }
  if (std::rename(tempPath_.c_str(), path_.c_str()) != 0)
    throw Error(path_, std::string("cannot rename the written file into place: ") + std::strerror(errno));
  committed_ = true;
}

void writeFileAtomically(const std::string& path, const std::string& contents) {
  AtomicFile file(path);
  std::size_t written = 0;
  while (written < contents.size()) {
    const ssize_t n = ::write(file.fd(), contents.data() + written, contents.size() - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(path, std::string("cannot write: ") + std::strerror(errno));
    }
    written += static_cast<std::size_t>(n);
  }
  file.commit();
}

}  // namespace bnfold
