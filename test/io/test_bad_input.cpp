// Bad input: one line on stderr naming the file and the problem, exit 2, no output left behind, input untouched.

#include <catch2/catch.hpp>

#include <sys/resource.h>

#include <algorithm>
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

// A graph field whose length runs past the end of the file: found by the fuzzer, when the loader sized a buffer by
// the claimed length (here about 3.7 GB) before reading. The CLI's peak RSS must not jump by it (RUSAGE_CHILDREN
// holds the largest peak of the children waited for so far).
TEST_CASE("a field claiming more bytes than the file holds is rejected without allocating them", "[io][bad-input]") {
  TempDir dir;
  std::string graph = "\x0a\xff\xff\xff\xdf\x0d";  // GraphProto.node, varint length 3,690,987,519
  graph += "partial node";
  std::string bytes = "\x08\x08";  // ir_version 8
  bytes += '\x3a';                  // ModelProto.graph
  bytes += static_cast<char>(graph.size());
  bytes += graph;
  writeFile(dir.file("long.onnx"), bytes);
  struct rusage before {};
  getrusage(RUSAGE_CHILDREN, &before);
  CHECK_THAT(expectRejected(dir, dir.file("long.onnx")), Catch::Contains("cannot be parsed"));
  struct rusage after {};
  getrusage(RUSAGE_CHILDREN, &after);
  CHECK(after.ru_maxrss <= std::max<long>(before.ru_maxrss, 512 * 1024));  // KiB: far below the 3.7 GB claimed
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
  SECTION("a string tensor (external data holds raw bytes, which strings cannot use); a fuzz finding") {
    writeFile(dir.file("model/w.bin"), std::string(16, '\0'));
    onnx::ModelProto proto = withExternalWeight("w.bin");
    proto.mutable_graph()->mutable_initializer(0)->set_data_type(onnx::TensorProto::STRING);
    writeFile(dir.file("model/m.onnx"), serialize(proto));
    CHECK_THAT(expectRejected(dir, dir.file("model/m.onnx")), Catch::Contains("string tensor stored as external data"));
  }
}

TEST_CASE("a folder given as the model is reported", "[io][bad-input]") {
  TempDir dir;
  std::filesystem::create_directories(dir.file("a.onnx"));
  CHECK_THAT(expectRejected(dir, dir.file("a.onnx")), Catch::Contains("folder"));
}

// ---- sizes taken from the file (issue 14 §2): every product and offset is checked, never wrapped ----

namespace {

onnx::ModelProto withWeightDims(std::vector<int64_t> dims, std::size_t rawBytes) {
  onnx::ModelProto proto = goodModel();
  auto* w = proto.mutable_graph()->mutable_initializer(0);
  w->clear_float_data();
  w->clear_dims();
  for (int64_t dim : dims) w->add_dims(dim);
  w->set_raw_data(std::string(rawBytes, '\0'));
  return proto;
}

void addExternalEntry(onnx::ModelProto& proto, const std::string& key, const std::string& value) {
  auto* entry = proto.mutable_graph()->mutable_initializer(0)->add_external_data();
  entry->set_key(key);
  entry->set_value(value);
}

}  // namespace

TEST_CASE("dims whose element count does not fit in 64 bits are refused, not wrapped", "[io][bad-input]") {
  TempDir dir;
  SECTION("a product far past 2^63") {
    writeFile(dir.file("huge.onnx"), serialize(withWeightDims({int64_t{1} << 62, 4}, 16)));
    CHECK_THAT(expectRejected(dir, dir.file("huge.onnx")),
               Catch::Contains("'w'") && Catch::Contains("does not fit in 64 bits"));
  }
  SECTION("a product that wraps to the bytes the tensor holds") {
    // 576460752303423552 * 32 = 2^64 + 2048: wrapped, 2,048 floats, which the raw data holds.
    writeFile(dir.file("wrap.onnx"), serialize(withWeightDims({576460752303423552, 32}, 2048 * 4)));
    CHECK_THAT(expectRejected(dir, dir.file("wrap.onnx")), Catch::Contains("does not fit in 64 bits"));
  }
  SECTION("an element count that fits but a byte size that does not") {
    writeFile(dir.file("bytes.onnx"), serialize(withWeightDims({int64_t{1} << 61, 2}, 16)));
    CHECK_THAT(expectRejected(dir, dir.file("bytes.onnx")), Catch::Contains("size in bytes does not fit"));
  }
}

