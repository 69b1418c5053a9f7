#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <unordered_map>

#include "bnfold/io/model_io.h"
#include "bnfold/ir/model.h"
#include "bnfold/ir/value_table.h"
#include "bnfold/report/report.h"
#include "bnfold/check/fold.h"
#include "bnfold/rewrite/rewriter.h"
#include "test_support.h"

using namespace bnfold;
using bnfold::test::parseModel;

namespace {
// The model in ONNX text with every main-graph node named "node_<its first output>": a model whose nodes all have
// names reserves no name on load, only on the first request for a new one.
std::unique_ptr<Model> parseModelWithNamedNodes(const std::string& text) {
  onnx::ModelProto proto = bnfold::test::parseModelProto(text);
  for (auto& node : *proto.mutable_graph()->mutable_node()) node.set_name("node_" + node.output(0));
  return modelFromProto(std::move(proto));
}

// Names in both branches of an If: x_1 and x_2.
const char* kIfWithTwoBranches = R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (bool c, float[2] x) => (float[2] y)
{
  y = If (c) <then_branch = t () => (float[2] x_1) { x_1 = Relu (x) },
              else_branch = e () => (float[2] x_2) { x_2 = Neg (x) }>
}
)ONNX";

// A chain of Relus over v0 .. v<count - 1>: values with distinct names.
std::string reluChainText(int count) {
  std::string text = "<ir_version: 8, opset_import: [\"\" : 15]>\ng (float[2] v0) => (float[2] v" +
                     std::to_string(count - 1) + ")\n{\n";
  for (int i = 1; i < count; ++i) text += "  v" + std::to_string(i) + " = Relu (v" + std::to_string(i - 1) + ")\n";
  return text + "}\n";
}
}  // namespace

// A random walk of inserts, checked against std::unordered_map after every step, covers probe runs that wrap around
// the end and entries far from home.
TEST_CASE("ValueTable finds and replaces as a map of names does", "[ir][value_table]") {
  constexpr int kValues = 200;
  const std::string text = reluChainText(kValues);
  // Two models with the same names: a name may be registered to either of two values.
  auto model = parseModel(text);
  auto twin = parseModel(text);
  std::vector<Value*> values;
  for (int i = 0; i < kValues; ++i) {
    values.push_back(model->graph().findLocal("v" + std::to_string(i)));
    values.push_back(twin->graph().findLocal("v" + std::to_string(i)));
  }
  REQUIRE(values.back() != nullptr);

  std::mt19937 random(GENERATE(1u, 2u, 3u));
  ValueTable table;
  std::unordered_map<std::string, Value*> expected;
  for (int step = 0; step < 5000; ++step) {
    Value* value = values[random() % values.size()];
    REQUIRE(table.insert(value) == (expected.count(value->name()) ? expected[value->name()] : nullptr));
    expected[value->name()] = value;
    REQUIRE(table.size() == expected.size());
    if (step % 50 == 0)
      for (Value* probe : values) {
        const auto it = expected.find(probe->name());
        REQUIRE(table.find(probe->name()) == (it == expected.end() ? nullptr : it->second));
      }
  }
  CHECK(table.find("not a value") == nullptr);
  table.reserve(1000);
  for (const auto& [name, value] : expected) CHECK(table.find(name) == value);
}

TEST_CASE("ValueTable grows only past its capacity", "[ir][value_table]") {
  auto model = parseModel(reluChainText(100));
  ValueTable table;
  CHECK(table.capacity() == 0);
  table.reserve(40);
  const std::size_t reserved = table.capacity();
  REQUIRE(reserved >= 40);
  REQUIRE(reserved < 100);
  for (std::size_t i = 0; i < reserved; ++i) {
    REQUIRE(table.insert(model->graph().findLocal("v" + std::to_string(i))) == nullptr);
    CHECK(table.capacity() == reserved);
  }
  table.insert(model->graph().findLocal("v" + std::to_string(reserved)));
  CHECK(table.capacity() > reserved);
  for (std::size_t i = 0; i <= reserved; ++i) CHECK(table.find("v" + std::to_string(i)) != nullptr);
}

