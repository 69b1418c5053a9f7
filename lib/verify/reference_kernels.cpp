#include "verify/reference_kernels.h"

#include "bnfold/dims_text.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <type_traits>

#include <Eigen/Core>

namespace bnfold::verify {
namespace {

// Outputs larger than this are refused rather than attempted: a malformed model could ask for terabytes, and
// verification only ever runs small subgraphs.
constexpr int64_t kMaxElements = int64_t{1} << 27;

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument(what); }

int64_t mulChecked(int64_t a, int64_t b, const char* what) {
  int64_t result = 0;
  if (__builtin_mul_overflow(a, b, &result)) fail(std::string(what) + ": size overflows int64");
  return result;
}

int64_t addChecked(int64_t a, int64_t b, const char* what) {
  int64_t result = 0;
  if (__builtin_add_overflow(a, b, &result)) fail(std::string(what) + ": size overflows int64");
  return result;
}

template <typename T>
void checkArray(const Array<T>& a, const char* what) {
  if (elementCount(a.dims) != static_cast<int64_t>(a.data.size())) {
    fail(std::string(what) + ": dims " + formatDims(a.dims) + " do not match " + std::to_string(a.data.size()) +
         " elements");
  }
}

/// A zero-filled array of these dims, refusing absurd sizes.
template <typename T>
Array<T> makeArray(Dims dims) {
  const int64_t count = elementCount(dims);
  if (count > kMaxElements) fail("output of dims " + formatDims(dims) + " is too large");
  Array<T> out;
  out.dims = std::move(dims);
  out.data.assign(static_cast<size_t>(count), T(0));
  return out;
}

Dims rowMajorStrides(const Dims& dims) {
  Dims strides(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  return strides;
}

/// Strides of `dims` (right-aligned) for walking an output of `outDims`: 0 where dims broadcasts.
Dims broadcastStrides(const Dims& dims, const Dims& outDims) {
  const Dims own = rowMajorStrides(dims);
  Dims strides(outDims.size(), 0);
  const size_t shift = outDims.size() - dims.size();
  for (size_t i = 0; i < dims.size(); ++i) strides[shift + i] = dims[i] == 1 ? 0 : own[i];
  return strides;
}

int64_t normalizeAxis(int64_t axis, int64_t rank, const char* what) {
  if (axis < -rank || axis >= rank) {
    fail(std::string(what) + ": axis " + std::to_string(axis) + " out of range for rank " + std::to_string(rank));
  }
  return axis < 0 ? axis + rank : axis;
}

/// Calls f(outIndex, offsetA, offsetB) for every element of outDims in row-major order, where offsetA/B start at
/// baseA/B and advance by stridesA/B (which may be 0 for broadcast axes or negative for reversed slices).
template <typename F>
void forEachIndex(const Dims& outDims, const Dims& stridesA, const Dims& stridesB, int64_t baseA, int64_t baseB,
                  F&& f) {
  const int64_t total = elementCount(outDims);
  if (total == 0) return;
  const size_t rank = outDims.size();
  if (rank == 0) {
    f(int64_t{0}, baseA, baseB);
    return;
  }
  std::vector<int64_t> index(rank, 0);
  const int64_t inner = outDims[rank - 1], innerA = stridesA[rank - 1], innerB = stridesB[rank - 1];
  int64_t offA = baseA, offB = baseB;
  for (int64_t out = 0; out < total; out += inner) {
    for (int64_t i = 0; i < inner; ++i) f(out + i, offA + i * innerA, offB + i * innerB);
    for (size_t d = rank - 1; d-- > 0;) {
      offA += stridesA[d];
      offB += stridesB[d];
      if (++index[d] < outDims[d]) break;
      offA -= stridesA[d] * outDims[d];
      offB -= stridesB[d] * outDims[d];
      index[d] = 0;
    }
  }
}

template <typename T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using ConstMap = Eigen::Map<const RowMatrix<T>>;
template <typename T>
using MutableMap = Eigen::Map<RowMatrix<T>>;

// ---------------------------------------------------------------------------------------------------------------
// Conv / ConvTranspose shared attribute checks

struct SpatialAttributes {
  Dims kernel, strides, dilations, padBegin, padEnd;
};

SpatialAttributes spatialAttributes(const ConvAttributes& a, const Dims& wDims, const char* op) {
  const size_t n = wDims.size() - 2;
  const std::string name(op);
  SpatialAttributes s;
  s.kernel.assign(wDims.begin() + 2, wDims.end());
  for (int64_t k : s.kernel)
    if (k < 1) fail(name + ": kernel dims must be >= 1, W is " + formatDims(wDims));
  if (!a.kernelShape.empty() && a.kernelShape != s.kernel) {
    fail(name + ": kernel_shape " + formatDims(a.kernelShape) + " does not match W " + formatDims(wDims));
  }
  auto perAxis = [&](const std::vector<int64_t>& values, const char* attr, int64_t fallback, int64_t minimum) {
    if (values.empty()) return Dims(n, fallback);
    if (values.size() != n) fail(name + ": " + attr + " needs " + std::to_string(n) + " values");
    for (int64_t v : values)
      if (v < minimum) fail(name + ": " + attr + " value " + std::to_string(v) + " is below " + std::to_string(minimum));
    return values;
  };
  s.strides = perAxis(a.strides, "strides", 1, 1);
  s.dilations = perAxis(a.dilations, "dilations", 1, 1);
  if (a.autoPad != "NOTSET" && a.autoPad != "SAME_UPPER" && a.autoPad != "SAME_LOWER" && a.autoPad != "VALID") {
    fail(name + ": unknown auto_pad '" + a.autoPad + "'");
  }
  s.padBegin.assign(n, 0);
  s.padEnd.assign(n, 0);
  if (!a.pads.empty()) {
    if (a.pads.size() != 2 * n) fail(name + ": pads needs " + std::to_string(2 * n) + " values");
    for (size_t i = 0; i < n; ++i) {
      s.padBegin[i] = a.pads[i];
      s.padEnd[i] = a.pads[n + i];
      if (s.padBegin[i] < 0 || s.padEnd[i] < 0) fail(name + ": negative pads");
      if (a.autoPad != "NOTSET" && (s.padBegin[i] != 0 || s.padEnd[i] != 0)) {
        fail(name + ": pads cannot be used together with auto_pad " + a.autoPad);
      }
    }
  }
  return s;
}

/// The output's spatial dims and the padding before each axis of windows sliding over x's spatial dims (Conv,
/// MaxPool).
void windowGeometry(const SpatialAttributes& s, const std::string& autoPad, const Dims& xDims, const char* op,
                    Dims& outSpatial, Dims& padBegin) {
  const size_t n = xDims.size() - 2;
  outSpatial.assign(n, 0);
  padBegin.assign(n, 0);
  for (size_t d = 0; d < n; ++d) {
    const int64_t in = xDims[d + 2], stride = s.strides[d];
    const int64_t reach = addChecked(mulChecked(s.kernel[d] - 1, s.dilations[d], op), 1, op);
    if (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER") {
      // The spec's total can come out negative when the stride exceeds the kernel's reach; ORT 1.30 clamps it to
      // 0 (checked by the ORT table: a head pad of -1 would shift every window by one).
      const int64_t target = addChecked(in, stride - 1, op) / stride;
      const int64_t total = std::max<int64_t>(0, addChecked(mulChecked(target - 1, stride, op), reach - in, op));
      padBegin[d] = autoPad == "SAME_LOWER" ? (total + 1) / 2 : total / 2;
      const int64_t padEnd = total - padBegin[d];
      outSpatial[d] = (in + padBegin[d] + padEnd - reach) / stride + 1;
    } else {
      padBegin[d] = s.padBegin[d];
      const int64_t padded = addChecked(addChecked(in, s.padBegin[d], op), s.padEnd[d], op);
      if (padded < reach) fail(std::string(op) + ": kernel reach exceeds padded input " + formatDims(xDims));
      outSpatial[d] = (padded - reach) / stride + 1;
    }
    if (outSpatial[d] < 1) fail(std::string(op) + ": empty output for input " + formatDims(xDims));
  }
}

/// For each kernel offset k and output (Conv) or input (ConvTranspose) position p on one axis: the position on the
/// other side, p*stride - padBegin + k*dilation, or -1 when it falls outside [0, limit).
std::vector<int64_t> positionTable(int64_t kernel, int64_t positions, int64_t stride, int64_t dilation,
                                   int64_t padBegin, int64_t limit) {
  std::vector<int64_t> table(static_cast<size_t>(kernel * positions));
  for (int64_t k = 0; k < kernel; ++k) {
    for (int64_t p = 0; p < positions; ++p) {
      const int64_t at = p * stride - padBegin + k * dilation;
      table[static_cast<size_t>(k * positions + p)] = at >= 0 && at < limit ? at : -1;
    }
  }
  return table;
}

/// Walks the positions of `walked` (the dims one row of an im2col / col2im matrix runs over) for one kernel offset
/// and calls f(walkedIndex, otherIndex) for each one whose mapped position lies inside `other`. The tables come
/// from positionTable, one per axis.
template <typename F>
void forEachMappedPosition(const Dims& walked, const Dims& otherStrides, const std::vector<std::vector<int64_t>>& tables,
                           const std::vector<int64_t>& kernelIndex, std::vector<int64_t>& scratch, F&& f) {
  const size_t n = walked.size();
  const int64_t last = walked[n - 1];
  const int64_t* lastTable = tables[n - 1].data() + kernelIndex[n - 1] * last;
  const int64_t lastStride = otherStrides[n - 1];
  std::fill(scratch.begin(), scratch.end(), 0);
  int64_t walkedIndex = 0;
  const int64_t total = elementCount(walked);
  while (walkedIndex < total) {
    int64_t base = 0;
    bool inside = true;
    for (size_t d = 0; d + 1 < n; ++d) {
      const int64_t at = tables[d][static_cast<size_t>(kernelIndex[d] * walked[d] + scratch[d])];
      if (at < 0) {
        inside = false;
        break;
      }
      base += at * otherStrides[d];
    }
    if (inside) {
      for (int64_t p = 0; p < last; ++p) {
        const int64_t at = lastTable[p];
        if (at >= 0) f(walkedIndex + p, base + at * lastStride);
      }
    }
    walkedIndex += last;
    for (size_t d = n - 1; d-- > 0;) {
      if (++scratch[d] < walked[d]) break;
      scratch[d] = 0;
    }
  }
}

void nextKernelIndex(std::vector<int64_t>& index, const Dims& kernel) {
  for (size_t d = index.size(); d-- > 0;) {
    if (++index[d] < kernel[d]) return;
    index[d] = 0;
  }
}

template <typename T>
void checkBias(const Array<T>* bias, int64_t channels, const char* op) {
  if (!bias) return;
  checkArray(*bias, op);
  if (bias->dims != Dims{channels}) {
    fail(std::string(op) + ": bias " + formatDims(bias->dims) + " is not [" + std::to_string(channels) + "]");
  }
}

}  // namespace

int64_t elementCount(const Dims& dims) {
  int64_t count = 1;
  for (int64_t d : dims) {
    if (d < 0) fail("negative dim in " + formatDims(dims));
    count = mulChecked(count, d, "element count");
  }
  return count;
}

Dims broadcastDims(const Dims& a, const Dims& b) {
  const size_t rank = std::max(a.size(), b.size());
  Dims out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da < 0 || db < 0) fail("negative dim in broadcast of " + formatDims(a) + " and " + formatDims(b));
    if (da != db && da != 1 && db != 1) fail("cannot broadcast " + formatDims(a) + " with " + formatDims(b));
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Conv

template <typename T>
Array<T> conv(const Array<T>& x, const Array<T>& w, const Array<T>* bias, const ConvAttributes& a) {
  checkArray(x, "Conv X");
  checkArray(w, "Conv W");
  if (x.dims.size() < 3) fail("Conv: X must have rank >= 3, got " + formatDims(x.dims));
  if (w.dims.size() != x.dims.size()) fail("Conv: W " + formatDims(w.dims) + " and X " + formatDims(x.dims) + " differ in rank");
  const size_t n = x.dims.size() - 2;
  const int64_t batch = x.dims[0], channels = x.dims[1], outChannels = w.dims[0], group = a.group;
  if (group < 1) fail("Conv: group must be >= 1");
  if (channels % group != 0 || outChannels % group != 0) fail("Conv: channels not divisible by group");
  const int64_t inPerGroup = channels / group, outPerGroup = outChannels / group;
  if (w.dims[1] != inPerGroup) {
    fail("Conv: W " + formatDims(w.dims) + " does not fit X " + formatDims(x.dims) + " with group " + std::to_string(group));
  }
  checkBias(bias, outChannels, "Conv B");
  const SpatialAttributes s = spatialAttributes(a, w.dims, "Conv");

  Dims inSpatial(x.dims.begin() + 2, x.dims.end()), outSpatial, padBegin;
  windowGeometry(s, a.autoPad, x.dims, "Conv", outSpatial, padBegin);

  Dims outDims{batch, outChannels};
  outDims.insert(outDims.end(), outSpatial.begin(), outSpatial.end());
  Array<T> y = makeArray<T>(outDims);
  const int64_t inSize = elementCount(inSpatial), outSize = elementCount(outSpatial);
  const int64_t kernelSize = elementCount(s.kernel);
  const int64_t rows = mulChecked(inPerGroup, kernelSize, "Conv");
  if (batch == 0 || outChannels == 0) return y;

  // A 1x1 kernel with unit strides and no padding reads X as it is: no im2col copy (most of ResNet's convs).
  bool pointwise = true;
  for (size_t d = 0; d < n; ++d)
    pointwise = pointwise && s.kernel[d] == 1 && s.strides[d] == 1 && padBegin[d] == 0 && outSpatial[d] == inSpatial[d];

  std::vector<std::vector<int64_t>> tables(n);
  for (size_t d = 0; d < n; ++d)
    tables[d] = positionTable(s.kernel[d], outSpatial[d], s.strides[d], s.dilations[d], padBegin[d], inSpatial[d]);
  const Dims inStrides = rowMajorStrides(inSpatial);
  const int64_t columnCount = pointwise ? 0 : mulChecked(rows, outSize, "Conv");
  if (columnCount > kMaxElements) fail("Conv: im2col buffer too large");
  std::vector<T> columns(static_cast<size_t>(columnCount));
  std::vector<int64_t> kernelIndex(n), scratch(n);

  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t g = 0; g < group; ++g) {
      const T* xGroup = x.data.data() + (b * channels + g * inPerGroup) * inSize;
      const T* colData = xGroup;
      if (!pointwise) {
        std::fill(columns.begin(), columns.end(), T(0));
        for (int64_t c = 0; c < inPerGroup; ++c) {
          const T* xChannel = xGroup + c * inSize;
          std::fill(kernelIndex.begin(), kernelIndex.end(), 0);
          for (int64_t k = 0; k < kernelSize; ++k) {
            T* row = columns.data() + (c * kernelSize + k) * outSize;
            forEachMappedPosition(outSpatial, inStrides, tables, kernelIndex, scratch,
                                  [&](int64_t outIndex, int64_t inIndex) { row[outIndex] = xChannel[inIndex]; });
            nextKernelIndex(kernelIndex, s.kernel);
          }
        }
        colData = columns.data();
      }
      ConstMap<T> weights(w.data.data() + g * outPerGroup * rows, outPerGroup, rows);
      ConstMap<T> cols(colData, rows, outSize);
      MutableMap<T> out(y.data.data() + (b * outChannels + g * outPerGroup) * outSize, outPerGroup, outSize);
      out.noalias() = weights * cols;
    }
  }
  if (bias) {
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t m = 0; m < outChannels; ++m) {
        T* row = y.data.data() + (b * outChannels + m) * outSize;
        const T value = bias->data[static_cast<size_t>(m)];
        for (int64_t i = 0; i < outSize; ++i) row[i] += value;
      }
  }
  return y;
}

