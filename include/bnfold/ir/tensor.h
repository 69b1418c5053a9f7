#pragma once
/// \file
/// Tensor: one type for initializers and Constant-node values. It owns the TensorProto it was loaded from
/// and reads its bytes in place; bytes are only copied when they are not stored packed (typed repeated
/// fields that do not match the element layout) or live in an external data file.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <Eigen/Core>
#include <onnx/onnx_pb.h>

namespace bnfold {

/// a * b, or nothing when the product does not fit in int64. Sizes taken from a model file are untrusted: every
/// product of dims goes through this (or saturatingProduct), never a plain `*`.
inline std::optional<int64_t> checkedProduct(int64_t a, int64_t b) {
  int64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

/// The product of `dims`, or nothing when a dim is negative (unknown) or the product does not fit in int64.
template <typename Dims>
std::optional<int64_t> checkedElementCount(const Dims& dims) {
  int64_t count = 1;
  for (int64_t dim : dims) {
    const std::optional<int64_t> next = dim < 0 ? std::nullopt : checkedProduct(count, dim);
    if (!next) return std::nullopt;
    count = *next;
  }
  return count;
}

/// The product of `dims`, or INT64_MAX when checkedElementCount has none: for size bounds, which must refuse.
template <typename Dims>
int64_t saturatingElementCount(const Dims& dims) {
  return checkedElementCount(dims).value_or(INT64_MAX);
}

/// Element types, numbered as onnx::TensorProto_DataType.
enum class DataType : int32_t {
  Undefined = 0,
  Float = 1,
  UInt8 = 2,
  Int8 = 3,
  UInt16 = 4,
  Int16 = 5,
  Int32 = 6,
  Int64 = 7,
  String = 8,
  Bool = 9,
  Float16 = 10,
  Double = 11,
  UInt32 = 12,
  UInt64 = 13,
  Complex64 = 14,
  Complex128 = 15,
  BFloat16 = 16,
};

/// Bytes per element; 0 for String and Undefined (and for types this build does not know).
std::size_t elementSize(DataType type);
/// The bytes a tensor of `type` and `dims` holds, or nothing when a dim is unknown or the size does not fit in int64:
/// for size limits on tensors about to be made, whose dims may come from a file's claims.
template <typename Dims>
std::optional<int64_t> checkedByteSize(DataType type, const Dims& dims) {
  const std::optional<int64_t> count = checkedElementCount(dims);
  return count ? checkedProduct(*count, static_cast<int64_t>(elementSize(type))) : std::nullopt;
}
/// The ONNX spelling ("float", "float16", ...).
std::string dataTypeName(DataType type);
/// float, double, float16 or bfloat16.
bool isFloatingPoint(DataType type);
/// int8 to int64, uint8 to uint64, and bool.
bool isIntegerType(DataType type);

/// Where an externally stored tensor's bytes are, as declared by its `external_data` entries.
struct ExternalDataRef {
  std::string location;  ///< path relative to the model's folder, as written in the model
  int64_t offset = 0;
  int64_t length = -1;  ///< -1: until the end of the file
};

template <typename T>
class TensorView;

/// An open model file whose tensor bytes were left in place on load (see Tensor::deferredRawData).
class SourceFile {
 public:
  SourceFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  ~SourceFile();
  SourceFile(const SourceFile&) = delete;
  SourceFile& operator=(const SourceFile&) = delete;
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

/// Bytes of a tensor's raw_data that still live in the model file: `length` bytes at `offset`.
struct FileRange {
  std::shared_ptr<const SourceFile> file;
  int64_t offset = 0;
  int64_t length = 0;
};

/// A tensor's packed bytes that the TensorProto does not hold: left in a file, or computed on demand from
/// another tensor's bytes (a folded weight). Readers ask for ranges, so the writer can stream a large tensor
/// without holding all of it; ranges start and end on element boundaries.
class DeferredBytes {
 public:
  virtual ~DeferredBytes() = default;
  virtual int64_t size() const = 0;
  /// Copies bytes [offset, offset + length) into `out`. Throws bnfold::Error when the source cannot be read.
  virtual void read(int64_t offset, int64_t length, char* out) const = 0;
  /// Where the bytes lie unchanged in a file, if they do (the writer then copies file to file).
  virtual const FileRange* fileRange() const { return nullptr; }
  /// All the bytes, when they are held in memory already (readers then need no copy).
  virtual std::optional<std::string_view> inMemory() const { return std::nullopt; }
};

/// DeferredBytes that are a byte range of a file.
class FileBytes final : public DeferredBytes {
 public:
  explicit FileBytes(FileRange range) : range_(std::move(range)) {}
  int64_t size() const override { return range_.length; }
  void read(int64_t offset, int64_t length, char* out) const override;
  const FileRange* fileRange() const override { return &range_; }

 private:
  FileRange range_;
};

/// Multiplies `count` packed elements of a floating-point `type` in place by `factor`: each is computed in
/// double and rounded once to `type` (as Tensor::fromDoubles rounds).
void scaleElementsInPlace(DataType type, char* bytes, int64_t count, double factor);
/// The same with one factor per element: element i is multiplied by factors[i].
void scaleElementsInPlace(DataType type, char* bytes, int64_t count, const double* factors);

class Tensor {
 public:
  /// Takes ownership of a loaded TensorProto. `baseDir` is the folder external data paths are relative to.
  explicit Tensor(std::unique_ptr<onnx::TensorProto> proto, std::string baseDir = {});
  /// The same with a folder shared by the tensors of one model (a loader makes one for all of them).
  Tensor(std::unique_ptr<onnx::TensorProto> proto, std::shared_ptr<const std::string> baseDir);
  /// A tensor whose raw_data was left in the model file: `proto` has every field but raw_data, and `rawData`
  /// says where those bytes are. They are read (and cached) only when someone asks for them.
  Tensor(std::unique_ptr<onnx::TensorProto> proto, std::shared_ptr<const std::string> baseDir, FileRange rawData);
  /// A tensor whose bytes come from `bytes` when someone needs them (`proto` has every field but the data).
  Tensor(std::unique_ptr<onnx::TensorProto> proto, std::shared_ptr<const DeferredBytes> bytes);

  /// A new tensor of the given type and dims whose packed bytes are `bytes` (read when needed).
  static Tensor deferred(std::string name, DataType type, std::vector<int64_t> dims,
                         std::shared_ptr<const DeferredBytes> bytes);

  /// A new tensor from double values, rounded once to `type` (float, double, float16 or bfloat16).
  static Tensor fromDoubles(std::string name, DataType type, std::vector<int64_t> dims,
                            const std::vector<double>& values);
  /// A new tensor holding int64 values (shapes, axes).
  static Tensor fromInt64s(std::string name, std::vector<int64_t> dims, const std::vector<int64_t>& values);

  const std::string& name() const { return proto_->name(); }
  void setName(const std::string& name) { proto_->set_name(name); }
  DataType dataType() const { return dataType_; }
  std::vector<int64_t> dims() const { return {proto_->dims().begin(), proto_->dims().end()}; }
  int64_t rank() const { return proto_->dims_size(); }
  /// The product of the dims. Throws bnfold::Error when it does not fit in int64 (validate() refuses such a
  /// tensor on load).
  int64_t elementCount() const;
  bool isExternal() const;
  /// Written to the output's external data file even though it is held in memory (new weights of a model
  /// whose weights are external).
  bool prefersExternal() const { return preferExternal_; }
  void setPreferExternal(bool prefer) { preferExternal_ = prefer; }
  /// The external-data reference (only meaningful when isExternal()).
  ExternalDataRef externalData() const;
  const std::string& baseDir() const;

  /// Checks that the stored data agrees with dims and type (byte count, external file bounds and path).
  /// Throws bnfold::Error with `file` and a description naming the tensor.
  void validate(const std::string& file) const;

  /// The elements as packed little-endian bytes (numeric types only). Reads external data on first use.
  std::string_view bytes() const;
  /// Every element converted to double (any numeric type).
  std::vector<double> toDoubles() const;
  /// Every element converted to int64 (integer types, and exact floating values).
  std::vector<int64_t> toInt64s() const;

  /// A typed read-only view; T must match the data type (float, double, Eigen::half, Eigen::bfloat16,
  /// int64_t, int32_t, ...). Throws otherwise.
  template <typename T>
  TensorView<T> view() const;

  /// Bytes occupied by the elements (elementCount * elementSize). Throws bnfold::Error when that does not fit
  /// in int64.
  int64_t byteSize() const;

  const onnx::TensorProto& proto() const { return *proto_; }

  // Used by the writer to lend the proto to a ModelProto for serialization without copying it.
  std::unique_ptr<onnx::TensorProto> lendProto() {
    heldRawData_ = {};
    return std::move(proto_);
  }
  void returnProto(std::unique_ptr<onnx::TensorProto> proto) {
    proto_ = std::move(proto);
    holdRawDataView();
  }
  /// Drop a cached copy of bytes that can be read again (external data, deferred raw_data).
  void releaseCachedBytes() const;
  /// The bytes the proto does not hold (raw_data left in the model file, or computed on demand), or null when
  /// the proto holds its data itself (or names external data).
  const DeferredBytes* deferredRawData() const { return deferred_.get(); }
  /// Reads deferred bytes into the proto's raw_data, so the proto alone is complete.
  void materialize();
  /// The packed bytes as a source that stays readable after this tensor changes or is gone: shares deferred
  /// bytes, opens external data, copies bytes held in the proto's typed fields. Larger raw_data moves into the
  /// source, which this tensor then reads too (deferredRawData() is no longer null); views of the bytes stay valid.
  /// Numeric types only.
  std::shared_ptr<const DeferredBytes> byteSource() const;

 private:
  /// Reads the type and element count from the proto (neither ever changes) and sets heldRawData_.
  void readProtoOnce();
  /// Points heldRawData_ at the proto's raw_data if the proto holds the bytes there, else empties it.
  void holdRawDataView();

  std::unique_ptr<onnx::TensorProto> proto_;
  // What a rule asks of every tensor it reads, kept here rather than read from the proto: in a large model the
  // proto, its dims and its raw_data string are three more cache misses per tensor.
  int64_t elementCount_ = kNoElementCount;  // of the dims; kNoElementCount when that does not fit in int64
  static constexpr int64_t kNoElementCount = -1;
  mutable std::string_view heldRawData_;  // proto_->raw_data() while the proto holds the bytes (not external/deferred)
  // A model has tens of thousands of small tensors: the folder is shared, not copied into each (null: none), and
  // the packed-bytes cache is allocated only when used.
  std::shared_ptr<const std::string> baseDir_;
  // Shared by byteSource(): a change of representation, not of value.
  mutable std::shared_ptr<const DeferredBytes> deferred_;
  bool preferExternal_ = false;
  DataType dataType_ = DataType::Undefined;  // proto_->data_type()
  // raw_data up to this size is copied by byteSource(), not moved: a short string keeps its bytes inside itself,
  // so a move would leave earlier views of them dangling.
  static constexpr std::size_t kCopiedSourceBytes = 64;
  mutable std::unique_ptr<std::string> packedBytes_;  // only for typed fields, external or deferred data
};

/// A typed read-only view over a tensor's packed bytes. Reads go through memcpy: raw_data has no alignment
/// guarantee.
template <typename T>
class TensorView {
 public:
  TensorView(std::string_view bytes, int64_t count) : data_(bytes.data()), count_(count) {}
  int64_t size() const { return count_; }
  T operator[](int64_t index) const {
    T value;
    std::memcpy(&value, data_ + index * sizeof(T), sizeof(T));
    return value;
  }
  /// Eigen map over the elements; Unaligned because the protobuf's bytes may be at any address.
  Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>, Eigen::Unaligned> map() const {
    return {reinterpret_cast<const T*>(data_), static_cast<Eigen::Index>(count_)};
  }

 private:
  const char* data_;
  int64_t count_;
};

/// The DataType a C++ element type stands for.
template <typename T>
constexpr DataType dataTypeOf();
template <> constexpr DataType dataTypeOf<float>() { return DataType::Float; }
template <> constexpr DataType dataTypeOf<double>() { return DataType::Double; }
template <> constexpr DataType dataTypeOf<Eigen::half>() { return DataType::Float16; }
template <> constexpr DataType dataTypeOf<Eigen::bfloat16>() { return DataType::BFloat16; }
template <> constexpr DataType dataTypeOf<int64_t>() { return DataType::Int64; }
template <> constexpr DataType dataTypeOf<int32_t>() { return DataType::Int32; }
template <> constexpr DataType dataTypeOf<int16_t>() { return DataType::Int16; }
template <> constexpr DataType dataTypeOf<int8_t>() { return DataType::Int8; }
template <> constexpr DataType dataTypeOf<uint8_t>() { return DataType::UInt8; }
template <> constexpr DataType dataTypeOf<uint16_t>() { return DataType::UInt16; }
template <> constexpr DataType dataTypeOf<uint32_t>() { return DataType::UInt32; }
template <> constexpr DataType dataTypeOf<uint64_t>() { return DataType::UInt64; }
template <> constexpr DataType dataTypeOf<bool>() { return DataType::Bool; }

void throwViewTypeMismatch(const Tensor& tensor, DataType requested);

template <typename T>
TensorView<T> Tensor::view() const {
  if (dataType() != dataTypeOf<T>()) throwViewTypeMismatch(*this, dataTypeOf<T>());
  return TensorView<T>(bytes(), elementCount());
}

}  // namespace bnfold
