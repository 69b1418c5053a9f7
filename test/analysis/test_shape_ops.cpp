// The layout ops' shape rules (lib/analysis/shape_ops), as the ONNX operator specification states them, and the
// shapes value_shape infers through them from models in ONNX text, at opsets with either operand form.

#include <catch2/catch.hpp>

#include <string>

#include "analysis/shape_ops.h"
#include "analysis/value_shape.h"
#include "test_support.h"

using namespace bnfold;
using namespace bnfold::analysis;
using bnfold::test::parseModel;
using Dims = std::vector<int64_t>;

namespace {
constexpr int64_t U = kUnknownDim;

// "[1,2,4,4]" (-1 for an unknown dim), or "unknown" when not even the rank is known.
std::string shapeOf(Model& model, const std::string& name) {
  const Value* value = model.graph().findLocal(name);
  REQUIRE(value);
  const auto shape = knownShape(*value);
  return shape ? dimsText(*shape) : "unknown";
}
}  // namespace

TEST_CASE("Reshape: 0 copies the input dim, -1 takes the rest, allowzero keeps a 0", "[shape][analysis]") {
  CHECK(reshapeShape({2, 3, 4}, {0, -1}, false).dims == Dims{2, 12});
  CHECK(reshapeShape({2, 3, 4}, {-1, 0, 2}, false).dims == Dims{4, 3, 2});
  CHECK(reshapeShape({2, 3, 4}, {4, 6}, false).dims == Dims{4, 6});
  // allowzero: a 0 is a dim of size 0, so the input must hold no elements.
  CHECK(reshapeShape({0, 3}, {3, 0}, true).dims == Dims{3, 0});
  CHECK(reshapeShape({2, 3}, {3, 0}, true).problem == ShapeProblem::kCountMismatch);
  // Without allowzero the 0 copies the input's 3: 9 elements against none.
  CHECK(reshapeShape({0, 3}, {3, 0}, false).problem == ShapeProblem::kCountMismatch);
}

TEST_CASE("Reshape: invalid targets are problems with the constant evaluator's words", "[shape][analysis]") {
  CHECK(reshapeShape({2, 3}, {-1, -1}, false).problem == ShapeProblem::kTwoInferredDims);
  CHECK(reshapeShape({2, 3}, {-1, -1}, false).message == "has two -1 dims");
  CHECK(reshapeShape({2, 3}, {-2, 3}, false).problem == ShapeProblem::kNegativeDim);
  CHECK(reshapeShape({2, 3}, {0, 0, 0}, false).problem == ShapeProblem::kZeroCopiesMissingDim);
  CHECK(reshapeShape({2, 3}, {0, 0, 0}, false).problemAxis == 2);
  CHECK(reshapeShape({2, 3}, {4, -1}, false).problem == ShapeProblem::kCannotInferDim);
  CHECK(reshapeShape({2, 3}, {0, -1}, false).ok());
  const OutputShape mismatch = reshapeShape({2, 3}, {5}, false);
  CHECK(mismatch.problem == ShapeProblem::kCountMismatch);
  CHECK(mismatch.message == "reshapes [2,3] to [5], a different size");
  CHECK(reshapeShape({2, 3}, {INT64_MAX, 2}, false).problem == ShapeProblem::kCountOverflow);
}

TEST_CASE("Reshape: unknown input dims leave the dims that depend on them unknown", "[shape][analysis]") {
  // A symbolic batch a 0 copies is on both sides: the -1 is still the rest.
  CHECK(reshapeShape({U, 3, 4}, {0, -1}, false).dims == Dims{U, 12});
  CHECK(reshapeShape({U, 3, 4}, {0, 5}, false).problem == ShapeProblem::kCountMismatch);
  CHECK(reshapeShape({U, 3, 4}, {-1, 4}, false).dims == Dims{U, 4});
  CHECK(reshapeShape({U, 3, 4}, {6, 4}, false).ok());  // the count cannot be checked
  CHECK(reshapeShape({2, U, 4}, {0, 0, -1}, false).dims == Dims{2, U, 4});
}

TEST_CASE("Transpose: perm moves dims, no perm reverses them", "[shape][analysis]") {
  const OutputShape moved = transposeShape({1, 2, 3, 4}, {0, 2, 3, 1});
  CHECK(moved.dims == Dims{1, 3, 4, 2});
  CHECK(moved.sourceAxis == Dims{0, 2, 3, 1});
  CHECK(transposeShape({1, 2, 3}, {}).dims == Dims{3, 2, 1});
  CHECK(transposeShape({1, 2, 3}, {0, 1}).problem == ShapeProblem::kPermRankMismatch);
  CHECK(transposeShape({1, 2, 3}, {0, 1, 1}).problem == ShapeProblem::kInvalidPerm);
  CHECK(transposeShape({1, 2, 3}, {0, 1, 3}).problem == ShapeProblem::kInvalidPerm);
  CHECK(transposeShape({1, 2, 3}, {0, 1, -1}).problem == ShapeProblem::kInvalidPerm);
}

