// Destinations that are not regular files (issue 14): bnfold often runs as root in CI containers, where replacing
// a device node such as /dev/null with a regular file breaks every later program. Devices and FIFOs are written
// into, symbolic links are followed, folders, sockets and dangling links are refused. Every special file here is
// made by the test in its own temp folder, never a system path.

#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>

#include "test_support.h"

using bnfold::test::cli;
using bnfold::test::readFile;
using bnfold::test::runCommand;
using bnfold::test::sample;
using bnfold::test::TempDir;
namespace fs = std::filesystem;

namespace {

const std::string kModel = "resnet_block.onnx";

mode_t typeOf(const std::string& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return 0;
  return info.st_mode & S_IFMT;
}

// The names in `dir`, so a test can see that no temporary file was left behind.
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A character device like /dev/null (1,3) or /dev/full (1,7), made in the test's folder. Needs root (CI runs
// as root); without it the test says so and checks nothing else.
bool makeCharDevice(const std::string& path, unsigned minor) {
  if (::mknod(path.c_str(), S_IFCHR | 0666, makedev(1, minor)) == 0) return true;
  WARN("cannot make a device node here (not root?): " << std::strerror(errno));
  return false;
}

// The bytes `fold` writes for the sample model to a regular file: what a special destination must receive.
std::string foldedBytes(const TempDir& dir) {
  const std::string path = dir.file("reference.onnx");
  REQUIRE(runCommand(cli("fold " + sample(kModel) + " -o " + path)) == 0);
  std::string bytes = readFile(path);
  fs::remove(path);
  return bytes;
}

int fold(const std::string& args, std::string* err) {
  std::string out;
  return runCommand(cli("fold " + args), &out, err);
}

}  // namespace

TEST_CASE("special files: -o and --report onto a device node write into it and leave it a device",
          "[cli][special-files]") {
  TempDir dir;
  const std::string null = dir.file("null");
  if (!makeCharDevice(null, 3)) return;
  std::string err;
  CHECK(fold(sample(kModel) + " -o " + null + " --report " + null, &err) == 0);
  CHECK(err.empty());
  CHECK(typeOf(null) == S_IFCHR);
  CHECK(entries(dir.path()) == std::vector<std::string>{"null"});
}

TEST_CASE("a full device gives 'No space left on device', exit 2, and stays a device", "[cli][special-files]") {
  TempDir dir;
  const std::string full = dir.file("full");
  if (!makeCharDevice(full, 7)) return;
  std::string err;
  CHECK(fold(sample(kModel) + " -o " + full, &err) == 2);
  CHECK_THAT(err, Catch::Contains(full) && Catch::Contains("No space left on device"));
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  CHECK(typeOf(full) == S_IFCHR);
  CHECK(entries(dir.path()) == std::vector<std::string>{"full"});
}

