#pragma once
/// \file
/// Writing an output file so that nothing is lost: every file bnfold writes (models, external data, reports,
/// backups) goes through AtomicFile. What happens depends on what is at the destination path now:
/// - nothing, or a regular file: the bytes go to a temporary file in the same folder, renamed over the path by
///   commit(), so readers never see a partial file. An existing file's permission bits (and, when allowed, its
///   owner) carry over; hard links to the old file keep the old contents, as with `sed -i`.
/// - a symbolic link (or a chain of them) to a regular file: the file it finally names is replaced as above, in
///   that file's folder; the link stays. A link to nothing is refused: creating files through dangling links
///   is how symlink attacks work.
/// - a character or block device, or a FIFO: written directly, as `cp` does, so `-o /dev/null` and
///   `-o /dev/stdout` work; the device is never replaced. Such a write is not atomic.
/// - a folder, a path ending in '/', a socket: bnfold::Error before anything is written.

#include <cstddef>
#include <string>

namespace bnfold {

/// What a destination path names now, after following symbolic links.
enum class Destination {
  Absent,       ///< nothing there: a new regular file is created
  RegularFile,  ///< replaced through a temporary file and a rename
  SpecialFile,  ///< a device or FIFO: written into directly
};

/// Classifies `path` for writing; throws bnfold::Error (naming `path`) for a folder, a trailing '/', a socket,
/// a dangling symbolic link or a folder that does not exist.
Destination destinationOf(const std::string& path);

class AtomicFile {
 public:
  /// Opens the destination for writing (see the file comment). Throws bnfold::Error naming `path`.
  explicit AtomicFile(std::string path);
  ~AtomicFile();  ///< without commit(): the temporary file is removed, the destination is untouched
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  /// True when the destination is a device or FIFO written directly (not atomic, nothing to rename).
  bool writesDirectly() const { return tempPath_.empty(); }
  /// Writes all of `bytes` at the current position. Throws bnfold::Error with the system's reason
  /// (e.g. "No space left on device").
  void write(const char* bytes, std::size_t size);
  /// Flushes, closes and renames the temporary file over the destination. Throws bnfold::Error on failure.
  void commit();

 private:
  std::string path_;        // as given: messages name it
  std::string targetPath_;  // the file replaced: `path_` with symbolic links followed
  std::string tempPath_;    // empty when writing directly into a device or FIFO
  int fd_ = -1;
  bool committed_ = false;
};

/// Writes `contents` to `path` through an AtomicFile.
void writeFileAtomically(const std::string& path, const std::string& contents);
/// Copies the regular file `from` to `to` through an AtomicFile (used for --in-place backups).
void copyFileAtomically(const std::string& from, const std::string& to);
/// Removes a file this run wrote at `path` (a regular file, or the regular file a link names); leaves devices,
/// FIFOs and everything else alone. Used when a run must leave no partial result.
void removeWrittenFile(const std::string& path);

}  // namespace bnfold
