// Node lists that are not in topological order (keras2onnx, onnxconverter-common, CNTK, hand edits): loaded
// sorted, stably, in every graph; a real cycle and an undefined value stay errors; `fold` says what it sorted.
// ONNX text (onnx::OnnxParser) takes nodes in any order, so the unsorted models are stated directly.

#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <random>

#include <nlohmann/json.hpp>

#include "bnfold/error.h"
#include "bnfold/io/model_io.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
namespace fs = std::filesystem;

namespace {

constexpr double kAtol = 1e-5, kRtol = 1e-5;

// Conv -> BN -> Relu stored backwards, with a Neg -> Abs chain stored in valid positions between them.
const char* kUnsortedConvBn = R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,3,3] x) => (float[1,2,3,3] y, float[1,2,3,3] z)
<float[2,2,1,1] w = {0.5, -1.25, 2, 0.75}, float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1},
 float[2] m = {0.125, -0.375}, float[2] v = {0.5, 2}>
{
  y = Relu (t)
  a = Neg (x)
  t = BatchNormalization (c, s, b, m, v)
  z = Abs (a)
  c = Conv (x, w)
}
)ONNX";

// The If reads `late` (both branches) and `deep` (only through an If nested in its then-branch), both defined
// after it; the then-branch's own nodes are stored backwards; the else-branch is sorted.
const char* kUnsortedSubgraphs = R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[2] x, bool cond) => (float[2] y)
{
  y = If (cond) <
    then_branch = then_g () => (float[2] t) {
      t = Neg (u)
      u = If (cond) <
        then_branch = inner_then () => (float[2] p) { p = Add (deep, late) },
        else_branch = inner_else () => (float[2] q) { q = Sub (deep, late) }
      >
    },
    else_branch = else_g () => (float[2] e) {
      r = Relu (late)
      e = Abs (r)
    }
  >
  late = Sigmoid (x)
  deep = Tanh (late)
}
)ONNX";

// A Conv -> BN -> Relu main graph (sorted) with an If whose branches are sorted too.
const char* kSortedWithSubgraphs = R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,3,3] x, bool cond) => (float[1,2,3,3] y)
<float[2,2,1,1] w = {0.5, -1.25, 2, 0.75}, float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1},
 float[2] m = {0.125, -0.375}, float[2] v = {0.5, 2}>
{
  c = Conv (x, w)
  t = BatchNormalization (c, s, b, m, v)
  y = If (cond) <
    then_branch = then_g () => (float[1,2,3,3] p) { n = Neg (t)
                                                   p = Relu (n) },
    else_branch = else_g () => (float[1,2,3,3] q) { q = Abs (t) }
  >
}
)ONNX";

// Names every node "<graph>/<op>_<index>", so a load/save round trip has nothing to add.
void nameEveryNode(onnx::GraphProto& graph) {
  for (int i = 0; i < graph.node_size(); ++i) {
    onnx::NodeProto& node = *graph.mutable_node(i);
    node.set_name(graph.name() + "/" + node.op_type() + "_" + std::to_string(i));
    for (auto& attr : *node.mutable_attribute()) {
      if (attr.has_g()) nameEveryNode(*attr.mutable_g());
      for (auto& body : *attr.mutable_graphs()) nameEveryNode(body);
    }
  }
}

std::string writeProto(const TempDir& dir, const std::string& name, const onnx::ModelProto& proto) {
  std::string bytes;
  REQUIRE(proto.SerializeToString(&bytes));
  writeFile(dir.file(name), bytes);
  return dir.file(name);
}

std::string writeText(const TempDir& dir, const std::string& name, const std::string& text) {
  onnx::ModelProto proto = parseModelProto(text);
  nameEveryNode(*proto.mutable_graph());
  return writeProto(dir, name, proto);
}

// The op types of a subgraph's nodes, in order.
std::string subgraphOps(const Node& owner, std::size_t slot) {
  return opSequence(*owner.subgraphs().at(slot).graph);
}

void verifyEveryGraph(Model& model) {
  for (Graph* graph : model.allGraphs()) graph->verify();
}