TEST_CASE("Squeeze: negative axes count from the end, and no axes removes every 1", "[shape][analysis]") {
  const OutputShape squeezed = squeezeShape({1, 3, 1, 5}, {-2});
  CHECK(squeezed.dims == Dims{1, 3, 5});
  CHECK(squeezed.sourceAxis == Dims{0, 1, 3});
  CHECK(squeezeShape({1, 3, 1, 5}, {}).dims == Dims{3, 5});
  CHECK(squeezeShape({1, 3, 1, 5}, {1}).problem == ShapeProblem::kSqueezesNonUnitDim);
  CHECK(squeezeShape({1, 3, 1, 5}, {1}).problemAxis == 1);
  CHECK(squeezeShape({1, 3}, {2}).problem == ShapeProblem::kInvalidAxis);
  CHECK(squeezeShape({1, 3}, {-3}).problem == ShapeProblem::kInvalidAxis);
  // An unknown dim may be squeezed (a valid model has 1 there), but "every 1" needs every dim.
  CHECK(squeezeShape({U, 3}, {0}).dims == Dims{3});
  CHECK(squeezeShape({U, 3}, {}).problem == ShapeProblem::kUnknownInputDims);
}

TEST_CASE("Unsqueeze: axes are positions in the output, negative from its end", "[shape][analysis]") {
  const OutputShape unsqueezed = unsqueezeShape({3, 4}, {0, -1});
  CHECK(unsqueezed.dims == Dims{1, 3, 4, 1});
  CHECK(unsqueezed.sourceAxis == Dims{-1, 0, 1, -1});
  CHECK(unsqueezeShape({3, 4}, {1}).dims == Dims{3, 1, 4});
  CHECK(unsqueezeShape({3, 4}, {}).dims == Dims{3, 4});
  CHECK(unsqueezeShape({3, 4}, {1, 1}).problem == ShapeProblem::kInvalidAxis);
  CHECK(unsqueezeShape({3, 4}, {3}).problem == ShapeProblem::kInvalidAxis);
  CHECK(unsqueezeShape({3, 4}, {-4}).problem == ShapeProblem::kInvalidAxis);
}

TEST_CASE("Flatten: the dims before axis and the rest, each multiplied out", "[shape][analysis]") {
  CHECK(flattenShape({2, 3, 4}, 1).dims == Dims{2, 12});
  CHECK(flattenShape({2, 3, 4}, 0).dims == Dims{1, 24});
  CHECK(flattenShape({2, 3, 4}, 3).dims == Dims{24, 1});
  CHECK(flattenShape({2, 3, 4}, -1).dims == Dims{6, 4});
  CHECK(flattenShape({2, 3, 4}, 4).problem == ShapeProblem::kInvalidAxis);
  CHECK(flattenShape({2, 3, 4}, -4).problem == ShapeProblem::kInvalidAxis);
  CHECK(flattenShape({U, 3, 4}, 1).dims == Dims{U, 12});
}

TEST_CASE("knownShape follows Squeeze and Unsqueeze in their attribute form (opset 11)", "[shape][analysis]") {
  auto model = parseModel(R"ONNX(
<ir_version: 7, opset_import: ["" : 11]>
g (float[2,3] x) => (float[2,3] out)
{
  u = Unsqueeze <axes = [0, -1]> (x)
  s = Squeeze <axes = [-1]> (u)
  a = Squeeze (u)
  out = Identity (a)
}
)ONNX");
  CHECK(shapeOf(*model, "u") == "[1,2,3,1]");
  CHECK(shapeOf(*model, "s") == "[1,2,3]");
  CHECK(shapeOf(*model, "a") == "[2,3]");
}

TEST_CASE("knownShape follows Squeeze and Unsqueeze in their input form (opset 13)", "[shape][analysis]") {
  auto model = parseModel(R"ONNX(
<ir_version: 8, opset_import: ["" : 13]>
g (float[2,3] x) => (float[2,3] out)
<int64[2] ua = {0, -1}, int64[1] sa = {-1}>
{
  u = Unsqueeze (x, ua)
  s = Squeeze (u, sa)
  ignored = Unsqueeze <axes = [0]> (x, sa)
  a = Squeeze (u)
  out = Identity (a)
}
)ONNX");
  CHECK(shapeOf(*model, "u") == "[1,2,3,1]");
  CHECK(shapeOf(*model, "s") == "[1,2,3]");
  CHECK(shapeOf(*model, "ignored") == "[2,3,1]");  // from 13 the axes are the input's; an attribute is not read
  CHECK(shapeOf(*model, "a") == "[2,3]");
}