// ---------------------------------------------------------------------------------------------------------------
// ConvTranspose

TransposePads convTransposePads(int64_t inputSize, int64_t kernel, int64_t stride, int64_t dilation,
                                int64_t outputPadding, int64_t padBegin, int64_t padEnd, int64_t outputShapeDim,
                                const std::string& autoPad) {
  const char* what = "ConvTranspose";
  const int64_t reach = addChecked(mulChecked(kernel - 1, dilation, what), 1, what);
  const int64_t natural =
      addChecked(addChecked(mulChecked(inputSize - 1, stride, what), outputPadding, what), reach, what);
  // As ORT 1.30 computes it (checked by the ORT table test): an odd total pad puts the extra one at the end for
  // SAME_UPPER and at the beginning otherwise (NOTSET, SAME_LOWER, VALID). Older ORT releases split it the
  // other way round.
  auto split = [&](int64_t total, TransposePads& p) {
    if (autoPad == "SAME_UPPER") {
      p.begin = total / 2;
      p.end = total - total / 2;
    } else {
      p.begin = total - total / 2;
      p.end = total / 2;
    }
  };
  TransposePads p;
  if (outputShapeDim != -1) {
    if (outputShapeDim < 1) fail("ConvTranspose: output_shape entries must be >= 1");
    split(std::max<int64_t>(0, natural - outputShapeDim), p);
    p.outputSize = outputShapeDim;
    return p;
  }
  if (autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER") {
    split(std::max<int64_t>(0, natural - mulChecked(inputSize, stride, what)), p);
  } else if (autoPad == "NOTSET") {
    p.begin = padBegin;
    p.end = padEnd;
  }
  p.outputSize = natural - p.begin - p.end;
  if (p.outputSize < 1) fail("ConvTranspose: pads leave an empty output");
  return p;
}