std::string shellQuote(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

TEST_CASE("an unsorted main graph loads sorted, keeping nodes already in a valid place in their order",
          "[io][unsorted]") {
  auto model = parseModel(kUnsortedConvBn);
  verifyEveryGraph(*model);
  // Neg and Abs were ready where they were stored: they stay first, in their order; Conv, BN, Relu follow
  // in dependency order.
  CHECK(opSequence(model->graph()) == "Neg,Abs,Conv,BatchNormalization,Relu");
  REQUIRE(model->reorderedGraphs().size() == 1);
  const ReorderedGraph& reordered = model->reorderedGraphs().front();
  CHECK(reordered.graph == "g");
  CHECK_FALSE(reordered.subgraph);
  CHECK(reordered.ownerNode.empty());
  CHECK(reordered.movedNodes == 2);  // Neg, Abs, Conv keep their relative order: only BN and Relu move
  // Unnamed nodes are numbered in the sorted order.
  CHECK(findNode(model->graph(), "Conv")->name() == "Conv_0");
}

TEST_CASE("an unsorted model folds, and ONNX Runtime gives the same results as on the unsorted original",
          "[io][unsorted][bn-fold]") {
  TempDir dir;
  const std::string original = writeText(dir, "unsorted.onnx", kUnsortedConvBn);
  auto model = loadModel(original);
  const Report report = applyRules(*model, {"bn-fold"});
  CHECK(report.section("folds").size() == 1);
  CHECK(opSequence(model->graph()) == "Neg,Abs,Conv,Relu");
  saveModel(*model, dir.file("folded.onnx"));
  // ONNX Runtime sorts the original itself; the output is sorted already.
  const OrtComparison comparison = compareInOrt(original, dir.file("folded.onnx"), kAtol, kRtol);
  INFO(comparison.error << comparison.details.dump());
  CHECK(comparison.ok);
  // The written model is in the sorted order.
  onnx::ModelProto written;
  REQUIRE(written.ParseFromString(readFile(dir.file("folded.onnx"))));
  std::vector<std::string> ops;
  for (const auto& node : written.graph().node()) ops.push_back(node.op_type());
  CHECK(ops == std::vector<std::string>{"Neg", "Abs", "Conv", "Relu"});
}

TEST_CASE("unsorted subgraphs are sorted, and a node owning a subgraph waits for the outer values it reads",
          "[io][unsorted][subgraph]") {
  TempDir dir;
  const std::string original = writeText(dir, "unsorted_if.onnx", kUnsortedSubgraphs);
  auto model = loadModel(original);
  verifyEveryGraph(*model);
  // `late` and `deep` are read inside the If (deep only by the If nested in its then-branch): the If follows both.
  CHECK(opSequence(model->graph()) == "Sigmoid,Tanh,If");
  const Node* outerIf = findNode(model->graph(), "If");
  CHECK(subgraphOps(*outerIf, 0) == "If,Neg");
  CHECK(subgraphOps(*outerIf, 1) == "Relu,Abs");
  // Main graph first, then the subgraphs that moved, depth-first.
  REQUIRE(model->reorderedGraphs().size() == 2);
  CHECK(model->reorderedGraphs()[0].graph == "g");
  CHECK_FALSE(model->reorderedGraphs()[0].subgraph);
  CHECK(model->reorderedGraphs()[0].movedNodes == 1);
  CHECK(model->reorderedGraphs()[1].graph == "then_g");
  CHECK(model->reorderedGraphs()[1].subgraph);
  CHECK(model->reorderedGraphs()[1].ownerNode == outerIf->name());
  CHECK(model->reorderedGraphs()[1].movedNodes == 1);

  saveModel(*model, dir.file("sorted.onnx"));
  // ONNX Runtime 1.30 sorts an unsorted main graph but refuses an unsorted subgraph ("Nodes in a graph must be
  // topologically sorted"): its reference is the original with only the then-branch's two nodes swapped back.
  onnx::ModelProto reference = parseModelProto(kUnsortedSubgraphs);
  nameEveryNode(*reference.mutable_graph());
  REQUIRE(reference.graph().node(0).attribute(0).name() == "then_branch");
  reference.mutable_graph()->mutable_node(0)->mutable_attribute(0)->mutable_g()->mutable_node()->SwapElements(0, 1);
  writeProto(dir, "reference.onnx", reference);
  for (bool cond : {true, false}) {
    INFO("cond " << cond);
    // The comparison draws random inputs: fix the branch by making cond a constant of each model.
    for (const std::string& name : {std::string("reference.onnx"), std::string("sorted.onnx")}) {
      onnx::ModelProto proto;
      REQUIRE(proto.ParseFromString(readFile(dir.file(name))));
      auto* graph = proto.mutable_graph();
      graph->mutable_input()->DeleteSubrange(1, 1);
      auto* constant = graph->add_initializer();
      constant->set_name("cond");
      constant->set_data_type(onnx::TensorProto::BOOL);
      constant->add_int32_data(cond ? 1 : 0);
      writeProto(dir, "fixed_" + name, proto);
    }
    const OrtComparison comparison =
        compareInOrt(dir.file("fixed_reference.onnx"), dir.file("fixed_sorted.onnx"), kAtol, kRtol);
    INFO(comparison.error << comparison.details.dump());
    CHECK(comparison.ok);
  }
}

TEST_CASE("a graph with a cycle is refused with one line naming a node on the cycle", "[io][unsorted][bad-input]") {
  TempDir dir;
  struct Case {
    const char* what;
    const char* text;
    std::vector<std::string> onCycle;  // op types of the nodes on the cycle
  };
  const Case cases[] = {
      {"a three-node cycle beside a valid node", R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[2] x) => (float[2] y)
{
  y = Relu (x)
  a = Add (x, c)
  b = Neg (a)
  c = Abs (b)
}
)ONNX",
       {"Add", "Neg", "Abs"}},
      {"a node reading its own output", R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[2] x) => (float[2] y)
{
  y = Add (x, y)
}
)ONNX",
       {"Add"}},
      {"a cycle inside an If branch", R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[2] x, bool cond) => (float[2] y)
{
  y = If (cond) <
    then_branch = then_g () => (float[2] t) { t = Neg (u)
                                             u = Abs (t) },
    else_branch = else_g () => (float[2] e) { e = Relu (x) }
  >
}
)ONNX",
       {"Neg", "Abs"}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const std::string input = writeText(dir, "cycle.onnx", c.text);
    fs::create_directories(dir.file("out"));
    std::string out, err;
    const int code = runCommand(cli("fold " + shellQuote(input) + " -o " + shellQuote(dir.file("out/y.onnx")) +
                                    " --report " + shellQuote(dir.file("out/r.json"))),
                                &out, &err);
    CHECK(code == 2);
    CHECK(lines(err).size() == 1);
    CHECK_THAT(err, Catch::Contains(input) && Catch::Contains("has a cycle through node"));
    // The node named in "through node 'N' (Op)" is one of the cycle's.
    const bool namesACycleNode = std::any_of(c.onCycle.begin(), c.onCycle.end(), [&](const std::string& op) {
      return err.find("' (" + op + ")") != std::string::npos;
    });
    CHECK(namesACycleNode);
    CHECK(fs::is_empty(dir.file("out")));
  }
}

