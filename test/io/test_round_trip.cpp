// Everything the rules do not touch survives load -> IR -> save, down to the bytes.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <functional>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/message_differencer.h>

#include "bnfold/error.h"
#include "bnfold/io/borrowed_model.h"
#include "bnfold/io/model_io.h"
#include "test_support.h"

using namespace bnfold;
using bnfold::test::TempDir;

using bnfold::test::readFile;
using bnfold::test::writeFile;
namespace {

// A model that uses every part of the format bnfold must carry through untouched.
onnx::ModelProto richModel() {
  onnx::ModelProto model = bnfold::test::parseModelProto(R"ONNX(
<ir_version: 8, opset_import: ["" : 15, "com.example" : 2], producer_name: "rich", producer_version: "7.1",
 domain: "org.example", model_version: 42, doc_string: "a model with everything">
main (float[N,2] x, bool cond) => (float[N,2] y, float[N,2] z)
<float[2] k = {1.5, -2}>
{
  a = Add (x, k)
  b = If (cond) <
    then_branch = then_g () => (float[N,2] t) { t = Relu (a) },
    else_branch = else_g () => (float[N,2] e) { e = Neg (a) }
  >
  y = com.example.Custom <alpha = 0.5, count = 3, label = "L", sizes = [1, 2], scales = [0.5, 0.25], words = ["p", "q"]> (b)
  z = com.example.Square (a)
}

<domain: "com.example", opset_import: ["" : 15]>
Square (X) => (Y) { Y = Mul (X, X) }
)ONNX");
  auto* graph = model.mutable_graph();
  graph->set_doc_string("graph doc");
  auto* meta = model.add_metadata_props();
  meta->set_key("author");
  meta->set_value("bnfold tests");
  auto* info = graph->add_value_info();
  info->set_name("a");
  info->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  info->set_doc_string("value_info doc");
  graph->mutable_node(0)->set_doc_string("node doc");
  // Attributes of the remaining kinds: tensor, tensors, graphs, sparse tensor, type proto, an unknown one.
  auto* custom = graph->mutable_node(2);
  {
    auto* attr = custom->add_attribute();
    attr->set_name("table");
    attr->set_type(onnx::AttributeProto::TENSOR);
    attr->mutable_t()->set_data_type(onnx::TensorProto::INT64);
    attr->mutable_t()->add_dims(2);
    attr->mutable_t()->add_int64_data(4);
    attr->mutable_t()->add_int64_data(5);
  }
  {
    auto* attr = custom->add_attribute();
    attr->set_name("tables");
    attr->set_type(onnx::AttributeProto::TENSORS);
    auto* t = attr->add_tensors();
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_float_data(9.0f);
  }
  {
    auto* attr = custom->add_attribute();
    attr->set_name("bodies");
    attr->set_type(onnx::AttributeProto::GRAPHS);
    for (int i = 0; i < 2; ++i) {
      auto* g = attr->add_graphs();
      g->set_name("body" + std::to_string(i));
      auto* out = g->add_output();
      out->set_name("o" + std::to_string(i));
      auto* n = g->add_node();
      n->set_op_type("Identity");
      n->set_name("id" + std::to_string(i));
      n->add_input("a");
      n->add_output("o" + std::to_string(i));
    }
  }
  {
    auto* attr = custom->add_attribute();
    attr->set_name("sparse");
    attr->set_type(onnx::AttributeProto::SPARSE_TENSOR);
    attr->mutable_sparse_tensor()->add_dims(4);
    attr->mutable_sparse_tensor()->mutable_values()->set_data_type(onnx::TensorProto::FLOAT);
    attr->mutable_sparse_tensor()->mutable_values()->add_float_data(1.0f);
    attr->mutable_sparse_tensor()->mutable_indices()->set_data_type(onnx::TensorProto::INT64);
    attr->mutable_sparse_tensor()->mutable_indices()->add_int64_data(2);
  }
  {
    auto* attr = custom->add_attribute();
    attr->set_name("kind");
    attr->set_type(onnx::AttributeProto::TYPE_PROTO);
    attr->mutable_tp()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::DOUBLE);
    attr->set_doc_string("attribute doc");
    // A field this build of onnx does not know survives as an unknown field.
    attr->GetReflection()->MutableUnknownFields(attr)->AddVarint(999, 12345);
  }
  // Sparse initializer.
  auto* sparse = graph->add_sparse_initializer();
  sparse->add_dims(3);
  sparse->mutable_values()->set_name("sp");
  sparse->mutable_values()->set_data_type(onnx::TensorProto::FLOAT);
  sparse->mutable_values()->add_float_data(2.0f);
  sparse->mutable_indices()->set_data_type(onnx::TensorProto::INT64);
  sparse->mutable_indices()->add_int64_data(1);
  // Training info reading an initializer of the main graph.
  auto* training = model.add_training_info();
  training->mutable_algorithm()->set_name("train_step");
  auto* step = training->mutable_algorithm()->add_node();
  step->set_op_type("Identity");
  step->add_input("k");
  step->add_output("k_new");
  auto* binding = training->add_update_binding();
  binding->set_key("k");
  binding->set_value("k_new");
  model.GetReflection()->MutableUnknownFields(&model)->AddLengthDelimited(1000, "future field");
  return model;
}

