// Bad input: one line on stderr naming the file and the problem, exit 2, no output left behind, input untouched.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "test_support.h"

using bnfold::test::TempDir;

using bnfold::test::readFile;
using bnfold::test::writeFile;
namespace {

std::string serialize(const onnx::ModelProto& proto) {
  std::string bytes;
  proto.SerializeToString(&bytes);
  return bytes;
}

onnx::ModelProto goodModel() {
  return bnfold::test::parseModelProto(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[4] x) => (float[4] y)
<float[4] w = {1, 2, 3, 4}>
{
  y = Mul (x, w)
}
)ONNX");
}

onnx::ModelProto withExternalWeight(const std::string& location) {
  onnx::ModelProto proto = goodModel();
  auto* w = proto.mutable_graph()->mutable_initializer(0);
  w->clear_float_data();
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* entry = w->add_external_data();
  entry->set_key("location");
  entry->set_value(location);
  return proto;
}

// Runs `bnfold fold` on `input` and checks the contract for invalid input; returns stderr.
std::string expectRejected(const TempDir& dir, const std::string& input) {
  const std::string before = readFile(input);
  const std::string output = dir.file("out/result.onnx");
  std::filesystem::create_directories(dir.file("out"));
  std::string out, err;
  const int code = bnfold::test::runCommand(bnfold::test::bnfoldExecutable() + " fold '" + input + "' -o '" + output +
                                                "' --report '" + dir.file("out/report.json") + "'",
                                            &out, &err);
  CHECK(code == 2);
  // Exactly one line, naming the file.
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  CHECK(err.find(input) != std::string::npos);
  // Nothing written, not even a temp file.
  CHECK(std::filesystem::is_empty(dir.file("out")));
  CHECK(readFile(input) == before);
  return err;
}

}  // namespace

TEST_CASE("a missing file is reported", "[io][bad-input]") {
  TempDir dir;
  CHECK_THAT(expectRejected(dir, dir.file("nope.onnx")), Catch::Contains("no such file"));
}

TEST_CASE("an empty file is reported", "[io][bad-input]") {
  TempDir dir;
  writeFile(dir.file("empty.onnx"), "");
  CHECK_THAT(expectRejected(dir, dir.file("empty.onnx")), Catch::Contains("empty"));
}

TEST_CASE("a file that is not a protobuf is reported", "[io][bad-input]") {
  TempDir dir;
  writeFile(dir.file("text.onnx"), "\xff\xff\xff\xff this is not a protobuf at all\n");
  CHECK_THAT(expectRejected(dir, dir.file("text.onnx")), Catch::Contains("cannot be parsed"));
  // Bytes that happen to parse as a protobuf but are no ONNX model.
  writeFile(dir.file("notmodel.onnx"), "hello world\n");
  CHECK_THAT(expectRejected(dir, dir.file("notmodel.onnx")), Catch::Contains("not") && Catch::Contains("model"));
}

TEST_CASE("a truncated file is reported", "[io][bad-input]") {
  TempDir dir;
  const std::string bytes = serialize(goodModel());
  // Every cut point must be rejected, whether it falls inside a field or between fields.
  for (std::size_t cut : {bytes.size() / 3, bytes.size() / 2, bytes.size() - 7, bytes.size() - 1}) {
    INFO("cut at " << cut << " of " << bytes.size());
    writeFile(dir.file("cut.onnx"), bytes.substr(0, cut));
    expectRejected(dir, dir.file("cut.onnx"));
  }
}

TEST_CASE("a node input that nothing produces is reported", "[io][bad-input]") {
  TempDir dir;
  onnx::ModelProto proto = goodModel();
  proto.mutable_graph()->mutable_node(0)->set_input(1, "ghost");
  writeFile(dir.file("dangling.onnx"), serialize(proto));
  const std::string err = expectRejected(dir, dir.file("dangling.onnx"));
  CHECK_THAT(err, Catch::Contains("'ghost'"));
}

TEST_CASE("an initializer whose bytes do not match its dims is reported", "[io][bad-input]") {
  TempDir dir;
  onnx::ModelProto proto = goodModel();
  auto* w = proto.mutable_graph()->mutable_initializer(0);
  w->clear_float_data();
  w->set_raw_data(std::string(12, '\0'));  // 3 floats for dims [4]
  writeFile(dir.file("short.onnx"), serialize(proto));
  CHECK_THAT(expectRejected(dir, dir.file("short.onnx")), Catch::Contains("'w'") && Catch::Contains("need 16"));
}

TEST_CASE("external data that is missing or leaves the model's folder is refused", "[io][bad-input][external]") {
  TempDir dir;
  std::filesystem::create_directories(dir.file("model"));
  writeFile(dir.file("secret.bin"), std::string(16, '\1'));
  SECTION("missing file") {
    writeFile(dir.file("model/m.onnx"), serialize(withExternalWeight("weights.bin")));
    CHECK_THAT(expectRejected(dir, dir.file("model/m.onnx")), Catch::Contains("does not exist"));
  }
  SECTION("parent folder") {
    writeFile(dir.file("model/m.onnx"), serialize(withExternalWeight("../secret.bin")));
    CHECK_THAT(expectRejected(dir, dir.file("model/m.onnx")), Catch::Contains("leaves the model's folder"));
  }
  SECTION("absolute path") {
    writeFile(dir.file("model/m.onnx"), serialize(withExternalWeight(dir.file("secret.bin"))));
    CHECK_THAT(expectRejected(dir, dir.file("model/m.onnx")), Catch::Contains("absolute path"));
  }
  SECTION("symlink pointing outside") {
    std::filesystem::create_symlink(dir.file("secret.bin"), dir.file("model/link.bin"));
    writeFile(dir.file("model/m.onnx"), serialize(withExternalWeight("link.bin")));
    CHECK_THAT(expectRejected(dir, dir.file("model/m.onnx")), Catch::Contains("outside the model's folder"));
  }
  SECTION("too short") {
    writeFile(dir.file("model/w.bin"), std::string(8, '\0'));
    writeFile(dir.file("model/m.onnx"), serialize(withExternalWeight("w.bin")));
    CHECK_THAT(expectRejected(dir, dir.file("model/m.onnx")), Catch::Contains("need 16"));
  }
}

TEST_CASE("a folder given as the model is reported", "[io][bad-input]") {
  TempDir dir;
  std::filesystem::create_directories(dir.file("a.onnx"));
  CHECK_THAT(expectRejected(dir, dir.file("a.onnx")), Catch::Contains("folder"));
}