TEST_CASE("knownShape follows Reshape, Transpose and Flatten", "[shape][analysis]") {
  auto model = parseModel(R"ONNX(
<ir_version: 8, opset_import: ["" : 14]>
g (float[N,3,4,5] x, int64[2] runtime) => (float[N,60] out)
<int64[2] keep = {0, -1}, int64[3] fixed = {-1, 4, 5}, int64[2] zero = {0, 4}>
{
  r = Reshape (x, keep)
  f = Reshape (x, fixed)
  z = Reshape <allowzero = 1> (x, zero)
  d = Reshape (x, runtime)
  t = Transpose <perm = [0, 2, 3, 1]> (x)
  rev = Transpose (x)
  l = Flatten <axis = -2> (t)
  out = Identity (r)
}
)ONNX");
  CHECK(shapeOf(*model, "r") == "[-1,60]");  // the batch dim is symbolic; 60 = 3*4*5
  CHECK(shapeOf(*model, "f") == "[-1,4,5]");  // -1 takes the unknown batch
  CHECK(shapeOf(*model, "z") == "[0,4]");  // (valid for an empty batch only)
  CHECK(shapeOf(*model, "d") == "unknown");  // the target is a run-time input
  CHECK(shapeOf(*model, "t") == "[-1,4,5,3]");
  CHECK(shapeOf(*model, "rev") == "[5,4,3,-1]");
  CHECK(shapeOf(*model, "l") == "[-1,15]");
}

TEST_CASE("knownShape reads Reshape's shape attribute before opset 5", "[shape][analysis]") {
  auto model = parseModel(R"ONNX(
<ir_version: 3, opset_import: ["" : 4]>
g (float[2,3,4] x) => (float[2,12] out)
{
  out = Reshape <shape = [0, -1]> (x)
}
)ONNX");
  CHECK(shapeOf(*model, "out") == "[2,12]");
}

TEST_CASE("knownShape: propagated shapes win, and contradicting declarations make a shape unknown", "[shape][analysis]") {
  auto model = parseModel(R"ONNX(
<ir_version: 8, opset_import: ["" : 13]>
g (float[1,2,H,W] x, float[1,1,5] y) => (float[1,2,4,4] out, float[1,4] ymm)
<float[5,4] w = {1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20},
 float[1,2,4,4] filled, float[1,3,4,4] wrongDim, float[2,4,4] wrongRank, float[1,2,4,4] afterWrong>
{
  filled = Relu (x)
  wrongDim = Relu (x)
  wrongRank = Relu (x)
  afterWrong = Relu (wrongDim)
  out = Add (filled, afterWrong)
  ymm = MatMul (y, w)
}
)ONNX");
  CHECK(shapeOf(*model, "filled") == "[1,2,4,4]");  // the declaration fills the dims the input leaves unknown
  CHECK(shapeOf(*model, "wrongDim") == "unknown");
  CHECK(shapeOf(*model, "wrongRank") == "unknown");
  CHECK(shapeOf(*model, "afterWrong") == "unknown");  // declared consistently, but computed from a contradiction
  CHECK(shapeOf(*model, "ymm") == "unknown");          // [1,1,4] propagated, [1,4] declared
}

TEST_CASE("knownShape does not read a Reshape target a caller may override", "[shape][analysis]") {
  auto model = parseModel(R"ONNX(
<ir_version: 8, opset_import: ["" : 13]>
g (float[2,3,4] x, int64[2] target) => (float[2,12] out)
<int64[2] target = {0, -1}>
{
  out = Reshape (x, target)
}
)ONNX");
  // An IR 4+ initializer that is also a graph input is a default, not a constant; the declared output remains.
  CHECK(shapeOf(*model, "out") == "[2,12]");
  auto noDeclaration = parseModel(R"ONNX(
<ir_version: 8, opset_import: ["" : 13]>
g (float[2,3,4] x, int64[2] target) => (float[2,12] out)
<int64[2] target = {0, -1}>
{
  r = Reshape (x, target)
  out = Identity (r)
}
)ONNX");
  CHECK(shapeOf(*noDeclaration, "r") == "unknown");
}