// Loads without naming unnamed nodes, the one change loading makes by default.
std::unique_ptr<Model> loadKeepingNames(const std::string& path) {
  LoadOptions keepNames;
  keepNames.nameUnnamedNodes = false;
  return loadModel(path, keepNames);
}

}  // namespace

TEST_CASE("a model using every part of the format round-trips byte for byte", "[io][round-trip]") {
  onnx::ModelProto original = richModel();
  std::string originalBytes;
  REQUIRE(original.SerializeToString(&originalBytes));
  TempDir dir;
  writeFile(dir.file("in.onnx"), originalBytes);

  auto model = loadKeepingNames(dir.file("in.onnx"));
  model->graph().verify();
  saveModel(*model, dir.file("out.onnx"));
  const std::string savedBytes = readFile(dir.file("out.onnx"));

  onnx::ModelProto reloaded;
  REQUIRE(reloaded.ParseFromString(savedBytes));
  std::string difference;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&difference);
  CHECK(differencer.Compare(original, reloaded));
  INFO(difference);
  CHECK(savedBytes == originalBytes);
  // Saving does not change the model: a second save gives the same bytes.
  saveModel(*model, dir.file("again.onnx"));
  CHECK(readFile(dir.file("again.onnx")) == savedBytes);
}

TEST_CASE("by default the only change is a name for each unnamed node", "[io][round-trip]") {
  onnx::ModelProto original = richModel();
  auto model = modelFromProto(onnx::ModelProto(original));
  onnx::ModelProto saved = modelToProto(*model);
  // Put the original's empty names back: then nothing else may differ.
  std::vector<std::string> given;
  std::function<void(onnx::GraphProto&, const onnx::GraphProto&)> restore = [&](onnx::GraphProto& out,
                                                                                 const onnx::GraphProto& in) {
    for (int i = 0; i < out.node_size(); ++i) {
      if (in.node(i).name().empty()) {
        given.push_back(out.node(i).name());
        out.mutable_node(i)->clear_name();
      }
      for (int a = 0; a < out.node(i).attribute_size(); ++a) {
        auto* attr = out.mutable_node(i)->mutable_attribute(a);
        if (attr->has_g()) restore(*attr->mutable_g(), in.node(i).attribute(a).g());
        for (int j = 0; j < attr->graphs_size(); ++j) restore(*attr->mutable_graphs(j), in.node(i).attribute(a).graphs(j));
      }
    }
  };
  restore(*saved.mutable_graph(), original.graph());
  CHECK(google::protobuf::util::MessageDifferencer::Equals(original, saved));
  CHECK(given == std::vector<std::string>{"Add_0", "If_0", "Relu_0", "Neg_0", "Custom_0", "Square_0"});
}

