#include <catch2/catch.hpp>

#include <string>

#include "analysis/value_shape.h"
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
std::string shapeText(const Value* value) {
  const auto shape = analysis::knownShape(*value);
  if (!shape) return "unknown";
  std::string text;
  for (int64_t dim : *shape) text += (text.empty() ? "" : ",") + std::to_string(dim);
  return "[" + text + "]";
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