// Each fold adds a weight and a bias while the values it removes keep their entries: the room loading leaves takes
// them, so the table is not rebuilt while the rules run (by then a large graph's table is out of the CPU caches).
// The same goes for the list of initializers, to which the new weights and biases are appended before the ones they
// replace are dropped.
TEST_CASE("loading leaves the name table room for the values folding adds", "[ir][value_table]") {
  // Residual blocks as in the benchmark's chain: Conv (no bias) + BatchNormalization + Relu + Add.
  constexpr int kBlocks = 12;
  std::string text = "<ir_version: 8, opset_import: [\"\" : 15]>\ng (float[1,2,4,4] x0) => (float[1,2,4,4] x" +
                     std::to_string(kBlocks) + ")\n<";
  for (int b = 0; b < kBlocks; ++b) {
    const std::string i = std::to_string(b);
    text += std::string(b ? ", " : "") + "float[2,2,1,1] w" + i + " = {1, 0.5, -0.5, 1}, float[2] s" + i +
            " = {1.5, 0.5}, float[2] o" + i + " = {0.25, -1}, float[2] m" + i + " = {0.125, 1}, float[2] v" + i +
            " = {0.5, 2}";
  }
  text += ">\n{\n";
  for (int b = 0; b < kBlocks; ++b) {
    const std::string i = std::to_string(b), next = std::to_string(b + 1);
    text += "  c" + i + " = Conv (x" + i + ", w" + i + ")\n  n" + i + " = BatchNormalization (c" + i + ", s" + i +
            ", o" + i + ", m" + i + ", v" + i + ")\n  r" + i + " = Relu (n" + i + ")\n  x" + next + " = Add (r" + i +
            ", x" + i + ")\n";
  }
  text += "}\n";
  auto model = parseModel(text);
  const std::size_t loaded = model->graph().valueCapacity();
  const Value* const* initializerList = model->graph().initializers().data();
  DriverOptions options;
  options.rules = parseRuleSelection("");
  Report report;
  runRules(*model, options, report);
  REQUIRE(report.section("folds").size() == kBlocks);
  CHECK(model->graph().valueCapacity() == loaded);
  CHECK(model->graph().initializers().size() == 2 * kBlocks);  // each Conv's new weight and bias
  CHECK(model->graph().initializers().data() == initializerList);
}

TEST_CASE("ValueTable swaps the entries of two registered values only", "[ir][value_table]") {
  auto model = parseModel(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[2] a) => (float[2] c)
{
  b = Relu (a)
  c = Neg (b)
}
)ONNX");
  Value* a = model->graph().findLocal("a");
  Value* b = model->graph().findLocal("b");
  Value* c = model->graph().findLocal("c");
  ValueTable table;
  CHECK_FALSE(table.swapEntries(a, b));
  table.insert(a);
  table.insert(b);
  CHECK_FALSE(table.swapEntries(a, c));  // c is not registered: nothing changes
  CHECK(table.find("a") == a);
  CHECK(table.swapEntries(a, b));
  // The caller swaps the two names next; until then each name's entry holds the other value.
  CHECK(table.size() == 2);
  CHECK(table.find("c") == nullptr);
}

// A swap goes straight to the slots the two values were placed in; after a rehash has moved them, it finds them by name.
TEST_CASE("ValueTable swaps entries whose values a rehash has moved", "[ir][value_table]") {
  auto model = parseModel(reluChainText(3));
  Value* a = model->graph().findLocal("v0");
  Value* b = model->graph().findLocal("v1");
  ValueTable table;
  table.insert(a);
  table.insert(b);
  table.reserve(1000);
  REQUIRE(table.swapEntries(a, b));
  // Until the caller swaps the names, each entry holds a value under the other's name, which a lookup passes by.
  CHECK(table.find("v0") == nullptr);
  CHECK(table.find("v1") == nullptr);
  REQUIRE(table.swapEntries(a, b));
  CHECK(table.find("v0") == a);
  CHECK(table.find("v1") == b);
}