TEST_CASE("the input file is never modified and no temp files are left", "[io][round-trip]") {
  TempDir dir;
  std::string bytes;
  richModel().SerializeToString(&bytes);
  writeFile(dir.file("in.onnx"), bytes);
  auto model = loadModel(dir.file("in.onnx"));
  saveModel(*model, dir.file("out.onnx"));
  CHECK(readFile(dir.file("in.onnx")) == bytes);
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"in.onnx", "out.onnx"});
}

TEST_CASE("external data is read in place and written next to the output", "[io][external]") {
  TempDir dir;
  std::filesystem::create_directories(dir.file("in"));
  std::filesystem::create_directories(dir.file("out"));
  onnx::ModelProto proto = bnfold::test::parseModelProto(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[3] x) => (float[3] y)
<float[3] w = {0, 0, 0}, float[1] small = {5}>
{
  t = Mul (x, w)
  y = Add (t, small)
}
)ONNX");
  // Move w's data into a file beside the model, after 8 bytes of padding.
  const float weights[] = {1.5f, -2.0f, 0.25f};
  std::string data(8, 'x');
  data.append(reinterpret_cast<const char*>(weights), sizeof(weights));
  writeFile(dir.file("in/weights.bin"), data);
  auto* w = proto.mutable_graph()->mutable_initializer(0);
  w->clear_float_data();
  w->set_data_location(onnx::TensorProto::EXTERNAL);
  for (auto [key, value] : {std::pair<const char*, const char*>{"location", "weights.bin"}, {"offset", "8"},
                            {"length", "12"}}) {
    auto* entry = w->add_external_data();
    entry->set_key(key);
    entry->set_value(value);
  }
  std::string bytes;
  proto.SerializeToString(&bytes);
  writeFile(dir.file("in/model.onnx"), bytes);

  auto model = loadModel(dir.file("in/model.onnx"));
  const Tensor* loaded = model->graph().findLocal("w")->initializer();
  REQUIRE(loaded->isExternal());
  CHECK(model->usesExternalData());  // what the rewriter asks before it places a new weight
  CHECK(loaded->toDoubles() == std::vector<double>{1.5, -2.0, 0.25});
  saveModel(*model, dir.file("out/folded.onnx"));

  REQUIRE(std::filesystem::exists(dir.file("out/folded.onnx.data")));
  auto reloaded = loadModel(dir.file("out/folded.onnx"));
  const Tensor* saved = reloaded->graph().findLocal("w")->initializer();
  CHECK(saved->isExternal());
  CHECK(saved->externalData().location == "folded.onnx.data");
  CHECK(saved->toDoubles() == std::vector<double>{1.5, -2.0, 0.25});
  // Small inline tensors stay inline; the input's files are untouched.
  CHECK_FALSE(reloaded->graph().findLocal("small")->initializer()->isExternal());
  CHECK(readFile(dir.file("in/weights.bin")) == data);
  CHECK(readFile(dir.file("in/model.onnx")) == bytes);
}

TEST_CASE("a model uses external data when any graph's initializer is stored there, a subgraph's too",
          "[io][external]") {
  TempDir dir;
  onnx::ModelProto proto = bnfold::test::parseModelProto(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (bool c, float[3] x) => (float[3] y)
<float[3] w = {1, 2, 3}>
{
  y = If (c) <then_branch = then_g () => (float[3] t) <float[3] v = {4, 5, 6}> { t = Mul (x, v) },
              else_branch = else_g () => (float[3] e) { e = Mul (x, w) }>
}
)ONNX");
  writeFile(dir.file("inline.onnx"), proto.SerializeAsString());
  CHECK_FALSE(loadModel(dir.file("inline.onnx"))->usesExternalData());

  // Only the then-branch's v moves to a data file.
  const float values[] = {4.0f, 5.0f, 6.0f};
  writeFile(dir.file("v.bin"), std::string(reinterpret_cast<const char*>(values), sizeof(values)));
  onnx::GraphProto* thenBranch = proto.mutable_graph()->mutable_node(0)->mutable_attribute(0)->mutable_g();
  REQUIRE(thenBranch->name() == "then_g");
  onnx::TensorProto* v = thenBranch->mutable_initializer(0);
  v->clear_float_data();
  v->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* location = v->add_external_data();
  location->set_key("location");
  location->set_value("v.bin");
  writeFile(dir.file("external.onnx"), proto.SerializeAsString());
  auto model = loadModel(dir.file("external.onnx"));
  CHECK(model->usesExternalData());
  CHECK_FALSE(model->graph().findLocal("w")->initializer()->isExternal());
}