TEST_CASE("external data offsets and lengths that overflow are refused", "[io][bad-input][external]") {
  TempDir dir;
  std::filesystem::create_directories(dir.file("model"));
  writeFile(dir.file("model/w.bin"), std::string(16, '\0'));
  SECTION("an offset with more digits than 64 bits hold") {
    onnx::ModelProto proto = withExternalWeight("w.bin");
    addExternalEntry(proto, "offset", "99999999999999999999999");
    writeFile(dir.file("model/m.onnx"), serialize(proto));
    CHECK_THAT(expectRejected(dir, dir.file("model/m.onnx")),
               Catch::Contains("offset '99999999999999999999999'") && Catch::Contains("fits in 64 bits"));
  }
  SECTION("offset + length past 2^63") {
    onnx::ModelProto proto = withExternalWeight("w.bin");
    addExternalEntry(proto, "offset", "9223372036854775800");
    addExternalEntry(proto, "length", "16");
    writeFile(dir.file("model/m.onnx"), serialize(proto));
    CHECK_THAT(expectRejected(dir, dir.file("model/m.onnx")),
               Catch::Contains("reads 16 bytes from offset 9223372036854775800") && Catch::Contains("only 16 bytes"));
  }
}

TEST_CASE("a constant chain whose size does not fit in 64 bits is skipped, not evaluated", "[io][bad-input]") {
  TempDir dir;
  // The BN's variance is ConstantOfShape of a shape whose product overflows: a rule must say so and move on.
  writeFile(dir.file("m.onnx"), serialize(bnfold::test::parseModelProto(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<float[2,2,1,1] w = {1, 0, 0, 1}, float[2] s = {1, 1}, float[2] b = {0, 0}, float[2] m = {0, 0},
 int64[2] shape = {4611686018427387904, 4611686018427387904}>
{
  c = Conv (x, w)
  v = ConstantOfShape (shape)
  y = BatchNormalization (c, s, b, m, v)
}
)ONNX")));
  std::string out, err;
  CHECK(bnfold::test::runCommand(bnfold::test::cli("fold " + dir.file("m.onnx") + " -o " + dir.file("o.onnx") +
                                                   " --report " + dir.file("r.json")),
                                 &out, &err) == 0);
  CHECK_THAT(readFile(dir.file("r.json")), Catch::Contains("constant-too-large"));
}

TEST_CASE("window attributes whose arithmetic overflows leave the shape unknown", "[io][bad-input]") {
  TempDir dir;
  // The forward-head rule asks for the BN's input shape, which comes through the MaxPool's window formula:
  // dilation * (kernel - 1) and input + pads overflow int64 here, so the shape is unknown and the BN is skipped.
  writeFile(dir.file("m.onnx"), serialize(bnfold::test::parseModelProto(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,4,4] x) => (float[1,3] y)
<float[2] s = {1, 1}, float[2] b = {0, 0}, float[2] m = {0, 0}, float[2] v = {1, 1},
 float[8,3] w = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}>
{
  p = MaxPool <kernel_shape = [3, 1], dilations = [4611686018427387904, 1],
               pads = [9223372036854775807, 0, 9223372036854775807, 0]> (x)
  n = BatchNormalization (p, s, b, m, v)
  f = Flatten (n)
  y = MatMul (f, w)
}
)ONNX")));
  std::string out, err;
  CHECK(bnfold::test::runCommand(bnfold::test::cli("fold " + dir.file("m.onnx") + " -o " + dir.file("o.onnx") +
                                                   " --report " + dir.file("r.json")),
                                 &out, &err) == 0);
  const std::string report = readFile(dir.file("r.json"));
  CHECK_THAT(report, Catch::Contains("\"rule\": \"bn-forward\"") && Catch::Contains("are not known"));
  CHECK_THAT(report, !Catch::Contains("\"folds\": [{"));
}

TEST_CASE("a BatchNormalization whose input 0 or output 0 is omitted is skipped by every rule", "[io][bad-input]") {
  // Found by the graph fuzzer: bn-decompose dereferenced the omitted value. No rule may look at such a node.
  const int slot = GENERATE(0, 1);  // 0: input X omitted, 1: output Y omitted
  TempDir dir;
  onnx::ModelProto proto = bnfold::test::parseModelProto(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,3,3] x) => (float[1,2,3,3] y, float[1,2,3,3] c)
<float[2,2,1,1] w = {1, 0, 0, 1}, float[2] s = {1, 1}, float[2] b = {0, 0}, float[2] m = {0, 0}, float[2] v = {1, 1}>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)ONNX");
  onnx::NodeProto& bn = *proto.mutable_graph()->mutable_node(1);
  if (slot == 0) {
    bn.set_input(0, "");
  } else {
    bn.set_output(0, "");
    proto.mutable_graph()->mutable_output()->DeleteSubrange(0, 1);  // y, which nothing defines now
  }
  writeFile(dir.file("m.onnx"), serialize(proto));
  std::string out, err;
  const int code = bnfold::test::runCommand(
      bnfold::test::cli("fold " + dir.file("m.onnx") + " --rules all -o " + dir.file("o.onnx") + " --report " +
                        dir.file("r.json")),
      &out, &err);
  REQUIRE(code == 0);
  const std::string report = readFile(dir.file("r.json"));
  CHECK_THAT(report, Catch::Contains(slot == 0 ? "\"reason\": \"missing-input\"" : "\"reason\": \"missing-output\""));
  CHECK_THAT(report, Catch::Contains(slot == 0 ? "input 0 is omitted" : "output 0 is omitted"));
  CHECK_THAT(report, Catch::Contains("\"folds\": []") && Catch::Contains("\"decomposed\": []"));
}