TEST_CASE("NameSet refuses a name it holds and grows past what was reserved", "[ir][value_table]") {
  NameSet names;
  names.reserve(4);
  for (int i = 0; i < 5000; ++i) REQUIRE(names.insert("value_" + std::to_string(i)));
  for (int i = 0; i < 5000; i += 7) REQUIRE_FALSE(names.insert("value_" + std::to_string(i)));
  CHECK(names.insert("value_5000"));
  CHECK(names.insert(""));
  CHECK_FALSE(names.insert(""));
}

TEST_CASE("unique names skip every name of the loaded model, nested graphs included", "[ir][value_table]") {
  auto model = parseModel(kIfWithTwoBranches);
  CHECK(model->uniqueValueName("x") == "x_3");
  CHECK(model->uniqueValueName("x") == "x_4");
  CHECK(model->uniqueValueName("fresh") == "fresh");
}

// A model whose nodes all have names reserves nothing on load: its names are reserved on the first request for a new
// one, from the IR. That request must still see every name, nested graphs' included.
TEST_CASE("unique names are reserved on first request when every node is named", "[ir][value_table]") {
  onnx::ModelProto proto = bnfold::test::parseModelProto(kIfWithTwoBranches);
  auto& node = *proto.mutable_graph()->mutable_node(0);
  node.set_name("If_0");
  for (auto& attr : *node.mutable_attribute()) attr.mutable_g()->mutable_node(0)->set_name(attr.name() + "_node");
  auto model = modelFromProto(std::move(proto));
  CHECK(model->graph().nodeList()[0]->name() == "If_0");
  CHECK(model->uniqueValueName("x") == "x_3");
  CHECK(model->uniqueValueName("y") == "y_1");
  CHECK(model->uniqueNodeName("If_0") == "If_0_1");
  CHECK(model->uniqueNodeName("then_branch_node") == "then_branch_node_1");
  CHECK(model->uniqueNodeName("fresh") == "fresh");
  CHECK(model->uniqueNodeName("fresh") == "fresh_1");
}

// The main graph's names are looked up in its own table, not copied into the model's name set: a name the main graph
// loses after names were first handed out must still never be handed out again. Every node is named, so that names
// are reserved on the first request, not on load.
TEST_CASE("unique names skip names the main graph dropped after names were first handed out", "[ir][value_table]") {
  auto model = parseModelWithNamedNodes(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[2] x) => (float[2] y)
<float[2] w = {1, 2}>
{
  c = Mul (x, w)
  d = Relu (c)
  y = Neg (d)
}
)ONNX");
  Graph& graph = model->graph();
  Report report;
  Rewriter rewriter(*model, report);
  CHECK(model->uniqueValueName("x") == "x_1");
  // `d` takes over from `y` (its own name goes), then Mul reads a new weight instead of `w` (which goes too).
  rewriter.replaceValueKeepingName(graph.findLocal("y"), graph.findLocal("d"));
  Value* w2 = rewriter.addInitializer(graph, Tensor::fromDoubles("", DataType::Float, {2}, {3, 4}), "w");
  CHECK(w2->name() == "w_1");
  rewriter.setInput(graph.findLocal("c")->producer(), 1, w2);
  rewriter.finish();
  graph.verify();
  REQUIRE(graph.findLocal("d") == nullptr);
  REQUIRE(graph.findLocal("w") == nullptr);
  CHECK(model->uniqueValueName("d") == "d_1");
  CHECK(model->uniqueValueName("w") == "w_2");
  CHECK(model->uniqueValueName("x_1") == "x_1_1");
  CHECK(model->uniqueValueName("c") == "c_1");
  CHECK(model->uniqueValueName("y") == "y_1");
}