TEST_CASE("every sample model round-trips byte for byte", "[io][round-trip]") {
  TempDir dir;
  for (const auto& entry : std::filesystem::directory_iterator(bnfold::test::sourceDir() + "/models")) {
    if (entry.path().extension() != ".onnx") continue;
    INFO(entry.path().string());
    auto model = loadKeepingNames(entry.path().string());
    saveModel(*model, dir.file("out.onnx"));
    CHECK(readFile(dir.file("out.onnx")) == readFile(entry.path().string()));
  }
}

namespace {

// An initializer "big" whose raw_data (4096 floats: i * 0.5 - 7) is large enough to be deferred, and a "small" one.
onnx::ModelProto largeAndSmallInitializers() {
  onnx::ModelProto proto = bnfold::test::parseModelProto(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[4096] x) => (float[4096] y)
<float[4096] big = {0}, float[2] small = {1, 2}>
{
  t = Mul (x, big)
  y = Mul (t, small)
}
)ONNX");
  std::vector<float> values(4096);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f - 7.0f;
  auto* big = proto.mutable_graph()->mutable_initializer(0);
  big->clear_float_data();
  big->set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float)));
  big->set_doc_string("stays");
  return proto;
}

}  // namespace

TEST_CASE("large raw_data stays in the file until read, and is spliced back on save", "[io][deferred]") {
  TempDir dir;
  onnx::ModelProto proto = largeAndSmallInitializers();
  const onnx::TensorProto* big = &proto.graph().initializer(0);
  std::string bytes;
  proto.SerializeToString(&bytes);
  writeFile(dir.file("in.onnx"), bytes);

  auto model = loadKeepingNames(dir.file("in.onnx"));
  const Tensor* loaded = model->graph().findLocal("big")->initializer();
  REQUIRE(loaded->deferredRawData() != nullptr);
  CHECK(loaded->deferredRawData()->size() == 4096 * 4);
  CHECK(model->graph().findLocal("small")->initializer()->deferredRawData() == nullptr);
  CHECK(loaded->proto().raw_data().empty());
  CHECK(loaded->toDoubles()[3] == Approx(-5.5));
  saveModel(*model, dir.file("out.onnx"));
  CHECK(readFile(dir.file("out.onnx")) == bytes);
  // modelToProto gives complete protos.
  onnx::ModelProto copy = modelToProto(*model);
  CHECK(copy.graph().initializer(0).raw_data() == big->raw_data());
  CHECK(google::protobuf::util::MessageDifferencer::Equals(copy, proto));
}

namespace {

// What serializeModel writes, as a string.
std::string serialized(Model& model) {
  std::string bytes;
  serializeModel(model, [&bytes](std::size_t size) {
    bytes.resize(size);
    return bytes.data();
  });
  return bytes;
}

}  // namespace

