#include "bnfold/io/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "bnfold/error.h"

namespace bnfold {
namespace fs = std::filesystem;

namespace {

std::string systemError(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// The process umask, read once: reading it means setting it, which other threads must never see half done.
mode_t processUmask() {
  static const mode_t mask = [] {
    const mode_t current = umask(0);
    umask(current);
    return current;
  }();
  return mask;
}

std::string folderOf(const std::string& path) {
  const fs::path target(path);
  return target.has_parent_path() ? target.parent_path().string() : std::string(".");
}

std::string linkTarget(const std::string& path) {
  std::error_code ec;
  const fs::path target = fs::read_symlink(path, ec);
  return ec ? std::string("?") : target.string();
}

}  // namespace

Destination destinationOf(const std::string& path) {
  if (path.empty()) throw Error("", "an output path is empty");
  if (path.back() == '/') throw Error(path, "ends in '/', so it names a folder; give the name of a file to write");
  struct stat link {};
  if (::lstat(path.c_str(), &link) != 0) {
    if (errno != ENOENT) throw Error(path, systemError("cannot write"));
    const std::string folder = folderOf(path);
    std::error_code ec;
    if (!fs::is_directory(folder, ec)) throw Error(path, "cannot write: folder '" + folder + "' does not exist");
    return Destination::Absent;
  }
  struct stat target {};
  if (::stat(path.c_str(), &target) != 0) {
    if (errno == ENOENT && S_ISLNK(link.st_mode))
      throw Error(path, "is a symbolic link to '" + linkTarget(path) +
                            "', which does not exist; bnfold does not create files through dangling links");
    throw Error(path, systemError("cannot write"));
  }
  if (S_ISDIR(target.st_mode)) throw Error(path, "is a folder; give the name of a file to write");
  if (S_ISREG(target.st_mode)) return Destination::RegularFile;
  if (S_ISCHR(target.st_mode) || S_ISBLK(target.st_mode) || S_ISFIFO(target.st_mode)) return Destination::SpecialFile;
  if (S_ISSOCK(target.st_mode))
    throw Error(path, "is a socket; bnfold writes to regular files, devices and FIFOs only");
  throw Error(path, "is not a regular file, device or FIFO; bnfold does not write to it");
}

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  const Destination destination = destinationOf(path_);
  if (destination == Destination::SpecialFile) {
    // Like cp: write into the device or FIFO (a FIFO's open waits for its reader); never replace it.
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);
    if (fd_ < 0) throw Error(path_, systemError("cannot open for writing"));
    targetPath_ = path_;
    return;
  }
  mode_t mode = 0666 & ~processUmask();
  struct stat existing {};
  bool replacing = false;
  targetPath_ = path_;
  if (destination == Destination::RegularFile) {
    // Follow symbolic links: the file they name is replaced, the links stay.
    char resolved[PATH_MAX];
    if (::realpath(path_.c_str(), resolved) == nullptr) throw Error(path_, systemError("cannot write"));
    targetPath_ = resolved;
    replacing = ::stat(targetPath_.c_str(), &existing) == 0 && S_ISREG(existing.st_mode);
    if (replacing) mode = existing.st_mode & 07777;
  }
  const fs::path target(targetPath_);
  std::string pattern = (fs::path(folderOf(targetPath_)) / ("." + target.filename().string() + ".tmp.XXXXXX")).string();
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  fd_ = ::mkostemp(buffer.data(), O_CLOEXEC);
  if (fd_ < 0) throw Error(path_, systemError("cannot write"));
  tempPath_ = buffer.data();
  // mkstemp creates 0600: give the file the mode a plain create (or the replaced file) has.
  if (replacing) {
    // Keeps a root-run replace from handing a user's file to root; refused for non-root callers, which is fine.
    const int ignored = ::fchown(fd_, existing.st_uid, existing.st_gid);
    (void)ignored;
  }
  ::fchmod(fd_, mode);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !tempPath_.empty()) ::unlink(tempPath_.c_str());
}

void AtomicFile::write(const char* bytes, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd_, bytes, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(path_, systemError("cannot write"));
    }
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
}

void AtomicFile::commit() {
  if (fd_ >= 0) {
    const int result = ::close(fd_);
    fd_ = -1;
    if (result != 0) throw Error(path_, systemError("cannot write"));
  }
  if (!tempPath_.empty() && std::rename(tempPath_.c_str(), targetPath_.c_str()) != 0)
    throw Error(path_, systemError("cannot rename the written file into place"));
  committed_ = true;
}

void writeFileAtomically(const std::string& path, const std::string& contents) {
  AtomicFile file(path);
  file.write(contents.data(), contents.size());
  file.commit();
}

void copyFileAtomically(const std::string& from, const std::string& to) {
  const int source = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (source < 0) throw Error(from, systemError("cannot read"));
  try {
    AtomicFile file(to);
    std::vector<char> chunk(1 << 20);
    for (;;) {
      const ssize_t n = ::read(source, chunk.data(), chunk.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw Error(from, systemError("cannot read"));
      if (n == 0) break;
      file.write(chunk.data(), static_cast<std::size_t>(n));
    }
    file.commit();
  } catch (...) {
    ::close(source);
    throw;
  }
  ::close(source);
}

void removeWrittenFile(const std::string& path) {
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) return;
  struct stat info {};
  if (::stat(resolved, &info) == 0 && S_ISREG(info.st_mode)) ::unlink(resolved);
}

}  // namespace bnfold
