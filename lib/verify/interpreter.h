#pragma once
// Evaluates a Region (region.h) with the reference kernels: each node's ONNX semantics at the region's opset,
// floating values in T (float for float, float16 and bfloat16 models; double for double models), integers in
// int64. Its kernels are written apart from constant evaluation (lib/rewrite/constant_eval) and the rules on purpose:
// the verifier must not share numeric code with what it checks. The layout ops' shape arithmetic is the one of
// lib/analysis/shape_ops, which every part of bnfold uses.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bnfold/ir/tensor.h"
#include "reference_kernels.h"
#include "region.h"

namespace bnfold::verify {

/// A value during evaluation: floating (`real`) or integer (`integer`), with its ONNX element type.
template <typename T>
struct Operand {
  DataType type = DataType::Float;
  Array<T> real;
  Array<int64_t> integer;
  bool isInteger() const { return !isFloatingPoint(type); }
  const Dims& dims() const { return isInteger() ? integer.dims : real.dims; }
};

/// Buffers kept from one evaluation to the next: weights are read into them, so that a run over many rewrites does
/// not pay for fresh pages (and their zero-filling) for every weight it reads.
/// Buffers smaller than this are not worth keeping: allocating them costs less than a page fault.
inline constexpr std::size_t kPooledElements = std::size_t{1} << 14;

template <typename T>
class BufferPool {
 public:
  /// A buffer of `size` elements; their values are unspecified.
  std::vector<T> take(std::size_t size);
  /// Returns a buffer (and its memory) to the pool.
  void give(std::vector<T>&& buffer);

 private:
  std::vector<std::vector<T>> free_;
};

/// A value drawn rather than computed: once its producer has run, element e of channel ch (on `channelAxis`) becomes
/// lowerBound[ch] + u_e with u_e uniform in [0, width) from `seed`, so two regions drawing a value of the same shape draw
/// the same u (a rewrite exact only where the value stays above a bound is compared there).
struct SampledValue {
  std::string name;
  int64_t channelAxis = 1;
  std::vector<double> lowerBound;
  uint64_t seed = 0;
  double width = 2.0;
};

struct InterpreterOptions {
  /// Evaluate training-mode BatchNormalization as inference mode (the meaning of a frozen BN, for train-bn-freeze).
  bool batchNormAsInference = false;
  std::vector<SampledValue> sampled;
};

/// An op the interpreter does not know, or operands that do not fit: the region cannot be evaluated as given.
class EvaluationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Reads a constant operand into an Operand (floating types converted to T), into a buffer from `pool` if given.
template <typename T>
Operand<T> readConstant(const ConstantOperand& constant, BufferPool<T>* pool = nullptr);

/// Evaluates the region on `inputs` (its run-time inputs by name) and returns every value it computed or read,
/// by name. Throws EvaluationError.
template <typename T>
std::map<std::string, Operand<T>> evaluateRegion(const Region& region, std::map<std::string, Operand<T>> values,
                                                 const InterpreterOptions& options, BufferPool<T>* pool = nullptr);

/// The value `v` takes when stored as `type` (what a Cast to it does): float, float16 and bfloat16 round.
double roundedTo(DataType type, double v);

/// True when the interpreter evaluates this standard-domain op.
bool isEvaluableOp(const std::string& opType);

}  // namespace bnfold::verify