// A retired value keeps its entry in its graph's table: lookups pass it by, and its name is never handed out again,
// even when it went before any name was asked for.
TEST_CASE("a retired value is found by no lookup and its name stays taken", "[ir][value_table]") {
  auto model = parseModelWithNamedNodes(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[2] x) => (float[2] y)
<float[2] w = {1, 2}>
{
  u = Mul (x, w)
  y = Neg (x)
}
)ONNX");
  Graph& graph = model->graph();
  Value* w = graph.findLocal("w");
  REQUIRE(w != nullptr);
  Report report;
  Rewriter rewriter(*model, report);
  // Erasing the unread Mul retires its output `u` and the weight `w` nobody reads any more.
  rewriter.eraseNode(graph.findLocal("u")->producer());
  CHECK(w->isRetired());
  CHECK(w->name() == "w");
  CHECK(graph.findLocal("w") == nullptr);
  CHECK(graph.lookup("u") == nullptr);
  graph.verify();
  CHECK(model->uniqueValueName("w") == "w_1");
  CHECK(model->uniqueValueName("u") == "u_1");
  rewriter.finish();
  graph.verify();
  CHECK(graph.initializers().empty());
  CHECK(model->uniqueValueName("w") == "w_2");
  CHECK(model->uniqueValueName("x") == "x_1");
}

// replaceValueKeepingName: the value taking over a name gives up its own, which stays taken by the retired value's
// entry, also when no name was asked for before.
TEST_CASE("a value replaced keeping its name holds the replacing value's old name", "[ir][value_table]") {
  auto model = parseModelWithNamedNodes(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[2] x) => (float[2] z)
{
  c = Relu (x)
  y = Neg (c)
  z = Abs (y)
}
)ONNX");
  Graph& graph = model->graph();
  Value* c = graph.findLocal("c");
  Value* y = graph.findLocal("y");
  Report report;
  Rewriter rewriter(*model, report);
  // The Neg goes; the Relu's output is called `y` from now on.
  rewriter.replaceValueKeepingName(y, c);
  CHECK(graph.findLocal("y") == c);
  CHECK(c->name() == "y");
  CHECK(y->isRetired());
  CHECK(y->name() == "c");
  CHECK(graph.findLocal("c") == nullptr);
  CHECK(graph.findLocal("z")->producer()->input(0) == c);
  rewriter.finish();
  graph.verify();
  CHECK(model->uniqueValueName("c") == "c_1");
  CHECK(model->uniqueValueName("y") == "y_1");
}

// A main-graph value the Rewriter makes keeps its name taken through the graph's table alone; a subgraph's is recorded
// with the names handed out. Neither name is handed out again, whoever asks.
TEST_CASE("names the rewriter gives new values are never given again, in the main graph or a subgraph",
          "[ir][value_table]") {
  auto model = parseModelWithNamedNodes(kIfWithTwoBranches);
  Graph& graph = model->graph();
  Graph& thenGraph = *model->allGraphs().at(1);
  Report report;
  Rewriter rewriter(*model, report);
  auto addWeight = [&](const Graph& where) {
    return rewriter.addInitializer(where, Tensor::fromDoubles("", DataType::Float, {2}, {1, 2}), "k")->name();
  };
  CHECK(addWeight(graph) == "k");
  CHECK(addWeight(graph) == "k_1");
  CHECK(model->uniqueValueName("k") == "k_2");
  CHECK(addWeight(thenGraph) == "k_3");
  CHECK(thenGraph.findLocal("k_3") != nullptr);
  CHECK(addWeight(graph) == "k_4");
  const Node* relu = thenGraph.findLocal("x_1")->producer();
  CHECK(rewriter.createNode(relu, "Identity", {graph.findLocal("x")}, {"k"}, "copy")->output(0)->name() == "k_5");
  CHECK(model->uniqueValueName("k") == "k_6");
}

// An initializer retired by replaceValueKeepingName leaves the list of initializers as one retired by eraseNode does.
TEST_CASE("an initializer replaced keeping its name leaves the initializers", "[ir][value_table]") {
  auto model = parseModelWithNamedNodes(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[2] x) => (float[2] y)
<float[2] w = {1, 2}>
{
  c = Relu (x)
  y = Mul (x, w)
}
)ONNX");
  Graph& graph = model->graph();
  Value* w = graph.findLocal("w");
  Value* c = graph.findLocal("c");
  Report report;
  Rewriter rewriter(*model, report);
  rewriter.replaceValueKeepingName(w, c);  // the Mul reads the Relu's output, called `w` from now on
  rewriter.finish();
  graph.verify();
  CHECK(w->isRetired());
  CHECK(graph.initializers().empty());
  CHECK(graph.findLocal("y")->producer()->input(1) == c);
}