TEST_CASE("a model in memory: large raw_data is read where it lies and serialized back byte for byte",
          "[io][deferred]") {
  std::string bytes;
  largeAndSmallInitializers().SerializeToString(&bytes);
  LoadOptions keepNames;
  keepNames.nameUnnamedNodes = false;

  SECTION("borrowed: the tensor's bytes are the caller's") {
    auto model = modelFromBorrowedBytes(bytes, "<bytes>", ".", keepNames);
    const Tensor* loaded = model->graph().findLocal("big")->initializer();
    REQUIRE(loaded->deferredRawData() != nullptr);
    const std::string_view held = loaded->bytes();
    CHECK(held.data() >= bytes.data());
    CHECK(held.data() + held.size() <= bytes.data() + bytes.size());
    CHECK(loaded->toDoubles()[5] == Approx(-4.5));
    CHECK(model->graph().findLocal("small")->initializer()->deferredRawData() == nullptr);
    CHECK(serialized(*model) == bytes);
  }
  SECTION("copied: the caller may change its buffer at once") {
    std::string scratch = bytes;
    auto model = modelFromBytes(scratch, "<bytes>", ".", keepNames);
    std::fill(scratch.begin(), scratch.end(), '\0');
    const Tensor* loaded = model->graph().findLocal("big")->initializer();
    REQUIRE(loaded->deferredRawData() != nullptr);
    CHECK(loaded->toDoubles()[5] == Approx(-4.5));
    CHECK(serialized(*model) == bytes);
  }
  SECTION("saved to a file, the same bytes") {
    TempDir dir;
    auto model = modelFromBorrowedBytes(bytes, "<bytes>", ".", keepNames);
    saveModel(*model, dir.file("out.onnx"));
    CHECK(readFile(dir.file("out.onnx")) == bytes);
  }
  SECTION("truncated or empty bytes are invalid models") {
    const std::string truncated = bytes.substr(0, bytes.size() - 100);
    CHECK_THROWS_AS(modelFromBorrowedBytes(truncated, "<bytes>"), InvalidModelError);
    CHECK_THROWS_WITH(modelFromBorrowedBytes(truncated, "<bytes>"),
                      "<bytes>: not a valid ONNX model: the protobuf cannot be parsed (corrupt or truncated bytes)");
    CHECK_THROWS_WITH(modelFromBytes("", "<bytes>"), Catch::Contains("empty"));
  }
}

TEST_CASE("every sample model and the rich model round-trip through memory byte for byte", "[io][round-trip]") {
  LoadOptions keepNames;
  keepNames.nameUnnamedNodes = false;
  std::vector<std::pair<std::string, std::string>> models;
  std::string rich;
  richModel().SerializeToString(&rich);
  models.emplace_back("rich", rich);
  for (const auto& entry : std::filesystem::directory_iterator(bnfold::test::sourceDir() + "/models"))
    if (entry.path().extension() == ".onnx") models.emplace_back(entry.path().string(), readFile(entry.path().string()));
  for (const auto& [name, bytes] : models) {
    INFO(name);
    auto model = modelFromBorrowedBytes(bytes, name, ".", keepNames);
    CHECK(serialized(*model) == bytes);
  }
}

namespace {

// Tag and length of a length-delimited field, then its bytes.
std::string lengthDelimited(int field, const std::string& bytes) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.WriteTag(static_cast<uint32_t>(field << 3 | 2));
    coded.WriteVarint32(static_cast<uint32_t>(bytes.size()));
    coded.WriteString(bytes);
  }
  return out;
}

}  // namespace