// ---- nesting deeper than protobuf reads (issue 14 §3) ----

namespace {

// A graph whose output `v<level>` comes from an If nested `level` deep (then: one level less; else: a Constant).
onnx::GraphProto nestedIfGraph(int level) {
  onnx::GraphProto graph;
  graph.set_name("level" + std::to_string(level));
  auto constant = [](const std::string& output) {
    onnx::NodeProto node;
    node.set_name("make_" + output);  // named: an unnamed node gets a name on load, and the round trip must be exact
    node.set_op_type("Constant");
    node.add_output(output);
    auto* value = node.add_attribute();
    value->set_name("value");
    value->set_type(onnx::AttributeProto::TENSOR);
    value->mutable_t()->set_data_type(onnx::TensorProto::FLOAT);
    value->mutable_t()->add_float_data(1.0f);
    return node;
  };
  const std::string output = "v" + std::to_string(level);
  auto* info = graph.add_output();
  info->set_name(output);
  info->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  if (level == 0) {
    *graph.add_node() = constant(output);
    return graph;
  }
  auto* node = graph.add_node();
  node->set_name("if" + std::to_string(level));
  node->set_op_type("If");
  node->add_input("cond");
  node->add_output(output);
  auto* thenBranch = node->add_attribute();
  thenBranch->set_name("then_branch");
  thenBranch->set_type(onnx::AttributeProto::GRAPH);
  // Built iteratively from the bottom would be nicer; the recursion is as deep as the test's own nesting.
  *thenBranch->mutable_g() = nestedIfGraph(level - 1);
  auto* elseBranch = node->add_attribute();
  elseBranch->set_name("else_branch");
  elseBranch->set_type(onnx::AttributeProto::GRAPH);
  auto* leaf = elseBranch->mutable_g();
  leaf->set_name("else" + std::to_string(level));
  *leaf->add_node() = constant("e" + std::to_string(level));
  *leaf->add_output() = *info;
  leaf->mutable_output(0)->set_name("e" + std::to_string(level));
  return graph;
}

onnx::ModelProto nestedIfModel(int levels) {
  onnx::ModelProto proto;
  proto.set_ir_version(8);
  proto.add_opset_import()->set_version(15);
  *proto.mutable_graph() = nestedIfGraph(levels);
  auto* cond = proto.mutable_graph()->add_input();
  cond->set_name("cond");
  cond->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::BOOL);
  return proto;
}

}  // namespace

TEST_CASE("a model nested deeper than protobuf's limit says so, and one inside the limit loads",
          "[io][bad-input][nesting]") {
  TempDir dir;
  writeFile(dir.file("deep.onnx"), serialize(nestedIfModel(3000)));
  CHECK_THAT(expectRejected(dir, dir.file("deep.onnx")),
             Catch::Contains("nests messages 900") && Catch::Contains("levels deep") && Catch::Contains("is 100"));

  writeFile(dir.file("nested.onnx"), serialize(nestedIfModel(20)));
  std::string out, err;
  CHECK(bnfold::test::runCommand(bnfold::test::cli("fold " + dir.file("nested.onnx") + " -o " +
                                                   dir.file("out/nested.onnx") + " --rules none"),
                                 &out, &err) == 0);
  CHECK(readFile(dir.file("out/nested.onnx")) == readFile(dir.file("nested.onnx")));
}