TEST_CASE("a value no node, initializer or input defines is still refused when nodes are unsorted",
          "[io][unsorted][bad-input]") {
  TempDir dir;
  const std::string input = writeText(dir, "ghost.onnx", R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[2] x) => (float[2] y)
{
  y = Relu (a)
  a = Add (x, ghost)
}
)ONNX");
  fs::create_directories(dir.file("out"));
  std::string out, err;
  const int code = runCommand(cli("fold " + shellQuote(input) + " -o " + shellQuote(dir.file("out/y.onnx"))), &out, &err);
  CHECK(code == 2);
  CHECK(lines(err).size() == 1);
  CHECK_THAT(err, Catch::Contains("reads 'ghost', which no node, initializer or graph input defines"));
  CHECK(fs::is_empty(dir.file("out")));
  // The same through the library: an Error, not a crash or a half-built model.
  CHECK_THROWS_AS(loadModel(input), Error);
}

TEST_CASE("fold warns once about sorted graphs and lists them in the report", "[io][unsorted][cli][report]") {
  TempDir dir;
  const std::string input = writeText(dir, "unsorted_if.onnx", kUnsortedSubgraphs);
  std::string out, err;
  const int code = runCommand(cli("fold " + shellQuote(input) + " -o " + shellQuote(dir.file("out.onnx")) +
                                  " --report " + shellQuote(dir.file("report.json"))),
                              &out, &err);
  REQUIRE(code == 0);
  CHECK(lines(err) == std::vector<std::string>{"bnfold: warning: " + input +
                                               ": nodes were not in topological order; sorted the main graph and 1 "
                                               "subgraph (2 nodes moved)"});
  const nlohmann::json report = nlohmann::json::parse(readFile(dir.file("report.json")));
  REQUIRE(report.contains("graph_reordered"));
  const auto& reordered = report["graph_reordered"];
  REQUIRE(reordered.size() == 2);
  CHECK(reordered[0] == nlohmann::json({{"graph", "g"}, {"subgraph_of", nullptr}, {"moved_nodes", 1}}));
  CHECK(reordered[1]["graph"] == "then_g");
  CHECK(reordered[1]["subgraph_of"] == "g/If_0");
  CHECK(reordered[1]["moved_nodes"] == 1);
  // Sorting is no rewrite: the rewrite sections stay empty.
  for (const char* section : kReportSections) CHECK(report[section].empty());
  // The report schema accepts the field, and refuses an entry that lacks its count.
  auto validate = [&](const std::string& file, std::string* output) {
    std::string errors;
    const int status = runCommand(
        "/usr/bin/python3 " + shellQuote(sourceDir() + "/scripts/validate_report.py") + " " + shellQuote(file), output,
        &errors);
    *output += errors;
    return status;
  };
  std::string validation;
  CHECK(validate(dir.file("report.json"), &validation) == 0);
  INFO(validation);
  nlohmann::json broken = report;
  broken["graph_reordered"][0].erase("moved_nodes");
  writeFile(dir.file("broken.json"), broken.dump());
  CHECK(validate(dir.file("broken.json"), &validation) == 1);
  CHECK_THAT(validation, Catch::Contains("moved_nodes"));
  // -q silences the warning; the written model loads without sorting.
  CHECK(runCommand(cli("-q fold " + shellQuote(input) + " -o " + shellQuote(dir.file("quiet.onnx"))), &out, &err) == 0);
  CHECK(err.empty());
  CHECK(loadModel(dir.file("out.onnx"))->reorderedGraphs().empty());
}