template <typename T>
Array<T> convTranspose(const Array<T>& x, const Array<T>& w, const Array<T>* bias, const ConvAttributes& a) {
  checkArray(x, "ConvTranspose X");
  checkArray(w, "ConvTranspose W");
  if (x.dims.size() < 3) fail("ConvTranspose: X must have rank >= 3, got " + formatDims(x.dims));
  if (w.dims.size() != x.dims.size()) {
    fail("ConvTranspose: W " + formatDims(w.dims) + " and X " + formatDims(x.dims) + " differ in rank");
  }
  const size_t n = x.dims.size() - 2;
  const int64_t batch = x.dims[0], channels = x.dims[1], group = a.group;
  if (group < 1) fail("ConvTranspose: group must be >= 1");
  if (w.dims[0] != channels) fail("ConvTranspose: W " + formatDims(w.dims) + " does not fit X " + formatDims(x.dims));
  if (channels % group != 0) fail("ConvTranspose: channels not divisible by group");
  const int64_t inPerGroup = channels / group, outPerGroup = w.dims[1];
  const int64_t outChannels = mulChecked(outPerGroup, group, "ConvTranspose");
  checkBias(bias, outChannels, "ConvTranspose B");
  const SpatialAttributes s = spatialAttributes(a, w.dims, "ConvTranspose");
  if (!a.outputPadding.empty() && a.outputPadding.size() != n) fail("ConvTranspose: output_padding needs one value per axis");
  if (!a.outputShape.empty() && a.outputShape.size() != n && a.outputShape.size() != n + 2) {
    fail("ConvTranspose: output_shape needs " + std::to_string(n) + " or " + std::to_string(n + 2) + " values");
  }

  Dims inSpatial(x.dims.begin() + 2, x.dims.end()), outSpatial(n), padBegin(n);
  for (size_t d = 0; d < n; ++d) {
    const int64_t adjust = a.outputPadding.empty() ? 0 : a.outputPadding[d];
    if (adjust < 0) fail("ConvTranspose: negative output_padding");
    const int64_t shapeDim = a.outputShape.empty() ? -1 : a.outputShape[a.outputShape.size() == n ? d : d + 2];
    if (inSpatial[d] < 1) fail("ConvTranspose: empty spatial input " + formatDims(x.dims));
    const TransposePads p = convTransposePads(inSpatial[d], s.kernel[d], s.strides[d], s.dilations[d], adjust,
                                              s.padBegin[d], s.padEnd[d], shapeDim, a.autoPad);
    padBegin[d] = p.begin;
    outSpatial[d] = p.outputSize;
  }

  Dims outDims{batch, outChannels};
  outDims.insert(outDims.end(), outSpatial.begin(), outSpatial.end());
  Array<T> y = makeArray<T>(outDims);
  const int64_t inSize = elementCount(inSpatial), outSize = elementCount(outSpatial);
  const int64_t kernelSize = elementCount(s.kernel);
  const int64_t rows = mulChecked(outPerGroup, kernelSize, "ConvTranspose");
  if (batch == 0 || outChannels == 0) return y;

  std::vector<std::vector<int64_t>> tables(n);
  for (size_t d = 0; d < n; ++d)
    tables[d] = positionTable(s.kernel[d], inSpatial[d], s.strides[d], s.dilations[d], padBegin[d], outSpatial[d]);
  const Dims outStrides = rowMajorStrides(outSpatial);
  if (mulChecked(rows, inSize, "ConvTranspose") > kMaxElements) fail("ConvTranspose: col2im buffer too large");
  RowMatrix<T> columns(rows, inSize);
  std::vector<int64_t> kernelIndex(n), scratch(n);

  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t g = 0; g < group; ++g) {
      ConstMap<T> input(x.data.data() + (b * channels + g * inPerGroup) * inSize, inPerGroup, inSize);
      ConstMap<T> weights(w.data.data() + g * inPerGroup * rows, inPerGroup, rows);
      columns.noalias() = weights.transpose() * input;
      for (int64_t m = 0; m < outPerGroup; ++m) {
        T* yChannel = y.data.data() + (b * outChannels + g * outPerGroup + m) * outSize;
        std::fill(kernelIndex.begin(), kernelIndex.end(), 0);
        for (int64_t k = 0; k < kernelSize; ++k) {
          const T* row = columns.data() + (m * kernelSize + k) * inSize;
          forEachMappedPosition(inSpatial, outStrides, tables, kernelIndex, scratch,
                                [&](int64_t inIndex, int64_t outIndex) { yChannel[outIndex] += row[inIndex]; });
          nextKernelIndex(kernelIndex, s.kernel);
        }
      }
    }
  }
  if (bias) {
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t m = 0; m < outChannels; ++m) {
        T* row = y.data.data() + (b * outChannels + m) * outSize;
        const T value = bias->data[static_cast<size_t>(m)];
        for (int64_t i = 0; i < outSize; ++i) row[i] += value;
      }
  }
  return y;
}

// ---------------------------------------------------------------------------------------------------------------
// Gemm, MatMul

