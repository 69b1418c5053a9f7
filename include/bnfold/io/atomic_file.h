#pragma once
// A file written under a temporary name in its destination folder and renamed into place by commit(), so
// readers never see a partial file. Without commit() the temporary file is removed.

#include <string>

namespace bnfold {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  /// Flushes, closes and renames the temporary file to the destination. Throws bnfold::Error on failure.
  void commit();

 private:
  std::string path_;
  std::string tempPath_;
  int fd_ = -1;
  bool committed_ = false;
};

/// Writes `contents` to `path` atomically.
void writeFileAtomically(const std::string& path, const std::string& contents);

}  // namespace bnfold
