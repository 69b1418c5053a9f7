#include <catch2/catch.hpp>

#include "bnfold/dims_text.h"
#include "bnfold/rewrite/rewriter.h"
#include "test_support.h"

using namespace bnfold;
using bnfold::test::parseModel;

namespace {
const char* kConvBnModel = R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,4,4] x) => (float[1,2,4,4] y, float[1,2,4,4] r)
<float[2,2,1,1] w = {1,2,3,4}, float[2] s = {1,2}, float[2] b = {0.5,0.25}, float[2] m = {0,1}, float[2] v = {1,4}>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
  r = Relu (y)
}
)ONNX";
}  // namespace

TEST_CASE("values know their producer and every use", "[ir]") {
  auto model = parseModel(kConvBnModel);
  Graph& graph = model->graph();
  graph.verify();
  Value* c = graph.findLocal("c");
  REQUIRE(c);
  REQUIRE(c->producer());
  CHECK(c->producer()->opType() == "Conv");
  REQUIRE(c->uses().size() == 1);
  CHECK(c->uses()[0].node->opType() == "BatchNormalization");
  CHECK(c->uses()[0].slot == 0);
  Value* y = graph.findLocal("y");
  CHECK(y->isGraphOutput());
  CHECK(y->uses().size() == 1);
  Value* s = graph.findLocal("s");
  REQUIRE(s->initializer());
  CHECK(s->uses().size() == 1);
  CHECK(s->uses()[0].slot == 1);
}

TEST_CASE("messages name a node by op type and name, and write dims in brackets", "[ir]") {
  auto model = parseModel(kConvBnModel);
  const Value* c = model->graph().findLocal("c");
  REQUIRE(c);
  CHECK(describe(*c->producer()) == "Conv 'Conv_0'");
  CHECK(formatDims(std::vector<int64_t>{1, 8, 1, 1}) == "[1,8,1,1]");
  CHECK(formatDims(std::vector<int64_t>{2, -1}, ", ") == "[2, -1]");
  CHECK(formatDims(std::vector<int64_t>{}) == "[]");
}

TEST_CASE("unnamed nodes get stable unique names", "[ir]") {
  auto model = parseModel(kConvBnModel);
  std::vector<std::string> names;
  for (const auto& node : model->graph().nodes()) names.push_back(node->name());
  CHECK(names == std::vector<std::string>{"Conv_0", "BatchNormalization_0", "Relu_0"});
  // Loading the same text again gives the same names.
  auto again = parseModel(kConvBnModel);
  CHECK(again->graph().nodeList()[1]->name() == "BatchNormalization_0");
}

TEST_CASE("generated names never clash with existing ones", "[ir]") {
  auto model = parseModel(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[2] x) => (float[2] z)
{
  y = Relu (x)
  z = Relu (y)
}
)ONNX");
  // Name one node like the name the loader would give the other.
  onnx::ModelProto proto = modelToProto(*model);
  proto.mutable_graph()->mutable_node(1)->set_name("Relu_0");
  proto.mutable_graph()->mutable_node(0)->clear_name();
  auto reloaded = modelFromProto(std::move(proto));
  auto nodes = reloaded->graph().nodeList();
  CHECK(nodes[1]->name() == "Relu_0");
  CHECK(nodes[0]->name() != "Relu_0");
  CHECK_FALSE(nodes[0]->name().empty());
}

TEST_CASE("use lists stay right through rewriter edits", "[ir]") {
  auto model = parseModel(kConvBnModel);
  Graph& graph = model->graph();
  Report report;
  Rewriter rewriter(*model, report);
  const Node* conv = graph.findLocal("c")->producer();
  const Node* bn = graph.findLocal("y")->producer();
  // Replace the BN by letting the conv output take over its name.
  rewriter.replaceValueKeepingName(graph.findLocal("y"), graph.findLocal("c"));
  rewriter.finish();
  graph.verify();
  CHECK(bnfold::test::opSequence(graph) == "Conv,Relu");
  Value* y = graph.findLocal("y");
  REQUIRE(y);
  CHECK(y->producer() == conv);
  CHECK(y->isGraphOutput());
  CHECK(y->uses().size() == 1);
  CHECK(y->uses()[0].node->opType() == "Relu");
  CHECK(graph.findLocal("c") == nullptr);
  (void)bn;
  // The BN's parameters lost their only reader and are gone; the conv weight stays.
  CHECK(graph.findLocal("s") == nullptr);
  CHECK(graph.findLocal("m") == nullptr);
  CHECK(graph.findLocal("w") != nullptr);
  CHECK(graph.initializers().size() == 1);
}

TEST_CASE("setInput and createNode keep producers and uses consistent", "[ir]") {
  auto model = parseModel(kConvBnModel);
  Graph& graph = model->graph();
  Report report;
  Rewriter rewriter(*model, report);
  const Node* relu = graph.findLocal("r")->producer();
  Value* y = graph.findLocal("y");
  Node* neg = rewriter.createNode(relu, "Neg", {y}, {"neg_out"}, "negate");
  rewriter.setInput(relu, 0, neg->output(0));
  rewriter.finish();
  graph.verify();
  CHECK(bnfold::test::opSequence(graph) == "Conv,BatchNormalization,Neg,Relu");
  CHECK(y->uses().size() == 1);
  CHECK(y->uses()[0].node == neg);
  CHECK(neg->output(0)->uses()[0].node == relu);
  CHECK(neg->name() == "negate");
}

