#include "scaled_weight.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "ir/scale_elements.h"

namespace bnfold::rules {
namespace {

// The source's bytes, which the scaling then rewrites element by element.
void readWhole(const DeferredBytes& source, int64_t elementBytes, int64_t offset, int64_t length, char* out) {
  if (offset % elementBytes != 0 || length % elementBytes != 0)
    throw std::invalid_argument("scaled weight: read of bytes " + std::to_string(offset) + "+" +
                                std::to_string(length) + " does not fall on element boundaries");
  source.read(offset, length, out);
}

// onRun(at, length, factor, stride) for elements [first, first + count) under `indexing`, at relative to `first`: the
// element at + i takes factor[i * stride]. Runs of one channel (stride 0), or, where channels change every element
// (a 1x1 Conv's or a dense layer's input side, a MatMul's output side), rows of consecutive channels (stride 1).
template <typename F>
void forEachChannelStretch(const kernels::ChannelIndexing& indexing, const std::vector<double>& factors, int64_t first,
                           int64_t count, F&& onRun) {
  if (indexing.inner == 1) {
    for (int64_t i = first; i < first + count;) {
      const int64_t run = std::min(indexing.perGroup - i % indexing.perGroup, first + count - i);
      onRun(i - first, run, factors.data() + indexing.channel(i), int64_t{1});
      i += run;
    }
    return;
  }
  kernels::forEachChannelRun(indexing, first, count, [&](int64_t at, int64_t run, int64_t channel) {
    onRun(at, run, &factors[static_cast<std::size_t>(channel)], int64_t{0});
  });
}

// Elements times factor[i * stride] (stride 0: one factor, 1: one each), in double, rounded once to T and widened to
// doubles: as read() and then Tensor::toDoubles give them, in one pass over the stored bytes.
template <typename T>
void scaledToDoubles(const char* raw, int64_t count, const double* factor, int64_t stride, double* out) {
  for (int64_t i = 0; i < count; ++i) {
    T value;
    std::memcpy(&value, raw + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    out[i] = static_cast<double>(static_cast<T>(static_cast<double>(value) * factor[i * stride]));
  }
}

// Elements [at, at + length) of a read whose output and input factors are out[i * outStride] and in[i * inStride]:
// stride 0 for one factor over the stretch, 1 for one per element.
struct FactorStretch {
  int64_t at = 0, length = 0;
  const double* out = nullptr;
  int64_t outStride = 0;
  const double* in = nullptr;
  int64_t inStride = 0;
};

// Elements [first, first + count) as stretches of at most one factor per side: runs of one channel on the side whose
// channels change least often, split by the other side's channels as forEachChannelStretch splits them.
template <typename F>
void forEachFactorStretch(const kernels::ChannelIndexing& outIndexing, const std::vector<double>& outFactors,
                          const kernels::ChannelIndexing& inIndexing, const std::vector<double>& inFactors,
                          int64_t first, int64_t count, F&& onStretch) {
  const bool outOuter = outIndexing.inner >= inIndexing.inner;
  const kernels::ChannelIndexing& outer = outOuter ? outIndexing : inIndexing;
  const kernels::ChannelIndexing& inner = outOuter ? inIndexing : outIndexing;
  const std::vector<double>& outerFactors = outOuter ? outFactors : inFactors;
  const std::vector<double>& innerFactors = outOuter ? inFactors : outFactors;
  kernels::forEachChannelRun(outer, first, count, [&](int64_t at, int64_t length, int64_t channel) {
    const double* outerFactor = &outerFactors[static_cast<std::size_t>(channel)];
    auto emit = [&](int64_t stretchAt, int64_t stretchLength, const double* innerFactor, int64_t innerStride) {
      FactorStretch stretch;
      stretch.at = stretchAt;
      stretch.length = stretchLength;
      (outOuter ? stretch.out : stretch.in) = outerFactor;
      (outOuter ? stretch.in : stretch.out) = innerFactor;
      (outOuter ? stretch.inStride : stretch.outStride) = innerStride;
      onStretch(stretch);
    };
    forEachChannelStretch(inner, innerFactors, first + at, length,
                          [&](int64_t innerAt, int64_t innerLength, const double* innerFactor, int64_t innerStride) {
                            emit(at + innerAt, innerLength, innerFactor, innerStride);
                          });
  });
}

// A stretch's elements times both factors, in double (the output's first), rounded once to T: in place, or widened
// to doubles.
template <typename T>
void scaleStretchInPlace(char* bytes, const FactorStretch& s) {
  for (int64_t i = 0; i < s.length; ++i) {
    T value;
    std::memcpy(&value, bytes + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    const T scaled = static_cast<T>(static_cast<double>(value) * s.out[i * s.outStride] * s.in[i * s.inStride]);
    std::memcpy(bytes + i * static_cast<int64_t>(sizeof(T)), &scaled, sizeof(T));
  }
}

template <typename T>
void stretchToDoubles(const char* raw, const FactorStretch& s, double* out) {
  for (int64_t i = 0; i < s.length; ++i) {
    T value;
    std::memcpy(&value, raw + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    out[i] =
        static_cast<double>(static_cast<T>(static_cast<double>(value) * s.out[i * s.outStride] * s.in[i * s.inStride]));
  }
}

// Whether the scaled classes read `type` straight to doubles (the 16-bit types round through float to odd, which
// only scaleElementsInPlace does).
bool readsAsDoubles(DataType type) { return type == DataType::Float || type == DataType::Double; }

class ScaledChannelBytes final : public DeferredBytes {
 public:
  ScaledChannelBytes(std::shared_ptr<const DeferredBytes> source, DataType type, kernels::ChannelIndexing indexing,
                     std::vector<double> scale)
      : source_(std::move(source)),
        type_(type),
        elementBytes_(static_cast<int64_t>(elementSize(type))),
        indexing_(indexing),
        scale_(std::move(scale)) {}

  int64_t size() const override { return source_->size(); }

  const std::shared_ptr<const DeferredBytes>& source() const { return source_; }
  DataType type() const { return type_; }
  const kernels::ChannelIndexing& indexing() const { return indexing_; }
  const std::vector<double>& scale() const { return scale_; }

  void read(int64_t offset, int64_t length, char* out) const override {
    readWhole(*source_, elementBytes_, offset, length, out);
    forEachChannelStretch(indexing_, scale_, offset / elementBytes_, length / elementBytes_,
                          [&](int64_t at, int64_t run, const double* factor, int64_t stride) {
                            char* bytes = out + at * elementBytes_;
                            if (stride == 0)
                              scaleElementsInPlace(type_, bytes, run, *factor);
                            else
                              scaleElementsInPlace(type_, bytes, run, factor);
                          });
  }

  /// Elements [first, first + count) as doubles (readsAsDoubles(type()) only); `raw` holds their stored bytes.
  void readDoubles(int64_t first, int64_t count, double* out, std::vector<char>& raw) const {
    raw.resize(static_cast<std::size_t>(count * elementBytes_));
    source_->read(first * elementBytes_, count * elementBytes_, raw.data());
    const bool isFloat = type_ == DataType::Float;
    forEachChannelStretch(indexing_, scale_, first, count,
                          [&](int64_t at, int64_t run, const double* factor, int64_t stride) {
                            const char* bytes = raw.data() + at * elementBytes_;
                            if (isFloat)
                              scaledToDoubles<float>(bytes, run, factor, stride, out + at);
                            else
                              scaledToDoubles<double>(bytes, run, factor, stride, out + at);
                          });
  }

 private:
  std::shared_ptr<const DeferredBytes> source_;
  DataType type_;
  int64_t elementBytes_;
  kernels::ChannelIndexing indexing_;
  std::vector<double> scale_;
};

// The factor of each element [first, first + count) under `indexing`, into out[0, count).
void elementFactors(const kernels::ChannelIndexing& indexing, const std::vector<double>& factors, int64_t first,
                    int64_t count, double* out) {
  forEachChannelStretch(indexing, factors, first, count,
                        [&](int64_t at, int64_t run, const double* factor, int64_t stride) {
                          if (stride == 0)
                            std::fill_n(out + at, run, *factor);
                          else
                            std::copy_n(factor, run, out + at);
                        });
}

class ScaledBothSidesBytes final : public DeferredBytes {
 public:
  ScaledBothSidesBytes(std::shared_ptr<const DeferredBytes> source, DataType type, kernels::ChannelIndexing outIndexing,
                       std::vector<double> outFactors, kernels::ChannelIndexing inIndexing, std::vector<double> inFactors)
      : source_(std::move(source)),
        type_(type),
        elementBytes_(static_cast<int64_t>(elementSize(type))),
        outIndexing_(outIndexing),
        inIndexing_(inIndexing),
        outFactors_(std::move(outFactors)),
        inFactors_(std::move(inFactors)) {}

  int64_t size() const override { return source_->size(); }

  const std::shared_ptr<const DeferredBytes>& source() const { return source_; }
  DataType type() const { return type_; }
  const kernels::ChannelIndexing& outIndexing() const { return outIndexing_; }
  const kernels::ChannelIndexing& inIndexing() const { return inIndexing_; }
  const std::vector<double>& outFactors() const { return outFactors_; }
  const std::vector<double>& inFactors() const { return inFactors_; }

  void read(int64_t offset, int64_t length, char* out) const override {
    readWhole(*source_, elementBytes_, offset, length, out);
    const int64_t first = offset / elementBytes_;
    const int64_t count = length / elementBytes_;
    if (readsAsDoubles(type_)) {
      const bool isFloat = type_ == DataType::Float;
      forEachFactorStretch(outIndexing_, outFactors_, inIndexing_, inFactors_, first, count,
                           [&](const FactorStretch& stretch) {
                             char* bytes = out + stretch.at * elementBytes_;
                             if (isFloat)
                               scaleStretchInPlace<float>(bytes, stretch);
                             else
                               scaleStretchInPlace<double>(bytes, stretch);
                           });
      return;
    }
    // The 16-bit types: each element's two factors, a block at a time, for scaleElementsInPlace (uninitialised:
    // every element is written before it is read).
    constexpr int64_t kBlock = 4096;
    const std::unique_ptr<double[]> outFactor(new double[kBlock]), inFactor(new double[kBlock]);
    for (int64_t done = 0; done < count; done += kBlock) {
      const int64_t block = std::min(kBlock, count - done);
      elementFactors(outIndexing_, outFactors_, first + done, block, outFactor.get());
      elementFactors(inIndexing_, inFactors_, first + done, block, inFactor.get());
      scaleElementsInPlace(type_, out + done * elementBytes_, block, outFactor.get(), inFactor.get());
    }
  }

  /// Elements [first, first + count) as doubles (readsAsDoubles(type()) only); `raw` holds their stored bytes.
  void readDoubles(int64_t first, int64_t count, double* out, std::vector<char>& raw) const {
    raw.resize(static_cast<std::size_t>(count * elementBytes_));
    source_->read(first * elementBytes_, count * elementBytes_, raw.data());
    const bool isFloat = type_ == DataType::Float;
    forEachFactorStretch(outIndexing_, outFactors_, inIndexing_, inFactors_, first, count,
                         [&](const FactorStretch& stretch) {
                           const char* bytes = raw.data() + stretch.at * elementBytes_;
                           if (isFloat)
                             stretchToDoubles<float>(bytes, stretch, out + stretch.at);
                           else
                             stretchToDoubles<double>(bytes, stretch, out + stretch.at);
                         });
  }

 private:
  std::shared_ptr<const DeferredBytes> source_;
  DataType type_;
  int64_t elementBytes_;
  kernels::ChannelIndexing outIndexing_, inIndexing_;
  std::vector<double> outFactors_, inFactors_;
};

// Elements of type T at `bytes` as doubles, as Tensor::toDoubles converts them (16-bit types through float).
template <typename T>
void convertToDoubles(const char* bytes, int64_t count, double* out) {
  for (int64_t i = 0; i < count; ++i) {
    T value;
    std::memcpy(&value, bytes + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    if constexpr (std::is_same_v<T, Eigen::half> || std::is_same_v<T, Eigen::bfloat16>)
      out[i] = static_cast<double>(static_cast<float>(value));
    else
      out[i] = static_cast<double>(value);
  }
}

using Converter = void (*)(const char*, int64_t, double*);

Converter converterFor(DataType type) {
  switch (type) {
    case DataType::Float: return convertToDoubles<float>;
    case DataType::Double: return convertToDoubles<double>;
    case DataType::Float16: return convertToDoubles<Eigen::half>;
    case DataType::BFloat16: return convertToDoubles<Eigen::bfloat16>;
    default: throw std::invalid_argument(std::string("weight reader: ") + dataTypeName(type) + " is not floating");
  }
}

// A reader's buffer for stored bytes, one per thread: the kernels may read two pieces of one layer at once.
std::vector<char>& threadBuffer() {
  thread_local std::vector<char> buffer;
  return buffer;
}

}  // namespace

kernels::WeightReader weightReader(const Tensor& weight) {
  const Converter convert = converterFor(weight.dataType());
  const auto elementBytes = static_cast<int64_t>(elementSize(weight.dataType()));
  std::shared_ptr<const DeferredBytes> source = weight.byteSource();
  // A scaled weight (a folded BN's, an earlier equalization's) straight from the bytes below it to doubles.
  if (const auto* scaled = dynamic_cast<const ScaledChannelBytes*>(source.get());
      scaled && readsAsDoubles(scaled->type()))
    return [source, scaled](int64_t first, int64_t count, double* out) {
      scaled->readDoubles(first, count, out, threadBuffer());
    };
  if (const auto* both = dynamic_cast<const ScaledBothSidesBytes*>(source.get()); both && readsAsDoubles(both->type()))
    return [source, both](int64_t first, int64_t count, double* out) {
      both->readDoubles(first, count, out, threadBuffer());
    };
  if (const std::optional<std::string_view> held = source->inMemory())
    return [source, held = *held, convert, elementBytes](int64_t first, int64_t count, double* out) {
      convert(held.data() + first * elementBytes, count, out);
    };
  // One piece's bytes at a time.
  return [source, convert, elementBytes](int64_t first, int64_t count, double* out) {
    std::vector<char>& piece = threadBuffer();
    piece.resize(static_cast<std::size_t>(count * elementBytes));
    source->read(first * elementBytes, count * elementBytes, piece.data());
    convert(piece.data(), count, out);
  };
}

namespace {

bool sameIndexing(const kernels::ChannelIndexing& a, const kernels::ChannelIndexing& b) {
  return a.inner == b.inner && a.perGroup == b.perGroup && a.rowsPerGroup == b.rowsPerGroup;
}

std::vector<double> times(std::vector<double> a, const std::vector<double>& b) {
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) a[i] *= b[i];
  return a;
}

}  // namespace

// A scaling of bytes that are themselves a scaling (a folded BN's, then equalize's) is one scaling of the bytes below:
// one pass over the weight when it is read, and every factor applied in double before the one rounding.
std::shared_ptr<const DeferredBytes> scaledBothSidesBytes(std::shared_ptr<const DeferredBytes> source, DataType type,
                                                          kernels::ChannelIndexing outputIndexing,
                                                          std::vector<double> outputFactors,
                                                          kernels::ChannelIndexing inputIndexing,
                                                          std::vector<double> inputFactors) {
  if (const auto* scaled = dynamic_cast<const ScaledChannelBytes*>(source.get()); scaled && scaled->type() == type) {
    if (sameIndexing(scaled->indexing(), outputIndexing))
      return scaledBothSidesBytes(scaled->source(), type, outputIndexing, times(scaled->scale(), outputFactors),
                                  inputIndexing, std::move(inputFactors));
    if (sameIndexing(scaled->indexing(), inputIndexing))
      return scaledBothSidesBytes(scaled->source(), type, outputIndexing, std::move(outputFactors), inputIndexing,
                                  times(scaled->scale(), inputFactors));
  }
  return std::make_shared<ScaledBothSidesBytes>(std::move(source), type, outputIndexing, std::move(outputFactors),
                                                inputIndexing, std::move(inputFactors));
}

std::shared_ptr<const DeferredBytes> scaledChannelBytes(std::shared_ptr<const DeferredBytes> source, DataType type,
                                                        kernels::ChannelIndexing indexing,
                                                        std::vector<double> scale) {
  if (const auto* scaled = dynamic_cast<const ScaledChannelBytes*>(source.get()); scaled && scaled->type() == type) {
    if (sameIndexing(scaled->indexing(), indexing))
      return scaledChannelBytes(scaled->source(), type, indexing, times(scaled->scale(), scale));
    return scaledBothSidesBytes(scaled->source(), type, scaled->indexing(), scaled->scale(), indexing,
                                std::move(scale));
  }
  if (const auto* both = dynamic_cast<const ScaledBothSidesBytes*>(source.get()); both && both->type() == type) {
    if (sameIndexing(both->outIndexing(), indexing))
      return scaledBothSidesBytes(both->source(), type, indexing, times(both->outFactors(), scale), both->inIndexing(),
                                  both->inFactors());
    if (sameIndexing(both->inIndexing(), indexing))
      return scaledBothSidesBytes(both->source(), type, both->outIndexing(), both->outFactors(), indexing,
                                  times(both->inFactors(), scale));
  }
  return std::make_shared<ScaledChannelBytes>(std::move(source), type, indexing, std::move(scale));
}

}  // namespace bnfold::rules