TEST_CASE("main-graph node inputs and outputs are read apart from their nodes: in order, wherever they lie",
          "[io][deferred]") {
  onnx::ModelProto proto = bnfold::test::parseModelProto(R"ONNX(
<ir_version: 8, opset_import: ["" : 13]>
g (float[4] x, float[1] lo) => (float[4] y, float[2] r)
<float[1] hi = {2}>
{
  a = Relu (x)
  y = Clip (a, lo, hi)
  p, q = Split <axis = 0> (x)
  r = Add (q, p)
}
)ONNX");
  onnx::NodeProto& clip = *proto.mutable_graph()->mutable_node(1);
  clip.set_input(1, "");  // min omitted
  clip.GetReflection()->MutableUnknownFields(&clip)->AddVarint(999, 7);  // survives as it is
  // The file written by hand: each node's outputs, then its inputs, after its other fields, which protobuf reads as the
  // same message.
  onnx::GraphProto graphWithoutNodes = proto.graph();
  graphWithoutNodes.clear_node();
  std::string graphBytes = graphWithoutNodes.SerializeAsString();
  for (const onnx::NodeProto& node : proto.graph().node()) {
    onnx::NodeProto withoutNames = node;
    withoutNames.clear_input();
    withoutNames.clear_output();
    std::string nodeBytes = withoutNames.SerializeAsString();
    for (const std::string& output : node.output()) nodeBytes += lengthDelimited(2, output);
    for (const std::string& input : node.input()) nodeBytes += lengthDelimited(1, input);
    graphBytes += lengthDelimited(1, nodeBytes);
  }
  onnx::ModelProto modelWithoutGraph = proto;
  modelWithoutGraph.clear_graph();
  const std::string fileBytes = modelWithoutGraph.SerializeAsString() + lengthDelimited(7, graphBytes);
  onnx::ModelProto fromFileBytes;
  REQUIRE(fromFileBytes.ParseFromString(fileBytes));
  REQUIRE(google::protobuf::util::MessageDifferencer::Equals(fromFileBytes, proto));

  TempDir dir;
  writeFile(dir.file("in.onnx"), fileBytes);
  auto model = loadKeepingNames(dir.file("in.onnx"));
  model->graph().verify();
  const Node& loadedClip = *model->graph().findLocal("y")->producer();
  REQUIRE(loadedClip.inputs().size() == 3);
  CHECK(loadedClip.input(0)->name() == "a");
  CHECK(loadedClip.input(1) == nullptr);
  CHECK(loadedClip.input(2)->name() == "hi");
  CHECK(model->graph().findLocal("a")->uses().size() == 1);
  CHECK(loadedClip.proto().input_size() == 0);  // the IR holds them
  CHECK(loadedClip.proto().output_size() == 0);
  const Node& split = *model->graph().findLocal("p")->producer();
  REQUIRE(split.outputs().size() == 2);
  CHECK(split.output(1)->name() == "q");
  CHECK(split.output(1)->producerOutputIndex() == 1);
  const Node& add = *model->graph().findLocal("r")->producer();
  CHECK(add.input(0) == split.output(1));
  CHECK(add.input(1) == split.output(0));
  saveModel(*model, dir.file("out.onnx"));
  onnx::ModelProto saved;
  REQUIRE(saved.ParseFromString(readFile(dir.file("out.onnx"))));
  std::string difference;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&difference);
  INFO(difference);
  CHECK(differencer.Compare(proto, saved));
}

TEST_CASE("main-graph node names read apart go back to the nodes when the stored order needs sorting",
          "[io][deferred][unsorted]") {
  onnx::ModelProto proto = bnfold::test::parseModelProto(R"ONNX(
<ir_version: 8, opset_import: ["" : 13]>
g (float[4] x) => (float[4] y)
{
  a = Relu (x)
  b = Neg (a)
  y = Add (b, a)
}
)ONNX");
  // Stored as a, y, b: the second node reads a name not defined yet, once the first is built.
  proto.mutable_graph()->mutable_node()->SwapElements(1, 2);
  REQUIRE(proto.graph().node(1).output(0) == "y");
  TempDir dir;
  writeFile(dir.file("in.onnx"), proto.SerializeAsString());
  auto model = loadKeepingNames(dir.file("in.onnx"));
  model->graph().verify();
  std::vector<std::string> order;
  for (const auto& node : model->graph().nodes()) order.push_back(node->output(0)->name());
  CHECK(order == std::vector<std::string>{"a", "b", "y"});
  const Node& add = *model->graph().findLocal("y")->producer();
  REQUIRE(add.inputs().size() == 2);
  CHECK(add.input(0)->name() == "b");
  CHECK(add.input(1)->name() == "a");
}
