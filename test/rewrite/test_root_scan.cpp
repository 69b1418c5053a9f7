#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "bnfold/ir/model.h"
#include "bnfold/report/report.h"
#include "bnfold/rewrite/rewriter.h"
#include "rewrite/root_scan.h"
#include "test_support.h"

using namespace bnfold;
using bnfold::test::parseModel;

namespace {

// Adds are the roots. The BatchNormalization's output is read by nothing, so a rewrite may erase it.
const char* kAddsInTwoGraphs = R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2] x, bool cond) => (float[1,2] y, float[1,2] u)
<float[2] s = {1, 2}, float[2] b = {0, 1}, float[2] m = {0, 0}, float[2] v = {1, 1}>
{
  a = Relu (x)
  first = Add (a, a)
  unread = BatchNormalization (first, s, b, m, v)
  second = Add (first, first)
  y = Identity (second)
  u = If (cond) <
    then_branch = t () => (float[1,2] ty) { ty = Add (x, x) },
    else_branch = e () => (float[1,2] ey) { ey = Identity (x) }>
}
)";

bool isAdd(const Node& node) { return node.isOnnxOp("Add"); }

const Node* producerOf(const Graph& graph, const std::string& value) { return graph.findLocal(value)->producer(); }

// The names of what the scan yields from here on, "" for the subgraph's Add.
std::vector<std::string> drain(RootScan& scan) {
  std::vector<std::string> outputs;
  while (Node* root = scan.next()) outputs.push_back(root->output(0)->name());
  return outputs;
}

// A scan of kAddsInTwoGraphs listening to a rewriter, as in the driver.
struct ScanWhileRewriting {
  std::unique_ptr<Model> model = parseModel(kAddsInTwoGraphs);
  Graph& graph = model->graph();
  RootScan scan{model->allGraphs(), isAdd};
  Report report;
  Rewriter rewriter{*model, report};
  ScanWhileRewriting() { rewriter.addListener(&scan); }
  ~ScanWhileRewriting() { rewriter.removeListener(&scan); }
};

}  // namespace

TEST_CASE("loading numbers the nodes along the list, and numberNodes numbers those a rewrite made", "[ir][root_scan]") {
  auto model = parseModel(kAddsInTwoGraphs);
  Graph& graph = model->graph();
  std::uint32_t expected = 0;
  for (const auto& node : graph.nodes()) CHECK(node->order() == expected++);
  Report report;
  Rewriter rewriter(*model, report);
  const Node* identity = producerOf(graph, "y");
  const Node* made = rewriter.createNode(identity, "Neg", {graph.findLocal("second")}, {"negated"}, "neg");
  CHECK(made->order() == Node::kUnnumbered);
  graph.numberNodes();
  expected = 0;
  for (const auto& node : graph.nodes()) CHECK(node->order() == expected++);
}

TEST_CASE("the root scan yields each root in list order, a subgraph's after the main graph's", "[rewrite][root_scan]") {
  auto model = parseModel(kAddsInTwoGraphs);
  RootScan scan(model->allGraphs(), isAdd);
  CHECK_FALSE(scan.done());
  CHECK(drain(scan) == std::vector<std::string>{"first", "second", "ty"});
  CHECK(scan.done());
}

TEST_CASE("the root scan passes a node a rewrite erases at its place before it leaves the list",
          "[rewrite][root_scan]") {
  ScanWhileRewriting s;
  auto& [model, graph, scan, report, rewriter] = s;
  REQUIRE(scan.next() == producerOf(graph, "first"));
  // The scan now stands at the BatchNormalization; erased there, it leaves a list position behind.
  const Node* batchNorm = producerOf(graph, "unread");
  rewriter.eraseNode(batchNorm);
  REQUIRE(batchNorm->isErased());
  CHECK(drain(scan) == std::vector<std::string>{"second", "ty"});
}

TEST_CASE("the root scan leaves out the nodes rewrites make and knows which roots are still to come",
          "[rewrite][root_scan]") {
  ScanWhileRewriting s;
  auto& [model, graph, scan, report, rewriter] = s;
  const Node* first = producerOf(graph, "first");
  const Node* second = producerOf(graph, "second");
  const Node* subgraphAdd = model->allGraphs().at(1)->findLocal("ty")->producer();
  CHECK(scan.willYield(*first));
  REQUIRE(scan.next() == first);
  CHECK_FALSE(scan.willYield(*first));
  CHECK(scan.willYield(*second));
  CHECK(scan.willYield(*subgraphAdd));
  // An Add made ahead of the scan, right before the main graph's last node: not there when the scan began.
  const Node* made = rewriter.createNode(producerOf(graph, "y"), "Add", {graph.findLocal("a"), graph.findLocal("a")},
                                         {"made"}, "made_add");
  CHECK_FALSE(scan.willYield(*made));
  REQUIRE(scan.next() == second);
  CHECK_FALSE(scan.willYield(*second));
  CHECK(scan.willYield(*subgraphAdd));
  REQUIRE(scan.next() == subgraphAdd);
  CHECK_FALSE(scan.willYield(*subgraphAdd));
  CHECK(scan.next() == nullptr);
  CHECK(scan.done());
}

// A second run on a model in memory starts from the nodes the first run made, as it would from the same model saved
// and loaded again.
TEST_CASE("rules run again on a rewritten model start from the nodes the first run made", "[rewrite][root_scan]") {
  const char* convBatchNorm = R"(<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,3,3] x) => (float[1,2,3,3] y)
<float[2,2,1,1] w = {1, 0.5, -0.25, 2}, float[2] s = {1.5, -0.5}, float[2] b = {0.25, -1}, float[2] m = {0.125, -0.375},
 float[2] v = {0.5, 2}>
{
  c = Conv (x, w)
  y = BatchNormalization (c, s, b, m, v)
}
)";
  auto model = parseModel(convBatchNorm);
  bnfold::test::applyRules(*model, {"bn-decompose"});
  REQUIRE(bnfold::test::opSequence(model->graph()) == "Conv,Mul,Add");
  const Report second = bnfold::test::applyRules(*model, {"scale-fold", "bias-add"});
  CHECK(bnfold::test::opSequence(model->graph()) == "Conv");
  CHECK(second.section("scale_folded").size() == 1);
  CHECK(second.section("bias_absorbed").size() == 1);
}
