#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "analysis/value_shape.h"
#include "bnfold/report/report.h"
#include "bnfold/rewrite/rewriter.h"
#include "bnfold/rewrite/rule.h"
#include "test_support.h"

using namespace bnfold;
using bnfold::test::parseModel;

namespace {
// `blocks` residual blocks, y_k = Relu(BN(Conv(y_{k-1}))) + y_{k-1}: each block's input is read on two paths, the
// shape query's worst case. Only the graph input and output declare shapes, and the output is read through an Identity.
std::string residualChain(int blocks) {
  std::string weights, nodes;
  for (int k = 1; k <= blocks; ++k) {
    const std::string b = std::to_string(k), in = k == 1 ? "x" : "y" + std::to_string(k - 1);
    weights += ", float[2,2,1,1] w" + b + " = {1,0,0,1}, float[2] s" + b + " = {1,1}, float[2] o" + b +
               " = {0,0}, float[2] m" + b + " = {0,0}, float[2] v" + b + " = {1,1}";
    nodes += "  c" + b + " = Conv (" + in + ", w" + b + ")\n";
    nodes += "  n" + b + " = BatchNormalization (c" + b + ", s" + b + ", o" + b + ", m" + b + ", v" + b + ")\n";
    nodes += "  r" + b + " = Relu (n" + b + ")\n";
    nodes += "  y" + b + " = Add (r" + b + ", " + in + ")\n";
  }
  nodes += "  out = Identity (y" + std::to_string(blocks) + ")\n";
  return "<ir_version: 8, opset_import: [\"\" : 15]>\ng (float[1,2,4,4] x) => (float[1,2,4,4] out)\n<" +
         weights.substr(2) + ">\n{\n" + nodes + "}\n";
}

// "[1,2,4,4]" (-1 for an unknown dim), or "unknown" when not even the rank is known.
std::string shapeText(const std::optional<std::vector<int64_t>>& shape) {
  if (!shape) return "unknown";
  std::string text;
  for (int64_t dim : *shape) text += (text.empty() ? "" : ",") + std::to_string(dim);
  return "[" + text + "]";
}
std::string shapeText(const Value* value) { return shapeText(analysis::knownShape(*value)); }

// The outputs of the graph's nodes, in graph order.
std::vector<const Value*> nodeOutputs(const Graph& graph) {
  std::vector<const Value*> values;
  for (const auto& node : graph.nodes())
    for (const Value* output : node->outputs())
      if (output) values.push_back(output);
  return values;
}

// Takes every BatchNormalization out of the chain (its Conv's output takes the BN output's place): each block's
// path gets one step shorter, so shapes further down the chain come within the depth bound.
int removeBatchNorms(Model& model, Rewriter& rewriter) {
  std::vector<const Node*> batchNorms;
  for (const auto& node : model.graph().nodes())
    if (node->opType() == "BatchNormalization") batchNorms.push_back(node.get());
  for (const Node* bn : batchNorms) rewriter.replaceValueKeepingName(bn->output(0), bn->input(0));
  return static_cast<int>(batchNorms.size());
}
}  // namespace

TEST_CASE("a shape is inferred through a residual chain from the graph input", "[shape]") {
  // Six blocks: every path back to x fits in the depth bound. Each block's input is reached on two paths, and a
  // query works each (value, depth) out once: the answers are those of following every path.
  auto model = parseModel(residualChain(6));
  for (int k = 1; k <= 6; ++k) {
    CAPTURE(k);
    CHECK(shapeText(model->graph().findLocal("y" + std::to_string(k))) == "[1,2,4,4]");
    CHECK(shapeText(model->graph().findLocal("r" + std::to_string(k))) == "[1,2,4,4]");
  }
}

TEST_CASE("beyond the depth bound a residual chain's shape is unknown, not guessed", "[shape]") {
  // 40 blocks: the last block's input is more producers away from x than the bound allows on either path.
  auto model = parseModel(residualChain(40));
  CHECK(shapeText(model->graph().findLocal("y40")) == "unknown");
  CHECK(shapeText(model->graph().findLocal("c1")) == "[1,2,4,4]");
}

TEST_CASE("values read more than once keep their own shapes within one query", "[shape]") {
  // v and u are both read twice, so the query remembers both, at the same depth: v's shape must not stand for u's.
  auto model = parseModel(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,4,4] x) => (float[1,2,4,4] out)
{
  v = GlobalAveragePool (x)
  u = Relu (x)
  q = Add (v, u)
  w = Mul (u, v)
  out = Add (q, w)
}
)ONNX");
  CHECK(shapeText(model->graph().findLocal("q")) == "[1,2,4,4]");
  CHECK(shapeText(model->graph().findLocal("v")) == "[1,2,1,1]");
}