template <typename T>
Array<T> gemm(const Array<T>& a, const Array<T>& b, const Array<T>* c, double alpha, double beta, bool transA,
              bool transB) {
  checkArray(a, "Gemm A");
  checkArray(b, "Gemm B");
  if (a.dims.size() != 2 || b.dims.size() != 2) fail("Gemm: A and B must be 2-D");
  const int64_t m = transA ? a.dims[1] : a.dims[0], k = transA ? a.dims[0] : a.dims[1];
  const int64_t kB = transB ? b.dims[1] : b.dims[0], n = transB ? b.dims[0] : b.dims[1];
  if (k != kB) fail("Gemm: A " + formatDims(a.dims) + " and B " + formatDims(b.dims) + " do not multiply");
  Dims cDims;
  if (c) {
    checkArray(*c, "Gemm C");
    cDims = c->dims;
    if (cDims.size() > 2) fail("Gemm: C must have rank <= 2");
    while (cDims.size() < 2) cDims.insert(cDims.begin(), 1);
    if ((cDims[0] != 1 && cDims[0] != m) || (cDims[1] != 1 && cDims[1] != n)) {
      fail("Gemm: C " + formatDims(c->dims) + " does not broadcast to [" + std::to_string(m) + "," + std::to_string(n) + "]");
    }
  }
  Array<T> y = makeArray<T>({m, n});
  if (m == 0 || n == 0) return y;
  ConstMap<T> mapA(a.data.data(), a.dims[0], a.dims[1]);
  ConstMap<T> mapB(b.data.data(), b.dims[0], b.dims[1]);
  MutableMap<T> out(y.data.data(), m, n);
  if (!transA && !transB) out.noalias() = mapA * mapB;
  else if (transA && !transB) out.noalias() = mapA.transpose() * mapB;
  else if (!transA && transB) out.noalias() = mapA * mapB.transpose();
  else out.noalias() = mapA.transpose() * mapB.transpose();
  if (alpha != 1.0) out *= static_cast<T>(alpha);
  if (c && beta != 0.0) {
    const T betaT = static_cast<T>(beta);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j)
        out(i, j) += betaT * c->data[static_cast<size_t>((cDims[0] == 1 ? 0 : i) * cDims[1] + (cDims[1] == 1 ? 0 : j))];
  }
  return y;
}

template <typename T>
Array<T> matMul(const Array<T>& a, const Array<T>& b) {
  checkArray(a, "MatMul A");
  checkArray(b, "MatMul B");
  if (a.dims.empty() || b.dims.empty()) fail("MatMul: operands must have rank >= 1");
  Dims da = a.dims, db = b.dims;
  if (da.size() == 1) da.insert(da.begin(), 1);
  if (db.size() == 1) db.push_back(1);
  const int64_t m = da[da.size() - 2], k = da.back(), kB = db[db.size() - 2], n = db.back();
  if (k != kB) fail("MatMul: " + formatDims(a.dims) + " and " + formatDims(b.dims) + " do not multiply");
  const Dims batchA(da.begin(), da.end() - 2), batchB(db.begin(), db.end() - 2);
  const Dims batch = broadcastDims(batchA, batchB);
  Dims outDims = batch;
  if (a.dims.size() > 1) outDims.push_back(m);
  if (b.dims.size() > 1) outDims.push_back(n);
  Array<T> y = makeArray<T>(outDims);
  if (y.data.empty()) return y;
  const int64_t sizeA = m * k, sizeB = k * n, sizeY = m * n;
  const Dims stridesA = broadcastStrides(batchA, batch), stridesB = broadcastStrides(batchB, batch);
  forEachIndex(batch, stridesA, stridesB, 0, 0, [&](int64_t index, int64_t offA, int64_t offB) {
    ConstMap<T> mapA(a.data.data() + offA * sizeA, m, k);
    ConstMap<T> mapB(b.data.data() + offB * sizeB, k, n);
    MutableMap<T> out(y.data.data() + index * sizeY, m, n);
    out.noalias() = mapA * mapB;
  });
  return y;
}

// ---------------------------------------------------------------------------------------------------------------
// BatchNormalization

namespace {

template <typename T>
int64_t checkBatchNorm(const Array<T>& x, std::initializer_list<const Array<T>*> params, const char* op) {
  checkArray(x, op);
  if (x.dims.size() < 2) fail(std::string(op) + ": X must have rank >= 2, got " + formatDims(x.dims));
  const int64_t channels = x.dims[1];
  for (const Array<T>* p : params) {
    checkArray(*p, op);
    if (p->dims != Dims{channels}) {
      fail(std::string(op) + ": parameter " + formatDims(p->dims) + " is not [" + std::to_string(channels) + "]");
    }
  }
  return channels;
}

/// y = x * scale[c] + shift[c] on axis 1, computed in double.
template <typename T>
Array<T> channelAffine(const Array<T>& x, const std::vector<double>& scale, const std::vector<double>& shift) {
  Array<T> y = makeArray<T>(x.dims);
  const int64_t channels = x.dims[1];
  int64_t inner = 1;
  for (size_t d = 2; d < x.dims.size(); ++d) inner *= x.dims[d];
  const int64_t outer = x.dims[0] * channels;
  for (int64_t o = 0; o < outer; ++o) {
    const size_t c = static_cast<size_t>(o % channels);
    const T* in = x.data.data() + o * inner;
    T* out = y.data.data() + o * inner;
    for (int64_t i = 0; i < inner; ++i) out[i] = static_cast<T>(static_cast<double>(in[i]) * scale[c] + shift[c]);
  }
  return y;
}

}  // namespace

template <typename T>
Array<T> batchNormInference(const Array<T>& x, const Array<T>& scale, const Array<T>& bias, const Array<T>& mean,
                            const Array<T>& var, double epsilon) {
  const int64_t channels = checkBatchNorm(x, {&scale, &bias, &mean, &var}, "BatchNormalization");
  std::vector<double> k(static_cast<size_t>(channels)), shift(static_cast<size_t>(channels));
  for (size_t c = 0; c < k.size(); ++c) {
    k[c] = static_cast<double>(scale.data[c]) / std::sqrt(static_cast<double>(var.data[c]) + epsilon);
    shift[c] = static_cast<double>(bias.data[c]) - static_cast<double>(mean.data[c]) * k[c];
  }
  return channelAffine(x, k, shift);
}

template <typename T>
BatchNormTraining<T> batchNormTraining(const Array<T>& x, const Array<T>& scale, const Array<T>& bias,
                                       const Array<T>& inputMean, const Array<T>& inputVar, double epsilon,
                                       double momentum) {
  const int64_t channels = checkBatchNorm(x, {&scale, &bias, &inputMean, &inputVar}, "BatchNormalization");
  int64_t inner = 1;
  for (size_t d = 2; d < x.dims.size(); ++d) inner *= x.dims[d];
  const int64_t count = x.dims[0] * inner;
  if (count == 0) fail("BatchNormalization: training mode needs a non-empty batch");
  const size_t cs = static_cast<size_t>(channels);
  std::vector<double> mean(cs, 0.0), var(cs, 0.0);
  const int64_t outer = x.dims[0] * channels;
  for (int64_t o = 0; o < outer; ++o) {
    const T* in = x.data.data() + o * inner;
    double sum = 0.0;
    for (int64_t i = 0; i < inner; ++i) sum += static_cast<double>(in[i]);
    mean[static_cast<size_t>(o % channels)] += sum;
  }
  for (double& m : mean) m /= static_cast<double>(count);
  for (int64_t o = 0; o < outer; ++o) {
    const T* in = x.data.data() + o * inner;
    const double m = mean[static_cast<size_t>(o % channels)];
    double sum = 0.0;
    for (int64_t i = 0; i < inner; ++i) sum += (static_cast<double>(in[i]) - m) * (static_cast<double>(in[i]) - m);
    var[static_cast<size_t>(o % channels)] += sum;
  }
  for (double& v : var) v /= static_cast<double>(count);  // population variance, as ORT and the spec

  BatchNormTraining<T> r;
  std::vector<double> k(cs), shift(cs);
  r.runningMean = makeArray<T>({channels});
  r.runningVar = makeArray<T>({channels});
  r.savedMean = makeArray<T>({channels});
  r.savedInvStdDev = makeArray<T>({channels});
  for (size_t c = 0; c < cs; ++c) {
    const double invStd = 1.0 / std::sqrt(var[c] + epsilon);
    k[c] = static_cast<double>(scale.data[c]) * invStd;
    shift[c] = static_cast<double>(bias.data[c]) - mean[c] * k[c];
    r.runningMean.data[c] = static_cast<T>(static_cast<double>(inputMean.data[c]) * momentum + mean[c] * (1 - momentum));
    r.runningVar.data[c] = static_cast<T>(static_cast<double>(inputVar.data[c]) * momentum + var[c] * (1 - momentum));
    r.savedMean.data[c] = static_cast<T>(mean[c]);
    r.savedInvStdDev.data[c] = static_cast<T>(invStd);
  }
  r.y = channelAffine(x, k, shift);
  return r;
}