TEST_CASE("special files: -o onto a FIFO streams the model to its reader and leaves the FIFO",
          "[cli][special-files]") {
  TempDir dir;
  const std::string expected = foldedBytes(dir);
  const std::string fifo = dir.file("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::string err;
  const int code = runCommand("cat " + fifo + " > " + dir.file("received.onnx") + " & " + cli("fold " + sample(kModel) +
                              " -o " + fifo) + "; status=$?; wait; exit $status", nullptr, &err);
  CHECK(code == 0);
  CHECK(typeOf(fifo) == S_IFIFO);
  CHECK(readFile(dir.file("received.onnx")) == expected);
  CHECK(entries(dir.path()) == std::vector<std::string>{"pipe", "received.onnx"});
}

TEST_CASE("a model is read from a pipe", "[cli][special-files]") {
  TempDir dir;
  const std::string expected = foldedBytes(dir);
  std::string err;
  CHECK(runCommand("cat " + sample(kModel) + " | " + cli("fold /dev/stdin -o " + dir.file("out.onnx")), nullptr,
                   &err) == 0);
  CHECK(readFile(dir.file("out.onnx")) == expected);
}

TEST_CASE("a symbolic link as destination: the file it names is replaced, the link stays", "[cli][special-files]") {
  TempDir dir;
  const std::string expected = foldedBytes(dir);
  fs::create_directories(dir.file("real"));
  bnfold::test::writeFile(dir.file("real/model.onnx"), "old contents");
  ::chmod(dir.file("real/model.onnx").c_str(), 0640);
  fs::create_symlink("real/model.onnx", dir.file("link.onnx"));
  std::string err;
  CHECK(fold(sample(kModel) + " -o " + dir.file("link.onnx"), &err) == 0);
  CHECK(typeOf(dir.file("link.onnx")) == S_IFLNK);
  CHECK(fs::read_symlink(dir.file("link.onnx")) == "real/model.onnx");
  CHECK(readFile(dir.file("real/model.onnx")) == expected);
  CHECK((fs::status(dir.file("real/model.onnx")).permissions() & fs::perms::all) ==
        (fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read));
  CHECK(entries(dir.file("real")) == std::vector<std::string>{"model.onnx"});
}

TEST_CASE("a dangling symbolic link as destination is refused and nothing is created", "[cli][special-files]") {
  TempDir dir;
  fs::create_symlink("missing/target.onnx", dir.file("link.onnx"));
  fs::create_directories(dir.file("missing"));
  std::string err;
  CHECK(fold(sample(kModel) + " -o " + dir.file("link.onnx"), &err) == 2);
  CHECK_THAT(err, Catch::Contains(dir.file("link.onnx")) && Catch::Contains("which does not exist"));
  CHECK(fs::is_empty(dir.file("missing")));
  CHECK(typeOf(dir.file("link.onnx")) == S_IFLNK);
}

TEST_CASE("a folder, a name ending in '/' and a socket are refused with a message that says so",
          "[cli][special-files]") {
  TempDir dir;
  fs::create_directories(dir.file("folder"));
  std::string err;
  CHECK(fold(sample(kModel) + " -o " + dir.file("folder"), &err) == 2);
  CHECK_THAT(err, Catch::Contains("is a folder"));
  CHECK(fold(sample(kModel) + " -o " + dir.file("new/"), &err) == 2);
  CHECK_THAT(err, Catch::Contains("ends in '/'"));
  CHECK(fold(sample(kModel) + " -o " + dir.file("out.onnx") + " --report " + dir.file("folder"), &err) == 2);
  CHECK_THAT(err, Catch::Contains("is a folder"));
  CHECK_FALSE(fs::exists(dir.file("out.onnx")));

  const std::string socketPath = dir.file("sock");
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  REQUIRE(socketPath.size() < sizeof(address.sun_path));
  std::strcpy(address.sun_path, socketPath.c_str());
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  CHECK(fold(sample(kModel) + " -o " + socketPath, &err) == 2);
  CHECK_THAT(err, Catch::Contains("is a socket"));
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  CHECK(typeOf(socketPath) == S_IFSOCK);
  ::close(fd);
  CHECK(entries(dir.path()) == std::vector<std::string>{"folder", "sock"});
}

TEST_CASE("in-place mode replaces regular files only, and through a link it replaces the target",
          "[cli][special-files]") {
  TempDir dir;
  const std::string expected = foldedBytes(dir);
  const std::string fifo = dir.file("pipe.onnx");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::string err;
  CHECK(fold(fifo + " --in-place", &err) == 2);  // refused before reading: the FIFO has no writer
  CHECK_THAT(err, Catch::Contains("regular files only"));
  CHECK(typeOf(fifo) == S_IFIFO);
  fs::remove(fifo);

  fs::create_directories(dir.file("real"));
  fs::copy_file(sample(kModel), dir.file("real/model.onnx"));
  fs::create_symlink("real/model.onnx", dir.file("link.onnx"));
  CHECK(fold(dir.file("link.onnx") + " --in-place --backup-suffix .bak", &err) == 0);
  CHECK(typeOf(dir.file("link.onnx")) == S_IFLNK);
  CHECK(readFile(dir.file("real/model.onnx")) == expected);
  CHECK(readFile(dir.file("link.onnx.bak")) == readFile(sample(kModel)));
}

TEST_CASE("batch mode: an output that is a dangling link fails that model only", "[cli][special-files][batch]") {
  TempDir dir;
  fs::create_directories(dir.file("in"));
  fs::create_directories(dir.file("out"));
  fs::copy_file(sample(kModel), dir.file("in/a.onnx"));
  fs::copy_file(sample(kModel), dir.file("in/b.onnx"));
  fs::create_symlink("/nonexistent-bnfold-target.onnx", dir.file("out/a.onnx"));
  std::string out, err;
  CHECK(runCommand(cli("fold " + dir.file("in") + " --out-dir " + dir.file("out")), &out, &err) != 0);
  CHECK_THAT(err, Catch::Contains("which does not exist"));
  CHECK(fs::is_regular_file(dir.file("out/b.onnx")));
  CHECK(typeOf(dir.file("out/a.onnx")) == S_IFLNK);
  CHECK_FALSE(fs::exists("/nonexistent-bnfold-target.onnx"));
}

TEST_CASE("fold --help says how special destinations are treated", "[cli][special-files]") {
  std::string out, err;
  REQUIRE(runCommand(cli("fold --help"), &out, &err) == 0);
  CHECK_THAT(out, Catch::Contains("/dev/stdout") && Catch::Contains("regular files only"));
}

TEST_CASE("batch mode: an output that is a device node is written into and stays a device",
          "[cli][special-files][batch]") {
  TempDir dir;
  fs::create_directories(dir.file("in"));
  fs::create_directories(dir.file("out"));
  fs::copy_file(sample(kModel), dir.file("in/a.onnx"));
  fs::copy_file(sample(kModel), dir.file("in/b.onnx"));
  if (!makeCharDevice(dir.file("out/a.onnx"), 3)) return;
  std::string out, err;
  CHECK(runCommand(cli("fold " + dir.file("in") + " --out-dir " + dir.file("out")), &out, &err) == 0);
  CHECK(typeOf(dir.file("out/a.onnx")) == S_IFCHR);
  CHECK(typeOf(dir.file("out/b.onnx")) == S_IFREG);
  CHECK(readFile(dir.file("out/b.onnx")) == foldedBytes(dir));
}
