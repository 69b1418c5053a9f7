// High-bias absorption math against hand-computed values: c per channel, and what a shifted input adds to each
// output channel of a Conv (grouped too), a Gemm (both transB) and a MatMul.

#include <catch2/catch.hpp>

#include <stdexcept>

#include "kernels/high_bias_math.h"

using namespace bnfold::kernels;

TEST_CASE("high-bias math: c = max(0, beta - 3|gamma|) per channel", "[kernels][hba]") {
  CHECK(absorbableBias({1.0, -1.0, 0.5, 0.0}, {5.0, 5.0, 1.0, -2.0}) == std::vector<double>{2.0, 2.0, 0.0, 0.0});
  CHECK_THROWS_AS(absorbableBias({1.0}, {1.0, 2.0}), std::invalid_argument);
}

TEST_CASE("high-bias math: a Conv adds the sum of each input channel's kernel times its shift", "[kernels][hba]") {
  WeightLayout conv;
  // W [2, 2, 1, 2]: output 0 reads input 0 with {1, 2} and input 1 with {3, 4}; output 1 with {5, 6}, {7, 8}.
  const std::vector<double> w = {1, 2, 3, 4, 5, 6, 7, 8};
  CHECK(outputShiftOfInputShift(conv, w, {2, 2, 1, 2}, {1.0, 10.0}) ==
        std::vector<double>{(1 + 2) + 10 * (3 + 4), (5 + 6) + 10 * (7 + 8)});
  // group 2: W [2, 1, 1, 2]: output 0 reads only input 0, output 1 only input 1.
  conv.group = 2;
  CHECK(outputShiftOfInputShift(conv, {1, 2, 3, 4}, {2, 1, 1, 2}, {1.0, 10.0}) == std::vector<double>{3.0, 70.0});
}

TEST_CASE("high-bias math: Gemm and MatMul add W^T c", "[kernels][hba]") {
  WeightLayout gemm;
  gemm.kind = WeightKind::Gemm;
  // B [K=2, N=3]: out[n] = sum_k B[k][n] c[k].
  const std::vector<double> b = {1, 2, 3, 4, 5, 6};
  CHECK(outputShiftOfInputShift(gemm, b, {2, 3}, {1.0, 2.0}) == std::vector<double>{9.0, 12.0, 15.0});
  WeightLayout matmul;
  matmul.kind = WeightKind::MatMul;
  CHECK(outputShiftOfInputShift(matmul, b, {2, 3}, {1.0, 2.0}) == std::vector<double>{9.0, 12.0, 15.0});
  gemm.transB = true;  // B [N=2, K=3]
  CHECK(outputShiftOfInputShift(gemm, b, {2, 3}, {1.0, 0.0, 1.0}) == std::vector<double>{4.0, 10.0});
}

TEST_CASE("high-bias math: ConvTranspose and misfit shifts are refused", "[kernels][hba]") {
  WeightLayout transpose;
  transpose.kind = WeightKind::ConvTranspose;
  CHECK_THROWS_AS(outputShiftOfInputShift(transpose, {1, 2}, {1, 1, 1, 2}, {1.0}), std::invalid_argument);
  WeightLayout conv;
  CHECK_THROWS_AS(outputShiftOfInputShift(conv, {1, 2, 3, 4}, {2, 2, 1, 1}, {1.0}), std::invalid_argument);
}