// ---------------------------------------------------------------------------------------------------------------
// Normalizations

namespace {

struct BlockStatistics {
  std::vector<double> mean, invStdDev;
};

/// Mean and 1 / sqrt(var + epsilon) of each of `blocks` consecutive runs of `blockSize` elements. Without
/// `subtractMean` the "variance" is the mean of squares (RMSNormalization) and the mean is reported as 0.
template <typename T>
BlockStatistics blockStatistics(const std::vector<T>& data, int64_t blocks, int64_t blockSize, double epsilon,
                                bool subtractMean, StashRounding stash, const char* op) {
  if (blockSize == 0 && blocks > 0) fail(std::string(op) + ": normalizes over no elements");
  const auto round = [&](double v) { return stash ? stash(v) : v; };
  BlockStatistics s;
  s.mean.resize(static_cast<size_t>(blocks));
  s.invStdDev.resize(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) {
    const T* in = data.data() + b * blockSize;
    double sum = 0.0;
    if (subtractMean)
      for (int64_t i = 0; i < blockSize; ++i) sum += static_cast<double>(in[i]);
    const double mean = round(sum / static_cast<double>(blockSize));
    double squares = 0.0;
    for (int64_t i = 0; i < blockSize; ++i) {
      const double d = static_cast<double>(in[i]) - mean;
      squares += d * d;
    }
    const double variance = round(squares / static_cast<double>(blockSize));
    s.mean[static_cast<size_t>(b)] = mean;
    s.invStdDev[static_cast<size_t>(b)] = round(1.0 / std::sqrt(variance + epsilon));
  }
  return s;
}

/// (x - mean[block]) * invStdDev[block] for every element.
template <typename T>
Array<T> normalizedBlocks(const Array<T>& x, const BlockStatistics& s, int64_t blockSize) {
  Array<T> y = makeArray<T>(x.dims);
  for (size_t e = 0; e < y.data.size(); ++e) {
    const auto b = static_cast<size_t>(static_cast<int64_t>(e) / blockSize);
    y.data[e] = static_cast<T>((static_cast<double>(x.data[e]) - s.mean[b]) * s.invStdDev[b]);
  }
  return y;
}

/// The element count before and from `axis` (the blocks and their size) of a trailing-axes normalization.
template <typename T>
std::pair<int64_t, int64_t> trailingBlocks(const Array<T>& x, int64_t& axis, const char* op) {
  checkArray(x, op);
  const auto rank = static_cast<int64_t>(x.dims.size());
  if (rank == 0) fail(std::string(op) + ": X must have rank >= 1");
  axis = normalizeAxis(axis, rank, op);
  int64_t blocks = 1, blockSize = 1;
  for (int64_t d = 0; d < rank; ++d) (d < axis ? blocks : blockSize) *= x.dims[static_cast<size_t>(d)];
  return {blocks, blockSize};
}

/// y * scale (+ bias) with numpy broadcasting that must keep y's dims.
template <typename T>
Array<T> affineKeepingDims(Array<T> y, const Array<T>& scale, const Array<T>* bias, const char* op) {
  const Dims dims = y.dims;
  checkArray(scale, op);
  y = binary(BinaryOp::Mul, y, scale);
  if (bias) {
    checkArray(*bias, op);
    y = binary(BinaryOp::Add, y, *bias);
  }
  if (y.dims != dims) fail(std::string(op) + ": scale or bias broadcasts X " + formatDims(dims) + " to " + formatDims(y.dims));
  return y;
}

}  // namespace

template <typename T>
LayerNormalizationResult<T> layerNormalization(const Array<T>& x, const Array<T>& scale, const Array<T>* bias,
                                               int64_t axis, double epsilon, StashRounding stash) {
  const auto [blocks, blockSize] = trailingBlocks(x, axis, "LayerNormalization");
  const BlockStatistics s = blockStatistics(x.data, blocks, blockSize, epsilon, true, stash, "LayerNormalization");
  LayerNormalizationResult<T> r;
  r.y = affineKeepingDims(normalizedBlocks(x, s, blockSize), scale, bias, "LayerNormalization");
  Dims statisticsDims = x.dims;
  for (size_t d = static_cast<size_t>(axis); d < statisticsDims.size(); ++d) statisticsDims[d] = 1;
  r.mean = makeArray<T>(statisticsDims);
  r.invStdDev = makeArray<T>(statisticsDims);
  for (size_t b = 0; b < s.mean.size(); ++b) {
    r.mean.data[b] = static_cast<T>(s.mean[b]);
    r.invStdDev.data[b] = static_cast<T>(s.invStdDev[b]);
  }
  return r;
}

template <typename T>
Array<T> rmsNormalization(const Array<T>& x, const Array<T>& scale, int64_t axis, double epsilon, StashRounding stash) {
  const auto [blocks, blockSize] = trailingBlocks(x, axis, "RMSNormalization");
  const BlockStatistics s = blockStatistics(x.data, blocks, blockSize, epsilon, false, stash, "RMSNormalization");
  return affineKeepingDims(normalizedBlocks(x, s, blockSize), scale, static_cast<const Array<T>*>(nullptr),
                           "RMSNormalization");
}

template <typename T>
Array<T> groupNormalization(const Array<T>& x, const Array<T>& scale, const Array<T>& bias, int64_t numGroups,
                            double epsilon, GroupAffine affine, StashRounding stash) {
  checkArray(x, "GroupNormalization");
  if (x.dims.size() < 2) fail("GroupNormalization: X must have rank >= 2, got " + formatDims(x.dims));
  const int64_t channels = x.dims[1];
  if (numGroups <= 0 || channels % numGroups != 0)
    fail("GroupNormalization: " + std::to_string(channels) + " channels do not split into " +
         std::to_string(numGroups) + " groups");
  const int64_t paramCount = affine == GroupAffine::PerGroup ? numGroups : channels;
  for (const Array<T>* p : {&scale, &bias}) {
    checkArray(*p, "GroupNormalization");
    if (p->dims != Dims{paramCount})
      fail("GroupNormalization: parameter " + formatDims(p->dims) + " is not [" + std::to_string(paramCount) + "]");
  }
  int64_t spatial = 1;
  for (size_t d = 2; d < x.dims.size(); ++d) spatial *= x.dims[d];
  const int64_t channelsPerGroup = channels / numGroups;
  const int64_t blockSize = channelsPerGroup * spatial;
  const BlockStatistics s =
      blockStatistics(x.data, x.dims[0] * numGroups, blockSize, epsilon, true, stash, "GroupNormalization");
  Array<T> y = normalizedBlocks(x, s, blockSize);
  for (size_t e = 0; e < y.data.size(); ++e) {
    const int64_t channel = (static_cast<int64_t>(e) / std::max<int64_t>(spatial, 1)) % channels;
    const auto p = static_cast<size_t>(affine == GroupAffine::PerGroup ? channel / channelsPerGroup : channel);
    y.data[e] = static_cast<T>(static_cast<double>(y.data[e]) * static_cast<double>(scale.data[p]) +
                               static_cast<double>(bias.data[p]));
  }
  return y;
}