TEST_CASE("a node's op type and domain are known without its proto, for nodes loaded and made", "[ir]") {
  auto model = parseModel(R"ONNX(
<ir_version: 8, opset_import: ["" : 15, "ai.onnx" : 15, "com.example" : 1]>
g (float[2] x) => (float[2] z)
{
  a = Relu (x)
  b = ai.onnx.Relu (a)
  c = com.example.Relu (b)
  z = Relu (c)
}
)ONNX");
  Graph& graph = model->graph();
  const Node* plain = graph.findLocal("a")->producer();
  const Node* named = graph.findLocal("b")->producer();
  const Node* custom = graph.findLocal("c")->producer();
  CHECK(plain->isOnnxOp("Relu"));
  CHECK(named->isOnnxOp("Relu"));
  CHECK_FALSE(custom->isOnnxOp("Relu"));
  CHECK(custom->opType() == "Relu");
  CHECK(custom->domain() == "com.example");
  // Nodes of one type share one copy of it.
  CHECK(&plain->opType() == &graph.findLocal("z")->producer()->opType());

  Report report;
  Rewriter rewriter(*model, report);
  const Node* made = rewriter.createNode(plain, "Neg", {graph.findLocal("a")}, {"n"}, "negate");
  CHECK(made->isOnnxOp("Neg"));
  CHECK(made->opType() == "Neg");
  CHECK(made->proto().op_type() == "Neg");
}

TEST_CASE("in IR version 3 an initializer a rewrite adds is listed as a graph input too", "[ir]") {
  // IR 3 demands every initializer of the main graph among its inputs; an edit that only adds one and reads it
  // must leave a model that still says so.
  auto model = parseModel(R"ONNX(
<ir_version: 3, opset_import: ["" : 8]>
g (float[2] x) => (float[2] y)
{
  y = Relu (x)
}
)ONNX");
  Graph& graph = model->graph();
  Report report;
  {
    Rewriter rewriter(*model, report);
    const Node* relu = graph.findLocal("y")->producer();
    Value* shift = rewriter.addInitializer(graph, Tensor::fromDoubles("", DataType::Float, {2}, {1.0, 2.0}), "shift");
    Node* add = rewriter.createNode(relu, "Add", {graph.findLocal("x"), shift}, {"shifted"}, "add_shift");
    rewriter.setInput(relu, 0, add->output(0));
  }
  graph.verify();
  std::vector<std::string> inputs;
  for (const ValueInfoEntry& input : graph.inputs()) inputs.push_back(input.value ? input.value->name() : "");
  CHECK(inputs == std::vector<std::string>{"x", "shift"});
  REQUIRE(graph.findLocal("shift"));
  CHECK(graph.findLocal("shift")->isGraphInput());
}

TEST_CASE("eraseNode refuses to drop a value that is still read", "[ir]") {
  auto model = parseModel(kConvBnModel);
  Report report;
  Rewriter rewriter(*model, report);
  CHECK_THROWS_AS(rewriter.eraseNode(model->graph().findLocal("c")->producer()), std::logic_error);
}

TEST_CASE("subgraphs are nested graphs that read outer values", "[ir]") {
  auto model = parseModel(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (bool cond, float[2] x) => (float[2] y)
<float[2] k = {1, 2}>
{
  y = If (cond) <
    then_branch = then_g () => (float[2] t) { t = Add (x, k) },
    else_branch = else_g () => (float[2] e) { e = Sub (x, k) }
  >
}
)ONNX");
  Graph& graph = model->graph();
  graph.verify();
  const Node* ifNode = graph.nodeList()[0];
  REQUIRE(ifNode->subgraphs().size() == 2);
  Graph& thenGraph = *ifNode->subgraphs()[0].graph;
  CHECK(thenGraph.parent() == &graph);
  CHECK(thenGraph.ownerNode() == ifNode);
  const Node* add = thenGraph.nodeList()[0];
  CHECK(add->input(0) == graph.findLocal("x"));
  CHECK(add->input(1) == graph.findLocal("k"));
  // Outer values list the uses from inside the subgraphs.
  CHECK(graph.findLocal("k")->uses().size() == 2);
  CHECK(model->allGraphs().size() == 3);
  CHECK(thenGraph.lookup("k") == graph.findLocal("k"));
  CHECK(thenGraph.findLocal("k") == nullptr);
}

TEST_CASE("Constant nodes and initializers share one tensor type", "[ir]") {
  auto model = parseModel(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[2] x) => (float[2] y)
<float[2] a = {1, 2}>
{
  b = Constant <value = float[2] {3, 4}> ()
  f = Constant <value_floats = [5.0, 6.0]> ()
  s = Add (x, a)
  t = Add (s, b)
  y = Add (t, f)
}
)ONNX");
  Graph& graph = model->graph();
  CHECK(graph.findLocal("a")->constantTensor()->toDoubles() == std::vector<double>{1, 2});
  CHECK(graph.findLocal("b")->constantTensor()->toDoubles() == std::vector<double>{3, 4});
  CHECK(graph.findLocal("f")->constantTensor()->toDoubles() == std::vector<double>{5, 6});
  CHECK(graph.findLocal("x")->constantTensor() == nullptr);
  CHECK(graph.findLocal("s")->constantTensor() == nullptr);
}