TEST_CASE("remembered shapes: each answer is the one a fresh query gives, whatever was asked before", "[shape]") {
  // In a chain longer than the depth bound a value's shape depends on how many steps the query has left when it gets
  // there; facts one query worked out must not answer another query that reaches the value at another depth.
  auto model = parseModel(residualChain(40));
  const std::vector<const Value*> values = nodeOutputs(model->graph());
  int known = 0;
  for (bool backwards : {false, true}) {
    analysis::ShapeFacts facts;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const Value* value = values[backwards ? values.size() - 1 - i : i];
      CAPTURE(backwards, value->name());
      const std::string answer = shapeText(facts.knownShape(*value));
      CHECK(answer == shapeText(value));
      known += answer != "unknown";
    }
  }
  // Both kinds of answer occur, so a fact carried over from the wrong depth would show.
  CHECK(known > 0);
  CHECK(known < static_cast<int>(2 * values.size()));
}

// The y_k whose fresh answers differ between `before` (by name) and now.
static std::vector<const Value*> changedSums(const Model& model, const std::map<std::string, std::string>& before) {
  std::vector<const Value*> changed;
  for (int k = 1; k <= 12; ++k) {
    const Value* sum = model.graph().findLocal("y" + std::to_string(k));
    if (shapeText(sum) != before.at(sum->name())) changed.push_back(sum);
  }
  return changed;
}

static std::map<std::string, std::string> freshAnswers(const Model& model) {
  std::map<std::string, std::string> answers;
  for (const Value* value : nodeOutputs(model.graph())) answers[value->name()] = shapeText(value);
  return answers;
}

TEST_CASE("remembered shapes: a rule context following the rewriter answers as a fresh query after changes",
          "[shape]") {
  auto model = parseModel(residualChain(12));
  const RuleOptions options;
  const RuleContext context(*model, options);
  Report report;
  Rewriter rewriter(*model, report);
  context.followChanges(rewriter);
  const auto before = freshAnswers(*model);
  for (const Value* value : nodeOutputs(model->graph())) {
    CAPTURE(value->name());
    CHECK(shapeText(context.knownShape(*value)) == before.at(value->name()));
  }

  REQUIRE(removeBatchNorms(*model, rewriter) == 12);
  // Three steps a block instead of four: some sums come nearer to x than the bound, so their answers change.
  CHECK_FALSE(changedSums(*model, before).empty());
  for (const Value* value : nodeOutputs(model->graph())) {
    CAPTURE(value->name());
    CHECK(shapeText(context.knownShape(*value)) == shapeText(value));
  }
  context.stopFollowing(rewriter);
}

TEST_CASE("remembered shapes: a rule context not following the rewriter forgets them when the model changes",
          "[shape]") {
  auto model = parseModel(residualChain(12));
  const RuleOptions options;
  const RuleContext context(*model, options);
  const auto before = freshAnswers(*model);
  for (const Value* value : nodeOutputs(model->graph())) context.knownShape(*value);
  Report report;
  Rewriter rewriter(*model, report);
  REQUIRE(removeBatchNorms(*model, rewriter) == 12);
  const auto changed = changedSums(*model, before);
  REQUIRE_FALSE(changed.empty());
  for (const Value* sum : changed) {
    CAPTURE(sum->name());
    CHECK(shapeText(context.knownShape(*sum)) == shapeText(sum));
  }
}

TEST_CASE("shapes through a decomposed LayerNorm, an attention's batched MatMul and the fused norm ops", "[shape]") {
  auto model = parseModel(R"(<ir_version: 8, opset_import: ["" : 17]>
g (float[2,4,8] x) => (float[2,4,8] y)
<float two = {2}, float[8] gamma = {1,1,1,1,1,1,1,1}>
{
  mean = ReduceMean <axes = [-1]> (x)
  flat = ReduceMean <axes = [1, 2], keepdims = 0> (x)
  whole = ReduceMean (x)
  d = Sub (x, mean)
  sq = Pow (d, two)
  kt = Transpose <perm = [0, 2, 1]> (x)
  scores = MatMul (x, kt)
  mixed = MatMul (scores, x)
  ln = LayerNormalization <axis = -1> (mixed, gamma)
  y = Add (ln, sq)
}
)");
  const Graph& graph = model->graph();
  CHECK(shapeText(graph.findLocal("mean")) == "[2,4,1]");
  CHECK(shapeText(graph.findLocal("flat")) == "[2]");
  CHECK(shapeText(graph.findLocal("whole")) == "[1,1,1]");
  CHECK(shapeText(graph.findLocal("sq")) == "[2,4,8]");
  CHECK(shapeText(graph.findLocal("scores")) == "[2,4,4]");
  CHECK(shapeText(graph.findLocal("mixed")) == "[2,4,8]");
  CHECK(shapeText(graph.findLocal("ln")) == "[2,4,8]");
}