template <typename T>
Array<T> instanceNormalization(const Array<T>& x, const Array<T>& scale, const Array<T>& bias, double epsilon) {
  const int64_t channels = checkBatchNorm(x, {&scale, &bias}, "InstanceNormalization");
  if (x.dims.size() < 3) fail("InstanceNormalization: X must have rank >= 3, got " + formatDims(x.dims));
  int64_t spatial = 1;
  for (size_t d = 2; d < x.dims.size(); ++d) spatial *= x.dims[d];
  const BlockStatistics s =
      blockStatistics(x.data, x.dims[0] * channels, spatial, epsilon, true, nullptr, "InstanceNormalization");
  Array<T> y = normalizedBlocks(x, s, spatial);
  for (size_t e = 0; e < y.data.size(); ++e) {
    const auto c = static_cast<size_t>((static_cast<int64_t>(e) / spatial) % channels);
    y.data[e] = static_cast<T>(static_cast<double>(y.data[e]) * static_cast<double>(scale.data[c]) +
                               static_cast<double>(bias.data[c]));
  }
  return y;
}

// ---------------------------------------------------------------------------------------------------------------
// Element-wise

namespace {

template <typename T>
T applyBinary(BinaryOp op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    // Wrap on overflow like ORT's two's-complement arithmetic instead of signed-overflow undefined behaviour.
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case BinaryOp::Add: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
      case BinaryOp::Sub: return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
      case BinaryOp::Mul: return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
      case BinaryOp::Div:
        if (b == 0) fail("Div: integer division by zero");
        if (a == std::numeric_limits<T>::min() && b == -1) fail("Div: integer division overflows");
        return a / b;
      case BinaryOp::Pow: {
        const double r = std::pow(static_cast<double>(a), static_cast<double>(b));
        if (!(r >= -9.2e18 && r <= 9.2e18)) fail("Pow: integer result out of range");
        return static_cast<T>(r);
      }
      case BinaryOp::Max: return std::max(a, b);
      case BinaryOp::Min: return std::min(a, b);
    }
  } else {
    switch (op) {
      case BinaryOp::Add: return a + b;
      case BinaryOp::Sub: return a - b;
      case BinaryOp::Mul: return a * b;
      case BinaryOp::Div: return a / b;
      case BinaryOp::Pow: return std::pow(a, b);
      case BinaryOp::Max: return std::isnan(a) || std::isnan(b) ? std::numeric_limits<T>::quiet_NaN() : std::max(a, b);
      case BinaryOp::Min: return std::isnan(a) || std::isnan(b) ? std::numeric_limits<T>::quiet_NaN() : std::min(a, b);
    }
  }
  fail("unknown binary op");
}

template <typename T>
T applyUnary(UnaryOp op, T x) {
  switch (op) {
    case UnaryOp::Identity: return x;
    case UnaryOp::Sqrt:
      if constexpr (std::is_integral_v<T>) {
        if (x < 0) fail("Sqrt: negative integer");
        return static_cast<T>(std::sqrt(static_cast<double>(x)));
      } else {
        return std::sqrt(x);
      }
    case UnaryOp::Reciprocal:
      if constexpr (std::is_integral_v<T>) {
        if (x == 0) fail("Reciprocal: integer zero");
        return static_cast<T>(1 / x);
      } else {
        return T(1) / x;
      }
    case UnaryOp::Neg:
      if constexpr (std::is_integral_v<T>) return static_cast<T>(-static_cast<std::make_unsigned_t<T>>(x));
      else return -x;
    case UnaryOp::Relu: return x > T(0) ? x : (x == x ? T(0) : x);  // NaN stays NaN
  }
  fail("unknown unary op");
}

}  // namespace

template <typename T>
Array<T> binary(BinaryOp op, const Array<T>& a, const Array<T>& b) {
  checkArray(a, "binary op A");
  checkArray(b, "binary op B");
  Array<T> y = makeArray<T>(broadcastDims(a.dims, b.dims));
  forEachIndex(y.dims, broadcastStrides(a.dims, y.dims), broadcastStrides(b.dims, y.dims), 0, 0,
               [&](int64_t out, int64_t ia, int64_t ib) {
                 y.data[static_cast<size_t>(out)] =
                     applyBinary(op, a.data[static_cast<size_t>(ia)], b.data[static_cast<size_t>(ib)]);
               });
  return y;
}

template <typename T>
Array<T> unary(UnaryOp op, const Array<T>& x) {
  checkArray(x, "unary op");
  Array<T> y = makeArray<T>(x.dims);
  for (size_t i = 0; i < x.data.size(); ++i) y.data[i] = applyUnary(op, x.data[i]);
  return y;
}

template <typename T>
Array<T> leakyRelu(const Array<T>& x, double alpha) {
  checkArray(x, "LeakyRelu");
  Array<T> y = makeArray<T>(x.dims);
  // As ORT: the product is taken in T with alpha rounded to T (ORT reads alpha as a float attribute).
  const T a = static_cast<T>(static_cast<float>(alpha));
  for (size_t i = 0; i < x.data.size(); ++i) y.data[i] = x.data[i] >= T(0) ? x.data[i] : a * x.data[i];
  return y;
}

template <typename T>
Array<T> prelu(const Array<T>& x, const Array<T>& slope) {
  checkArray(x, "PRelu X");
  checkArray(slope, "PRelu slope");
  if (broadcastDims(x.dims, slope.dims) != x.dims) fail("PRelu: slope does not broadcast to the shape of X");
  Array<T> y = makeArray<T>(x.dims);
  forEachIndex(y.dims, broadcastStrides(x.dims, y.dims), broadcastStrides(slope.dims, y.dims), 0, 0,
               [&](int64_t out, int64_t ix, int64_t is) {
                 const T v = x.data[static_cast<size_t>(ix)];
                 y.data[static_cast<size_t>(out)] = v >= T(0) ? v : slope.data[static_cast<size_t>(is)] * v;
               });
  return y;
}

namespace {
template <typename T>
Array<T> reduce(const Array<T>& x, const std::vector<int64_t>& axes, bool keepDims, bool mean) {
  checkArray(x, "ReduceMean");
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  std::vector<bool> reduced(x.dims.size(), axes.empty());
  for (int64_t axis : axes) {
    const size_t at = static_cast<size_t>(normalizeAxis(axis, rank, "ReduceMean"));
    if (reduced[at]) fail("ReduceMean: repeated axis " + std::to_string(axis));
    reduced[at] = true;
  }
  Dims kept = x.dims;
  int64_t count = 1;
  for (size_t d = 0; d < kept.size(); ++d)
    if (reduced[d]) {
      count *= kept[d];
      kept[d] = 1;
    }
  // The output first: it refuses a size past kMaxElements, which an empty input reduced over its zero dim can ask
  // for while the input itself holds nothing.
  Dims outDims;
  for (size_t d = 0; d < kept.size(); ++d)
    if (keepDims || !reduced[d]) outDims.push_back(kept[d]);
  Array<T> y = makeArray<T>(outDims);
  // Accumulate in double (integers in int64) into the kept-dims layout, then divide.
  using Acc = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
  std::vector<Acc> sums(y.data.size(), Acc(0));
  const Dims zero(x.dims.size(), 0);
  forEachIndex(x.dims, broadcastStrides(kept, x.dims), zero, 0, 0, [&](int64_t in, int64_t out, int64_t) {
    sums[static_cast<size_t>(out)] += static_cast<Acc>(x.data[static_cast<size_t>(in)]);
  });
  for (size_t i = 0; i < sums.size(); ++i) {
    if (!mean) {
      y.data[i] = static_cast<T>(sums[i]);
    } else if constexpr (std::is_integral_v<T>) {
      if (count == 0) fail("ReduceMean: integer mean of no elements");
      y.data[i] = static_cast<T>(sums[i] / count);
    } else {
      y.data[i] = static_cast<T>(sums[i] / static_cast<double>(count));
    }
  }
  return y;
}
}  // namespace

template <typename T>
Array<T> reduceMean(const Array<T>& x, const std::vector<int64_t>& axes, bool keepDims) {
  return reduce(x, axes, keepDims, true);
}

template <typename T>
Array<T> reduceSum(const Array<T>& x, const std::vector<int64_t>& axes, bool keepDims) {
  return reduce(x, axes, keepDims, false);
}