TEST_CASE("a sorted model with subgraphs is untouched and the report says nothing was reordered",
          "[io][unsorted][round-trip]") {
  TempDir dir;
  const std::string input = writeText(dir, "sorted.onnx", kSortedWithSubgraphs);
  REQUIRE(loadModel(input)->reorderedGraphs().empty());
  std::string out, err;
  const int code = runCommand(cli("fold " + shellQuote(input) + " -o " + shellQuote(dir.file("out.onnx")) +
                                  " --rules none --report " + shellQuote(dir.file("report.json"))),
                              &out, &err);
  REQUIRE(code == 0);
  CHECK(err.empty());
  CHECK(readFile(dir.file("out.onnx")) == readFile(input));
  const nlohmann::json report = nlohmann::json::parse(readFile(dir.file("report.json")));
  REQUIRE(report.contains("graph_reordered"));
  CHECK(report["graph_reordered"] == nlohmann::json::array());
}

TEST_CASE("check lists an unsorted graph as a finding that fails only when asked", "[io][unsorted][cli][check]") {
  TempDir dir;
  const std::string input = writeText(dir, "unsorted_if.onnx", kUnsortedSubgraphs);
  std::string out, err;
  CHECK(runCommand(cli("check --format json " + shellQuote(input)), &out, &err) == 0);
  const nlohmann::json document = nlohmann::json::parse(out);
  const auto& findings = document["models"][0]["findings"];
  REQUIRE(findings.size() == 2);
  for (const auto& finding : findings) {
    CHECK(finding["category"] == "unsorted-graph");
    CHECK(finding["severity"] == "warning");
  }
  CHECK(findings[0]["graph"] == "g");
  CHECK(findings[1]["graph"] == "then_g");
  CHECK_THAT(findings[1]["message"].get<std::string>(), Catch::Contains("subgraph 'then_g' of node 'g/If_0'"));
  CHECK(runCommand(cli("check --fail-on unsorted-graph " + shellQuote(input)), &out, &err) == 1);
  CHECK_THAT(out, Catch::Contains("unsorted-graph"));
}

TEST_CASE("fold --in-place writes an unsorted model back sorted even when no rule changes it",
          "[io][unsorted][cli][batch]") {
  TempDir dir;
  const std::string input = writeText(dir, "unsorted.onnx", kUnsortedConvBn);
  const std::string before = readFile(input);
  std::string out, err;
  CHECK(runCommand(cli("-q fold " + shellQuote(input) + " --in-place --rules none"), &out, &err) == 0);
  CHECK(readFile(input) != before);
  auto model = loadModel(input);
  CHECK(model->reorderedGraphs().empty());
  CHECK(opSequence(model->graph()) == "Neg,Abs,Conv,BatchNormalization,Relu");
}