TEST_CASE("a Reshape's target shape is read from any integer constant, never from floats", "[shape]") {
  // As RuleContext::integersOf (the rules' layout path) reads it, so rules and shapes agree on the same operand.
  auto reshaped = [](const std::string& shapeConstant) {
    auto model = parseModel("<ir_version: 8, opset_import: [\"\" : 15]>\ng (float[2,3,4] x) => (float[6,4] y)\n<" +
                            shapeConstant + ">\n{\n  r = Reshape (x, shape)\n  y = Identity (r)\n}\n");
    return shapeText(model->graph().findLocal("r"));
  };
  CHECK(reshaped("int64[2] shape = {6, -1}") == "[6,4]");
  CHECK(reshaped("int32[2] shape = {6, -1}") == "[6,4]");
  CHECK(reshaped("int8[2] shape = {-1, 4}") == "[6,4]");
  CHECK(reshaped("float[2] shape = {6, -1}") == "unknown");
  CHECK(reshaped("double[2] shape = {6, -1}") == "unknown");
}

TEST_CASE("a Reshape whose target stands alone is known without its input, and a query stops there", "[shape]") {
  // After 40 residual blocks the chain's end is beyond the depth bound (its shape unknown), yet a Reshape to
  // explicit dims has those dims. A -1 or a copying 0 needs the input, and is unknown there; allowzero's 0 is a dim.
  std::string text = residualChain(40);
  const std::string tail = "  out = Identity (y40)\n}\n";
  REQUIRE(text.find(tail) != std::string::npos);
  text.replace(text.find(tail), tail.size(),
               "  explicitDims = Reshape (y40, explicitTarget)\n  inferred = Reshape (y40, inferredTarget)\n"
               "  copied = Reshape (y40, copiedTarget)\n  zero = Reshape <allowzero = 1> (y40, zeroTarget)\n"
               "  out = Identity (y40)\n}\n");
  const std::string targets = "<int64[2] explicitTarget = {2, 16}, int64[2] inferredTarget = {2, -1}, "
                              "int64[2] copiedTarget = {0, 32}, int64[3] zeroTarget = {0, 4, 8}, ";
  text.replace(text.find('<', text.find('\n') + 1), 1, targets);
  auto model = parseModel(text);
  CHECK(shapeText(model->graph().findLocal("y40")) == "unknown");
  CHECK(shapeText(model->graph().findLocal("explicitDims")) == "[2,16]");
  CHECK(shapeText(model->graph().findLocal("inferred")) == "[2,-1]");
  CHECK(shapeText(model->graph().findLocal("copied")) == "[-1,32]");
  CHECK(shapeText(model->graph().findLocal("zero")) == "[0,4,8]");

  // Nor does a contradiction before it matter: whatever the model's declarations say of the input, a Reshape to
  // explicit dims has those dims (a -1 still needs the input, and goes unknown with it).
  auto contradicted = parseModel(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,4,4] x) => (float[1,32] out, float[1,32] inferred)
<int64[2] explicitTarget = {1, 32}, int64[2] inferredTarget = {1, -1}, float[1,3,4,4] wrongDim>
{
  wrongDim = Relu (x)
  out = Reshape (wrongDim, explicitTarget)
  inferred = Reshape (wrongDim, inferredTarget)
}
)ONNX");
  CHECK(shapeText(contradicted->graph().findLocal("wrongDim")) == "unknown");
  CHECK(shapeText(contradicted->graph().findLocal("out")) == "[1,32]");
  CHECK(shapeText(contradicted->graph().findLocal("inferred")) == "unknown");
}

TEST_CASE("remembered shapes: a new target for a Reshape that reads no input is seen after the change", "[shape]") {
  // The Reshape's facts come from its target alone; setting another target must still reach what was inferred
  // from them (b, out), as a fresh query would answer.
  auto model = parseModel(R"ONNX(
<ir_version: 8, opset_import: ["" : 15]>
g (float[1,2,4,4] x) => (float[] out)
<int64[2] target = {1, 32}, int64[2] other = {4, 8}, int64[2] inferred = {-1, 16}>
{
  a = Relu (x)
  r = Reshape (a, target)
  b = Relu (r)
  out = Identity (b)
}
)ONNX");
  const RuleOptions options;
  const RuleContext context(*model, options);
  Report report;
  Rewriter rewriter(*model, report);
  context.followChanges(rewriter);
  const Node* reshape = model->graph().findLocal("r")->producer();
  const Value* out = model->graph().findLocal("out");
  CHECK(shapeText(context.knownShape(*out)) == "[1,32]");
  rewriter.setInput(reshape, 1, model->graph().findLocal("other"));
  CHECK(shapeText(context.knownShape(*out)) == "[4,8]");
  rewriter.setInput(reshape, 1, model->graph().findLocal("inferred"));  // now the input is read: 32 / 16
  CHECK(shapeText(context.knownShape(*out)) == "[2,16]");
  CHECK(shapeText(out) == "[2,16]");
  context.stopFollowing(rewriter);
}