// ---------------------------------------------------------------------------------------------------------------
// Layout

template <typename T>
Array<T> transpose(const Array<T>& x, const std::vector<int64_t>& perm) {
  checkArray(x, "Transpose");
  const size_t rank = x.dims.size();
  std::vector<int64_t> p = perm;
  if (p.empty())
    for (size_t i = rank; i-- > 0;) p.push_back(static_cast<int64_t>(i));
  if (p.size() != rank) fail("Transpose: perm " + formatDims(perm) + " does not fit rank " + std::to_string(rank));
  std::vector<bool> seen(rank, false);
  for (int64_t axis : p) {
    if (axis < 0 || axis >= static_cast<int64_t>(rank) || seen[static_cast<size_t>(axis)]) {
      fail("Transpose: perm " + formatDims(perm) + " is not a permutation");
    }
    seen[static_cast<size_t>(axis)] = true;
  }
  const Dims inStrides = rowMajorStrides(x.dims);
  Dims outDims(rank), strides(rank);
  for (size_t i = 0; i < rank; ++i) {
    outDims[i] = x.dims[static_cast<size_t>(p[i])];
    strides[i] = inStrides[static_cast<size_t>(p[i])];
  }
  Array<T> y = makeArray<T>(outDims);
  forEachIndex(outDims, strides, Dims(rank, 0), 0, 0, [&](int64_t out, int64_t in, int64_t) {
    y.data[static_cast<size_t>(out)] = x.data[static_cast<size_t>(in)];
  });
  return y;
}

template <typename T>
Array<T> slice(const Array<T>& x, const std::vector<int64_t>& starts, const std::vector<int64_t>& ends,
               const std::vector<int64_t>& axes, const std::vector<int64_t>& steps) {
  checkArray(x, "Slice");
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  if (starts.size() != ends.size()) fail("Slice: starts and ends differ in length");
  if (!axes.empty() && axes.size() != starts.size()) fail("Slice: axes and starts differ in length");
  if (!steps.empty() && steps.size() != starts.size()) fail("Slice: steps and starts differ in length");
  if (axes.empty() && static_cast<int64_t>(starts.size()) > rank) fail("Slice: more starts than axes");
  const Dims inStrides = rowMajorStrides(x.dims);
  Dims outDims = x.dims, strides = inStrides;
  std::vector<bool> seen(x.dims.size(), false);
  int64_t base = 0;
  for (size_t i = 0; i < starts.size(); ++i) {
    const size_t axis = static_cast<size_t>(axes.empty() ? static_cast<int64_t>(i) : normalizeAxis(axes[i], rank, "Slice"));
    if (seen[axis]) fail("Slice: repeated axis");
    seen[axis] = true;
    const int64_t step = steps.empty() ? 1 : steps[i];
    if (step == 0) fail("Slice: step 0");
    const int64_t dim = x.dims[axis];
    int64_t start = starts[i], end = ends[i];
    // Below -dim means "before the first element"; -1 says that without overflowing on INT64_MIN + dim.
    if (start < 0) start = start < -dim ? -1 : start + dim;
    if (end < 0) end = end < -dim ? -1 : end + dim;
    int64_t count = 0;
    if (step > 0) {
      start = std::clamp<int64_t>(start, 0, dim);
      end = std::clamp<int64_t>(end, 0, dim);
      if (end > start) count = (end - start - 1) / step + 1;
    } else {
      start = std::clamp<int64_t>(start, 0, dim - 1);
      end = std::clamp<int64_t>(end, -1, dim - 1);
      if (start > end) count = (start - end - 1) / (-step) + 1;
    }
    if (dim == 0) count = 0;
    outDims[axis] = count;
    if (count > 0) base += start * inStrides[axis];
    // count * step stays within the axis, so a huge step cannot overflow once multiplied by a stride.
    strides[axis] = count > 1 ? step * inStrides[axis] : 0;
  }
  Array<T> y = makeArray<T>(outDims);
  forEachIndex(outDims, strides, Dims(outDims.size(), 0), base, 0, [&](int64_t out, int64_t in, int64_t) {
    y.data[static_cast<size_t>(out)] = x.data[static_cast<size_t>(in)];
  });
  return y;
}

template <typename T>
Array<T> gather(const Array<T>& x, const Array<int64_t>& indices, int64_t axis) {
  checkArray(x, "Gather data");
  checkArray(indices, "Gather indices");
  const int64_t rank = static_cast<int64_t>(x.dims.size());
  if (rank == 0) fail("Gather: data must have rank >= 1");
  const size_t at = static_cast<size_t>(normalizeAxis(axis, rank, "Gather"));
  const int64_t dim = x.dims[at];
  Dims outDims(x.dims.begin(), x.dims.begin() + static_cast<std::ptrdiff_t>(at));
  outDims.insert(outDims.end(), indices.dims.begin(), indices.dims.end());
  outDims.insert(outDims.end(), x.dims.begin() + static_cast<std::ptrdiff_t>(at) + 1, x.dims.end());
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < at; ++d) outer *= x.dims[d];
  for (size_t d = at + 1; d < x.dims.size(); ++d) inner *= x.dims[d];
  for (int64_t index : indices.data)
    if (index < -dim || index >= dim) fail("Gather: index " + std::to_string(index) + " out of range for dim " + std::to_string(dim));
  Array<T> y = makeArray<T>(outDims);
  T* out = y.data.data();
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t index : indices.data) {
      const T* in = x.data.data() + (o * dim + (index < 0 ? index + dim : index)) * inner;
      out = std::copy(in, in + inner, out);
    }
  }
  return y;
}

template <typename T>
Array<T> expand(const Array<T>& x, const Dims& shape) {
  checkArray(x, "Expand");
  Array<T> y = makeArray<T>(broadcastDims(x.dims, shape));
  forEachIndex(y.dims, broadcastStrides(x.dims, y.dims), Dims(y.dims.size(), 0), 0, 0,
               [&](int64_t out, int64_t in, int64_t) { y.data[static_cast<size_t>(out)] = x.data[static_cast<size_t>(in)]; });
  return y;
}

template <typename T>
Array<T> concat(const std::vector<const Array<T>*>& inputs, int64_t axis) {
  if (inputs.empty()) fail("Concat: no inputs");
  for (const Array<T>* input : inputs) {
    if (!input) fail("Concat: missing input");
    checkArray(*input, "Concat");
  }
  const Dims& first = inputs[0]->dims;
  const int64_t rank = static_cast<int64_t>(first.size());
  if (rank == 0) fail("Concat: inputs must have rank >= 1");
  const size_t at = static_cast<size_t>(normalizeAxis(axis, rank, "Concat"));
  Dims outDims = first;
  outDims[at] = 0;
  for (const Array<T>* input : inputs) {
    if (input->dims.size() != first.size()) fail("Concat: inputs differ in rank");
    for (size_t d = 0; d < first.size(); ++d)
      if (d != at && input->dims[d] != first[d]) fail("Concat: " + formatDims(input->dims) + " does not fit " + formatDims(first));
    outDims[at] = addChecked(outDims[at], input->dims[at], "Concat");
  }
  Array<T> y = makeArray<T>(outDims);
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < at; ++d) outer *= first[d];
  for (size_t d = at + 1; d < first.size(); ++d) inner *= first[d];
  T* out = y.data.data();
  for (int64_t o = 0; o < outer; ++o) {
    for (const Array<T>* input : inputs) {
      const int64_t block = input->dims[at] * inner;
      const T* in = input->data.data() + o * block;
      out = std::copy(in, in + block, out);
    }
  }
  return y;
}

// ---------------------------------------------------------------------------------------------------------------
// MaxPool, AveragePool

// A pool's windows over x `[N, C, D1..Dn]`: the output dims and, per spatial axis, the input position of each
// (kernel offset, output position), -1 in the padding (positionTable).
struct PoolWindows {
  Dims kernel, inSpatial, outSpatial, outDims, inStrides;
  std::vector<std::vector<int64_t>> tables;
  int64_t inSize = 0, outSize = 0, kernelSize = 0;
};