namespace {

// A random graph over few names, so that orders go wrong in every way: nodes stored in random order, reads of
// names defined later or nowhere, a name written twice, self-reads, and If branches whose nodes read outer names
// or write names the outer graph also defines (shadowing). About half the nodes are unnamed.
onnx::ModelProto randomOrderModel(std::mt19937& random) {
  auto pick = [&random](int n) { return static_cast<int>(random() % static_cast<unsigned>(n)); };
  // A name node `i` reads: mostly one written by an earlier node (in creation order, before the shuffle), now
  // and then a later one (a possible cycle) or one nothing writes.
  auto readBy = [&pick](int i) {
    const int roll = pick(60);
    if (roll == 0) return std::string("ghost");
    if (roll == 1) return "n" + std::to_string(i + pick(3));
    if (i == 0 || roll < 12) return std::string("x");
    return "n" + std::to_string(pick(i));
  };
  onnx::ModelProto model;
  model.set_ir_version(8);
  model.add_opset_import()->set_version(15);
  onnx::GraphProto& graph = *model.mutable_graph();
  graph.set_name("g");
  for (const char* input : {"x", "cond"}) graph.add_input()->set_name(input);
  const int nodeCount = 3 + pick(10);
  for (int i = 0; i < nodeCount; ++i) {
    onnx::NodeProto& node = *graph.add_node();
    if (pick(2) == 0) node.set_name("node" + std::to_string(i));
    node.add_output(pick(30) == 0 ? readBy(i) : "n" + std::to_string(i));  // now and then a clash
    if (pick(4) > 0) {
      node.set_op_type(pick(2) == 0 ? "Add" : "Neg");
      node.add_input(readBy(i));
      if (node.op_type() == "Add") node.add_input(readBy(i));
      continue;
    }
    node.set_op_type("If");
    node.add_input("cond");
    for (const char* branchName : {"then_branch", "else_branch"}) {
      onnx::AttributeProto& attr = *node.add_attribute();
      attr.set_name(branchName);
      attr.set_type(onnx::AttributeProto::GRAPH);
      onnx::GraphProto& body = *attr.mutable_g();
      body.set_name(std::string(branchName) + std::to_string(i));
      const int bodyCount = 1 + pick(3);
      std::string last;
      for (int j = 0; j < bodyCount; ++j) {
        onnx::NodeProto& inner = *body.add_node();
        inner.set_op_type("Neg");
        inner.add_input(j > 0 && pick(2) == 0 ? last : readBy(i));
        last = pick(6) == 0 ? readBy(i) : body.name() + "_v" + std::to_string(j);  // sometimes shadowing
        inner.add_output(last);
      }
      if (pick(2) == 0) std::shuffle(body.mutable_node()->begin(), body.mutable_node()->end(), random);
      body.add_output()->set_name(last);
    }
  }
  if (pick(2) == 0) std::shuffle(graph.mutable_node()->begin(), graph.mutable_node()->end(), random);
  graph.add_output()->set_name(graph.node(pick(nodeCount)).output(0));
  return model;
}

// What loading gave: the error, or the model as written and what was sorted.
std::string loadOutcome(const std::function<std::unique_ptr<Model>()>& load, const std::string& savePath) {
  std::unique_ptr<Model> model;
  try {
    model = load();
  } catch (const Error& error) {
    return std::string("error: ") + error.what();
  }
  std::string outcome = "sorted:";
  for (const ReorderedGraph& graph : model->reorderedGraphs())
    outcome += " " + graph.graph + "/" + graph.ownerNode + "/" + std::to_string(graph.movedNodes);
  saveModel(*model, savePath);
  return outcome + "\n" + readFile(savePath);
}

}  // namespace

// loadModel builds a file's graphs in the stored order and falls back to sorting first only when that fails;
// modelFromProto always sorts first. Both must give the same model, the same sorting report and the same errors.
TEST_CASE("building in the stored order gives what sorting first gives, for every order and every error",
          "[io][unsorted]") {
  TempDir dir;
  std::mt19937 random(20261125);
  int sorted = 0, refused = 0, asStored = 0;
  for (int i = 0; i < 400; ++i) {
    const onnx::ModelProto proto = randomOrderModel(random);
    const std::string path = writeProto(dir, "random.onnx", proto);
    const std::string fromFile = loadOutcome([&] { return loadModel(path); }, dir.file("from_file.onnx"));
    const std::string sortedFirst = loadOutcome(
        [&] { return modelFromProto(onnx::ModelProto(proto), path, dir.path()); }, dir.file("from_proto.onnx"));
    INFO("model " << i << ":\n" << proto.DebugString());
    REQUIRE(fromFile == sortedFirst);
    if (fromFile.rfind("error: ", 0) == 0) ++refused;
    else if (fromFile.rfind("sorted:\n", 0) == 0) ++asStored;
    else ++sorted;
  }
  // The walk must cover all three outcomes, or it proves less than it claims.
  CHECK(sorted > 20);
  CHECK(refused > 20);
  CHECK(asStored > 20);
}