template <typename T>
PoolWindows poolWindows(const Array<T>& x, const ConvAttributes& a, const char* op) {
  const std::string name(op);
  checkArray(x, (name + " X").c_str());
  if (x.dims.size() < 3) fail(name + ": X must have rank >= 3, got " + formatDims(x.dims));
  const size_t n = x.dims.size() - 2;
  if (a.kernelShape.size() != n) fail(name + ": kernel_shape needs " + std::to_string(n) + " values");
  Dims window{1, 1};
  window.insert(window.end(), a.kernelShape.begin(), a.kernelShape.end());
  const SpatialAttributes s = spatialAttributes(a, window, op);
  PoolWindows w;
  w.kernel = s.kernel;
  w.inSpatial.assign(x.dims.begin() + 2, x.dims.end());
  Dims padBegin;
  windowGeometry(s, a.autoPad, x.dims, op, w.outSpatial, padBegin);
  w.outDims = {x.dims[0], x.dims[1]};
  w.outDims.insert(w.outDims.end(), w.outSpatial.begin(), w.outSpatial.end());
  w.tables.resize(n);
  for (size_t d = 0; d < n; ++d)
    w.tables[d] =
        positionTable(s.kernel[d], w.outSpatial[d], s.strides[d], s.dilations[d], padBegin[d], w.inSpatial[d]);
  w.inStrides = rowMajorStrides(w.inSpatial);
  w.inSize = elementCount(w.inSpatial);
  w.outSize = elementCount(w.outSpatial);
  w.kernelSize = elementCount(s.kernel);
  return w;
}

// Calls f(outIndex, inIndex) for every window position inside x, over one plane, kernel offset by kernel offset.
template <typename F>
void forEachWindowPosition(const PoolWindows& w, F&& f) {
  std::vector<int64_t> kernelIndex(w.kernel.size(), 0), scratch(w.kernel.size());
  for (int64_t k = 0; k < w.kernelSize; ++k) {
    forEachMappedPosition(w.outSpatial, w.inStrides, w.tables, kernelIndex, scratch, f);
    nextKernelIndex(kernelIndex, w.kernel);
  }
}

template <typename T>
Array<T> maxPool(const Array<T>& x, const ConvAttributes& a) {
  const PoolWindows w = poolWindows(x, a, "MaxPool");
  Array<T> y = makeArray<T>(w.outDims);
  // Padding never wins: positions outside X are skipped, as if they held -infinity.
  std::fill(y.data.begin(), y.data.end(), -std::numeric_limits<T>::infinity());
  for (int64_t plane = 0; plane < x.dims[0] * x.dims[1]; ++plane) {
    const T* in = x.data.data() + plane * w.inSize;
    T* out = y.data.data() + plane * w.outSize;
    // A NaN never wins a comparison: it is skipped, as std::max from -infinity would.
    forEachWindowPosition(w, [&](int64_t outIndex, int64_t inIndex) {
      if (in[inIndex] > out[outIndex]) out[outIndex] = in[inIndex];
    });
  }
  return y;
}

template <typename T>
Array<T> averagePool(const Array<T>& x, const ConvAttributes& a, bool countIncludePad) {
  const PoolWindows w = poolWindows(x, a, "AveragePool");
  // The divisor of each output position: the window's positions inside X, or (count_include_pad) all of them.
  std::vector<double> divisor(static_cast<size_t>(w.outSize), 0.0);
  forEachWindowPosition(w, [&](int64_t outIndex, int64_t) { divisor[static_cast<size_t>(outIndex)] += 1.0; });
  for (double& d : divisor) {
    if (d == 0.0) fail("AveragePool: a window lies wholly in the padding");
    if (countIncludePad) d = static_cast<double>(w.kernelSize);
  }
  Array<T> y = makeArray<T>(w.outDims);
  std::vector<double> sums(static_cast<size_t>(w.outSize));
  for (int64_t plane = 0; plane < x.dims[0] * x.dims[1]; ++plane) {
    const T* in = x.data.data() + plane * w.inSize;
    std::fill(sums.begin(), sums.end(), 0.0);
    forEachWindowPosition(w, [&](int64_t outIndex, int64_t inIndex) {
      sums[static_cast<size_t>(outIndex)] += static_cast<double>(in[inIndex]);
    });
    T* out = y.data.data() + plane * w.outSize;
    for (int64_t i = 0; i < w.outSize; ++i)
      out[i] = static_cast<T>(sums[static_cast<size_t>(i)] / divisor[static_cast<size_t>(i)]);
  }
  return y;
}

// ---------------------------------------------------------------------------------------------------------------
// Instantiations

#define BNFOLD_FLOAT_KERNELS(T)                                                                                       \
  template Array<T> conv(const Array<T>&, const Array<T>&, const Array<T>*, const ConvAttributes&);                   \
  template Array<T> convTranspose(const Array<T>&, const Array<T>&, const Array<T>*, const ConvAttributes&);          \
  template Array<T> maxPool(const Array<T>&, const ConvAttributes&);                                                  \
  template Array<T> averagePool(const Array<T>&, const ConvAttributes&, bool);                                        \
  template Array<T> gemm(const Array<T>&, const Array<T>&, const Array<T>*, double, double, bool, bool);              \
  template Array<T> matMul(const Array<T>&, const Array<T>&);                                                         \
  template Array<T> batchNormInference(const Array<T>&, const Array<T>&, const Array<T>&, const Array<T>&,            \
                                       const Array<T>&, double);                                                      \
  template BatchNormTraining<T> batchNormTraining(const Array<T>&, const Array<T>&, const Array<T>&, const Array<T>&, \
                                                  const Array<T>&, double, double);                                   \
  template LayerNormalizationResult<T> layerNormalization(const Array<T>&, const Array<T>&, const Array<T>*, int64_t, \
                                                          double, StashRounding);                                     \
  template Array<T> rmsNormalization(const Array<T>&, const Array<T>&, int64_t, double, StashRounding);               \
  template Array<T> groupNormalization(const Array<T>&, const Array<T>&, const Array<T>&, int64_t, double,            \
                                       GroupAffine, StashRounding);                                                   \
  template Array<T> instanceNormalization(const Array<T>&, const Array<T>&, const Array<T>&, double);                 \
  template Array<T> leakyRelu(const Array<T>&, double);                                                               \
  template Array<T> prelu(const Array<T>&, const Array<T>&);

#define BNFOLD_ANY_KERNELS(T)                                                                                       \
  template Array<T> binary(BinaryOp, const Array<T>&, const Array<T>&);                                             \
  template Array<T> unary(UnaryOp, const Array<T>&);                                                                \
  template Array<T> reduceMean(const Array<T>&, const std::vector<int64_t>&, bool);                                 \
  template Array<T> reduceSum(const Array<T>&, const std::vector<int64_t>&, bool);                                  \
  template Array<T> transpose(const Array<T>&, const std::vector<int64_t>&);                                        \
  template Array<T> slice(const Array<T>&, const std::vector<int64_t>&, const std::vector<int64_t>&,                \
                          const std::vector<int64_t>&, const std::vector<int64_t>&);                                \
  template Array<T> gather(const Array<T>&, const Array<int64_t>&, int64_t);                                        \
  template Array<T> expand(const Array<T>&, const Dims&);                                                           \
  template Array<T> concat(const std::vector<const Array<T>*>&, int64_t);

BNFOLD_FLOAT_KERNELS(float)
BNFOLD_FLOAT_KERNELS(double)
BNFOLD_ANY_KERNELS(float)
BNFOLD_ANY_KERNELS(double)
BNFOLD_ANY_KERNELS(int64_t)

#undef BNFOLD_FLOAT_KERNELS
#undef BNFOLD_ANY_KERNELS

}  // namespace bnfold::verify
