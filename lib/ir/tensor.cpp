#include "bnfold/ir/tensor.h"
#include "ir/scale_elements.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <type_traits>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "bnfold/dims_text.h"
#include "bnfold/error.h"

namespace bnfold {
namespace fs = std::filesystem;

std::size_t elementSize(DataType type) {
  switch (type) {
    case DataType::Float: return 4;
    case DataType::UInt8: return 1;
    case DataType::Int8: return 1;
    case DataType::UInt16: return 2;
    case DataType::Int16: return 2;
    case DataType::Int32: return 4;
    case DataType::Int64: return 8;
    case DataType::Bool: return 1;
    case DataType::Float16: return 2;
    case DataType::Double: return 8;
    case DataType::UInt32: return 4;
    case DataType::UInt64: return 8;
    case DataType::Complex64: return 8;
    case DataType::Complex128: return 16;
    case DataType::BFloat16: return 2;
    default: return 0;
  }
}

std::string dataTypeName(DataType type) {
  switch (type) {
    case DataType::Float: return "float";
    case DataType::UInt8: return "uint8";
    case DataType::Int8: return "int8";
    case DataType::UInt16: return "uint16";
    case DataType::Int16: return "int16";
    case DataType::Int32: return "int32";
    case DataType::Int64: return "int64";
    case DataType::String: return "string";
    case DataType::Bool: return "bool";
    case DataType::Float16: return "float16";
    case DataType::Double: return "double";
    case DataType::UInt32: return "uint32";
    case DataType::UInt64: return "uint64";
    case DataType::Complex64: return "complex64";
    case DataType::Complex128: return "complex128";
    case DataType::BFloat16: return "bfloat16";
    default: return "type " + std::to_string(static_cast<int>(type));
  }
}

bool isFloatingPoint(DataType type) {
  return type == DataType::Float || type == DataType::Double || type == DataType::Float16 ||
         type == DataType::BFloat16;
}

bool isIntegerType(DataType type) {
  switch (type) {
    case DataType::Int8: case DataType::Int16: case DataType::Int32: case DataType::Int64:
    case DataType::UInt8: case DataType::UInt16: case DataType::UInt32: case DataType::UInt64:
    case DataType::Bool:
      return true;
    default:
      return false;
  }
}

void throwViewTypeMismatch(const Tensor& tensor, DataType requested) {
  throw std::invalid_argument("tensor '" + tensor.name() + "' holds " + dataTypeName(tensor.dataType()) +
                              ", not " + dataTypeName(requested));
}

SourceFile::~SourceFile() {
  if (fd_ >= 0) ::close(fd_);
}

Tensor::Tensor(std::unique_ptr<onnx::TensorProto> proto, std::string baseDir)
    : proto_(std::move(proto)),
      baseDir_(baseDir.empty() ? nullptr : std::make_shared<const std::string>(std::move(baseDir))) {
  readProtoOnce();
}

Tensor::Tensor(std::unique_ptr<onnx::TensorProto> proto, std::shared_ptr<const std::string> baseDir)
    : proto_(std::move(proto)), baseDir_(std::move(baseDir)) {
  readProtoOnce();
}

Tensor::Tensor(std::unique_ptr<onnx::TensorProto> proto, std::shared_ptr<const std::string> baseDir,
               FileRange rawData)
    : proto_(std::move(proto)),
      baseDir_(std::move(baseDir)),
      deferred_(std::make_shared<FileBytes>(std::move(rawData))) {
  readProtoOnce();
}

Tensor::Tensor(std::unique_ptr<onnx::TensorProto> proto, std::shared_ptr<const DeferredBytes> bytes)
    : proto_(std::move(proto)), deferred_(std::move(bytes)) {
  readProtoOnce();
}

void Tensor::readProtoOnce() {
  dataType_ = static_cast<DataType>(proto_->data_type());
  elementCount_ = checkedElementCount(proto_->dims()).value_or(kNoElementCount);
  holdRawDataView();
}

void Tensor::holdRawDataView() {
  const bool held = proto_ && proto_->has_raw_data() && !deferred_ && !isExternal();
  heldRawData_ = held ? std::string_view(proto_->raw_data()) : std::string_view();
}

Tensor Tensor::deferred(std::string name, DataType type, std::vector<int64_t> dims,
                        std::shared_ptr<const DeferredBytes> bytes) {
  auto proto = std::make_unique<onnx::TensorProto>();
  proto->set_name(std::move(name));
  proto->set_data_type(static_cast<int32_t>(type));
  for (int64_t dim : dims) proto->add_dims(dim);
  return Tensor(std::move(proto), std::move(bytes));
}

void FileBytes::read(int64_t offset, int64_t length, char* out) const {
  if (offset < 0 || length < 0 || offset + length > range_.length)
    throw std::out_of_range("FileBytes::read: bytes outside the range");
  int64_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(range_.file->fd(), out + done, static_cast<std::size_t>(length - done),
                              static_cast<off_t>(range_.offset + offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw Error(range_.file->path(), std::string("cannot read tensor data: ") +
                                           (n < 0 ? std::strerror(errno) : "the file is shorter than it was"));
    done += n;
  }
}

namespace {
/// Packed bytes held in memory, shared by the tensors computed from them.
class MemoryBytes final : public DeferredBytes {
 public:
  explicit MemoryBytes(std::string bytes) : bytes_(std::move(bytes)) {}
  int64_t size() const override { return static_cast<int64_t>(bytes_.size()); }
  void read(int64_t offset, int64_t length, char* out) const override {
    if (offset < 0 || length < 0 || offset + length > size())
      throw std::out_of_range("MemoryBytes::read: bytes outside the range");
    std::memcpy(out, bytes_.data() + offset, static_cast<std::size_t>(length));
  }
  std::optional<std::string_view> inMemory() const override { return std::string_view(bytes_); }

 private:
  std::string bytes_;
};

/// Reads all of `bytes` into a string without first zero-filling it twice over.
std::string readAll(const DeferredBytes& bytes) {
  std::string out;
  out.resize(static_cast<std::size_t>(bytes.size()));
  bytes.read(0, bytes.size(), out.data());
  return out;
}
}  // namespace

void Tensor::materialize() {
  if (!deferred_) return;
  std::string bytes;
  if (packedBytes_) bytes.swap(*packedBytes_);
  else bytes = readAll(*deferred_);
  proto_->set_raw_data(std::move(bytes));
  deferred_.reset();
  holdRawDataView();
  releaseCachedBytes();
}

std::shared_ptr<const DeferredBytes> Tensor::byteSource() const {
  if (deferred_) return deferred_;
  if (isExternal()) {
    const ExternalDataRef ref = externalData();
    const fs::path path = fs::path(baseDir().empty() ? "." : baseDir()) / ref.location;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(path.string(), "cannot open external data of tensor '" + name() + "'");
    auto file = std::make_shared<const SourceFile>(fd, path.string());
    return std::make_shared<FileBytes>(FileRange{std::move(file), ref.offset, byteSize()});
  }
  if (proto_->has_raw_data() && proto_->raw_data().size() > kCopiedSourceBytes) {
    // Hand the bytes over instead of copying them: the folded weight that reads them usually replaces this tensor,
    // whose bytes would otherwise be held twice. The buffer moves with the string, so views of it stay valid.
    auto shared = std::make_shared<MemoryBytes>(std::move(*proto_->mutable_raw_data()));
    proto_->clear_raw_data();
    deferred_ = shared;
    heldRawData_ = {};
    return shared;
  }
  return std::make_shared<MemoryBytes>(std::string(bytes()));
}

namespace {

// An external-data offset or length: decimal digits that fit in int64.
std::optional<int64_t> parseExternalNumber(const std::string& text) {
  if (text.empty() || !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace

int64_t Tensor::elementCount() const {
  if (elementCount_ == kNoElementCount)
    throw Error("", "tensor '" + name() + "' has dims " + formatDims(proto_->dims(), ", ") +
                        " whose element count does not fit in 64 bits");
  return elementCount_;
}

int64_t Tensor::byteSize() const {
  const std::optional<int64_t> size = checkedProduct(elementCount(), static_cast<int64_t>(elementSize(dataType())));
  if (!size) throw Error("", "tensor '" + name() + "' has dims " + formatDims(proto_->dims(), ", ") +
                                 " whose size in bytes does not fit in 64 bits");
  return *size;
}

bool Tensor::isExternal() const { return proto_->data_location() == onnx::TensorProto::EXTERNAL; }

ExternalDataRef Tensor::externalData() const {
  ExternalDataRef ref;
  for (const auto& entry : proto_->external_data()) {
    if (entry.key() == "location") ref.location = entry.value();
    else if (entry.key() == "offset") ref.offset = parseExternalNumber(entry.value()).value_or(ref.offset);
    else if (entry.key() == "length") ref.length = parseExternalNumber(entry.value()).value_or(ref.length);
  }
  return ref;
}

namespace {

// Elements stored in a typed repeated field, counted in that field's units.
int64_t typedFieldCount(const onnx::TensorProto& proto, DataType type) {
  switch (type) {
    case DataType::Float:
    case DataType::Complex64: return proto.float_data_size();
    case DataType::Double:
    case DataType::Complex128: return proto.double_data_size();
    case DataType::Int64: return proto.int64_data_size();
    case DataType::UInt32:
    case DataType::UInt64: return proto.uint64_data_size();
    case DataType::String: return proto.string_data_size();
    default: return proto.int32_data_size();
  }
}

int64_t typedFieldUnitsPerElement(DataType type) {
  return (type == DataType::Complex64 || type == DataType::Complex128) ? 2 : 1;
}

// True when `inner` lies inside `folder` (both canonical).
bool isInsideFolder(const fs::path& inner, const fs::path& folder) {
  auto folderIt = folder.begin();
  auto innerIt = inner.begin();
  for (; folderIt != folder.end(); ++folderIt, ++innerIt) {
    if (innerIt == inner.end() || *innerIt != *folderIt) return false;
  }
  return true;
}

}  // namespace

void Tensor::validate(const std::string& file) const {
  // Only an error needs the text: a model of 30,000 tensors would build it 30,000 times.
  const auto what = [this] { return "tensor '" + name() + "'"; };
  for (int64_t dim : proto_->dims())
    if (dim < 0) throw Error(file, what() + " has a negative dimension " + std::to_string(dim));
  const DataType type = dataType();
  if (type == DataType::Undefined) throw Error(file, what() + " has no data type");
  const std::optional<int64_t> checkedCount = checkedElementCount(proto_->dims());
  if (!checkedCount)
    throw Error(file, what() + " has dims " + formatDims(proto_->dims(), ", ") + " whose element count does not fit in 64 bits");
  const int64_t count = *checkedCount;
  if (!checkedProduct(count, static_cast<int64_t>(elementSize(type))))
    throw Error(file, what() + " has dims " + formatDims(proto_->dims(), ", ") + " whose size in bytes does not fit in 64 bits");
  if (isExternal()) {
    // External data stands in for raw_data, which ONNX forbids for strings.
    if (type == DataType::String) throw Error(file, what() + " is a string tensor stored as external data");
    ExternalDataRef ref;
    for (const auto& entry : proto_->external_data()) {
      if ((entry.key() == "offset" || entry.key() == "length") && !parseExternalNumber(entry.value()))
        throw Error(file, what() + " has external data " + entry.key() + " '" + entry.value() +
                              "' that is not a number of bytes that fits in 64 bits");
    }
    ref = externalData();
    if (ref.location.empty()) throw Error(file, what() + " is stored externally but names no location");
    const fs::path location(ref.location);
    if (location.is_absolute())
      throw Error(file, what() + " has external data at an absolute path '" + ref.location +
                            "'; only paths inside the model's folder are allowed");
    for (const auto& part : location)
      if (part == "..")
        throw Error(file, what() + " has external data path '" + ref.location + "' that leaves the model's folder");
    std::error_code ec;
    const fs::path folder = fs::weakly_canonical(fs::path(baseDir().empty() ? "." : baseDir()), ec);
    const fs::path dataPath = fs::path(baseDir().empty() ? "." : baseDir()) / location;
    if (!fs::exists(dataPath, ec))
      throw Error(file, what() + " has external data file '" + ref.location + "' that does not exist");
    const fs::path resolved = fs::canonical(dataPath, ec);
    if (ec || !isInsideFolder(resolved, folder))
      throw Error(file, what() + " has external data file '" + ref.location +
                            "' that resolves outside the model's folder");
    if (!fs::is_regular_file(resolved, ec))
      throw Error(file, what() + " has external data '" + ref.location + "' that is not a regular file");
    const auto fileSize = static_cast<int64_t>(fs::file_size(resolved, ec));
    const int64_t expected = byteSize();
    const int64_t available = fileSize - ref.offset;
    const int64_t length = ref.length >= 0 ? ref.length : available;
    if (ref.offset < 0 || ref.offset > fileSize || length > available)
      throw Error(file, what() + " reads " + std::to_string(length) + " bytes from offset " + std::to_string(ref.offset) +
                            " of '" + ref.location + "', which has only " + std::to_string(fileSize) + " bytes");
    if (length != expected)
      throw Error(file, what() + " has " + std::to_string(length) + " bytes of external data but its dims and type (" +
                            dataTypeName(type) + ") need " + std::to_string(expected));
    return;
  }
  if (proto_->has_raw_data() || deferred_) {
    if (type == DataType::String) throw Error(file, what() + " is a string tensor with raw_data");
    const auto have = deferred_ ? deferred_->size() : static_cast<int64_t>(proto_->raw_data().size());
    if (have != byteSize())
      throw Error(file, what() + " has " + std::to_string(have) + " bytes of raw_data but its dims and type (" +
                            dataTypeName(type) + ") need " + std::to_string(byteSize()));
    return;
  }
  const int64_t have = typedFieldCount(*proto_, type);
  const int64_t need = count * typedFieldUnitsPerElement(type);  // fits: the byte size (>= 8 per complex) does
  if (have != need)
    throw Error(file, what() + " holds " + std::to_string(have) + " values but its dims need " + std::to_string(need));
}

std::string_view Tensor::bytes() const {
  const DataType type = dataType();
  if (type == DataType::String) throw std::invalid_argument("tensor '" + name() + "' holds strings, not numbers");
  if (!heldRawData_.empty()) return heldRawData_;
  if (!isExternal() && !deferred_) {
    if (proto_->has_raw_data()) return proto_->raw_data();
    // Typed fields whose in-memory layout is already the packed element layout: read in place.
    const auto asView = [](const auto& field) {
      return std::string_view(reinterpret_cast<const char*>(field.data()), field.size() * sizeof(field.Get(0)));
    };
    switch (type) {
      case DataType::Float:
      case DataType::Complex64:
        if (proto_->float_data_size() > 0) return asView(proto_->float_data());
        return {};
      case DataType::Double:
      case DataType::Complex128:
        if (proto_->double_data_size() > 0) return asView(proto_->double_data());
        return {};
      case DataType::Int64:
        if (proto_->int64_data_size() > 0) return asView(proto_->int64_data());
        return {};
      case DataType::Int32:
        if (proto_->int32_data_size() > 0) return asView(proto_->int32_data());
        return {};
      case DataType::UInt64:
        if (proto_->uint64_data_size() > 0) return asView(proto_->uint64_data());
        return {};
      default: break;
    }
  }
  if (packedBytes_) return *packedBytes_;
  if (deferred_)
    if (const std::optional<std::string_view> held = deferred_->inMemory()) return *held;
  const int64_t count = elementCount();
  const std::size_t size = elementSize(type);
  std::string packed;
  if (deferred_) {
    packed = readAll(*deferred_);
  } else if (isExternal()) {
    const ExternalDataRef ref = externalData();
    const fs::path path = fs::path(baseDir().empty() ? "." : baseDir()) / ref.location;
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(path.string(), "cannot open external data of tensor '" + name() + "'");
    packed.resize(static_cast<std::size_t>(count) * size);
    in.seekg(ref.offset);
    in.read(packed.data(), static_cast<std::streamsize>(packed.size()));
    if (in.gcount() != static_cast<std::streamsize>(packed.size()))
      throw Error(path.string(), "external data of tensor '" + name() + "' is shorter than its dims need");
  } else {
    // Narrow types kept one per int32 (int8/16, uint8/16, bool, float16/bfloat16 bit patterns), uint32 in
    // uint64_data: pack them.
    packed.resize(static_cast<std::size_t>(count) * size);
    for (int64_t i = 0; i < count; ++i) {
      uint64_t bits = type == DataType::UInt32 ? proto_->uint64_data(static_cast<int>(i))
                                               : static_cast<uint64_t>(proto_->int32_data(static_cast<int>(i)));
      std::memcpy(packed.data() + i * size, &bits, size);  // little-endian host
    }
  }
  packedBytes_ = std::make_unique<std::string>(std::move(packed));
  return *packedBytes_;
}

void Tensor::releaseCachedBytes() const { packedBytes_.reset(); }

const std::string& Tensor::baseDir() const {
  static const std::string none;
  return baseDir_ ? *baseDir_ : none;
}

namespace {
template <typename T, typename Out>
void convertAll(std::string_view bytes, int64_t count, std::vector<Out>& out) {
  TensorView<T> view(bytes, count);
  out.resize(static_cast<std::size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[static_cast<std::size_t>(i)] = static_cast<Out>(view[i]);
}

template <typename Out>
std::vector<Out> convertTensor(const Tensor& tensor) {
  std::vector<Out> out;
  const int64_t count = tensor.elementCount();
  const std::string_view bytes = tensor.bytes();
  switch (tensor.dataType()) {
    case DataType::Float: convertAll<float>(bytes, count, out); break;
    case DataType::Double: convertAll<double>(bytes, count, out); break;
    case DataType::Float16: {
      TensorView<Eigen::half> view(bytes, count);
      out.resize(static_cast<std::size_t>(count));
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<Out>(static_cast<float>(view[i]));
      break;
    }
    case DataType::BFloat16: {
      TensorView<Eigen::bfloat16> view(bytes, count);
      out.resize(static_cast<std::size_t>(count));
      for (int64_t i = 0; i < count; ++i) out[i] = static_cast<Out>(static_cast<float>(view[i]));
      break;
    }
    case DataType::Int64: convertAll<int64_t>(bytes, count, out); break;
    case DataType::Int32: convertAll<int32_t>(bytes, count, out); break;
    case DataType::Int16: convertAll<int16_t>(bytes, count, out); break;
    case DataType::Int8: convertAll<int8_t>(bytes, count, out); break;
    case DataType::UInt8: convertAll<uint8_t>(bytes, count, out); break;
    case DataType::UInt16: convertAll<uint16_t>(bytes, count, out); break;
    case DataType::UInt32: convertAll<uint32_t>(bytes, count, out); break;
    case DataType::UInt64: convertAll<uint64_t>(bytes, count, out); break;
    case DataType::Bool: convertAll<uint8_t>(bytes, count, out); break;
    default:
      throw std::invalid_argument("tensor '" + tensor.name() + "' of type " + dataTypeName(tensor.dataType()) +
                                  " cannot be read as numbers");
  }
  return out;
}
}  // namespace

std::vector<double> Tensor::toDoubles() const { return convertTensor<double>(*this); }
std::vector<int64_t> Tensor::toInt64s() const { return convertTensor<int64_t>(*this); }

namespace {
// The float nearest `value` rounding toward zero, with its last bit set when that was inexact.
float roundToOddFloat(double value) {
  float rounded = static_cast<float>(value);
  if (static_cast<double>(rounded) == value || !std::isfinite(rounded)) return rounded;
  if (std::fabs(static_cast<double>(rounded)) > std::fabs(value)) rounded = std::nextafter(rounded, 0.0f);
  uint32_t bits;
  std::memcpy(&bits, &rounded, sizeof(bits));
  bits |= 1u;
  std::memcpy(&rounded, &bits, sizeof(bits));
  return rounded;
}
template <typename T>
double asDouble(T value) {
  if constexpr (std::is_same_v<T, Eigen::half> || std::is_same_v<T, Eigen::bfloat16>) {
    return static_cast<float>(value);
  } else {
    return static_cast<double>(value);
  }
}

/// scale(i, v) gives element i's value v scaled, in double.
template <typename T, typename Scale, typename Round>
void scaleTyped(char* bytes, int64_t count, Scale scale, Round round) {
  for (int64_t i = 0; i < count; ++i) {
    T value;
    std::memcpy(&value, bytes + i * sizeof(T), sizeof(T));
    const T scaled = round(scale(i, asDouble(value)));
    std::memcpy(bytes + i * sizeof(T), &scaled, sizeof(T));
  }
}

template <typename Scale>
void scaleElements(DataType type, char* bytes, int64_t count, Scale scale) {
  switch (type) {
    case DataType::Float:
      scaleTyped<float>(bytes, count, scale, [](double v) { return static_cast<float>(v); });
      break;
    case DataType::Double: scaleTyped<double>(bytes, count, scale, [](double v) { return v; }); break;
    case DataType::Float16:
      scaleTyped<Eigen::half>(bytes, count, scale,
                              [](double v) { return Eigen::half(roundToOddFloat(v)); });
      break;
    case DataType::BFloat16:
      scaleTyped<Eigen::bfloat16>(bytes, count, scale,
                                  [](double v) { return Eigen::bfloat16(roundToOddFloat(v)); });
      break;
    default:
      throw std::invalid_argument("scaleElementsInPlace: " + dataTypeName(type) + " is not a floating-point type");
  }
}
}  // namespace

void scaleElementsInPlace(DataType type, char* bytes, int64_t count, double factor) {
  scaleElements(type, bytes, count, [factor](int64_t, double v) { return v * factor; });
}

void scaleElementsInPlace(DataType type, char* bytes, int64_t count, const double* factors) {
  scaleElements(type, bytes, count, [factors](int64_t i, double v) { return v * factors[i]; });
}

void scaleElementsInPlace(DataType type, char* bytes, int64_t count, const double* first, const double* second) {
  scaleElements(type, bytes, count, [first, second](int64_t i, double v) { return v * first[i] * second[i]; });
}

Tensor Tensor::fromDoubles(std::string name, DataType type, std::vector<int64_t> dims,
                           const std::vector<double>& values) {
  auto proto = std::make_unique<onnx::TensorProto>();
  proto->set_name(std::move(name));
  proto->set_data_type(static_cast<int32_t>(type));
  for (int64_t dim : dims) proto->add_dims(dim);
  std::string& raw = *proto->mutable_raw_data();
  const std::size_t size = elementSize(type);
  raw.resize(values.size() * size);
  char* out = raw.data();
  // Half and bfloat16 go through float rounded to odd: with at least two extra bits, rounding to odd and
  // then to nearest equals one direct rounding to nearest (plain double -> float -> half can double-round).
  for (std::size_t i = 0; i < values.size(); ++i) {
    switch (type) {
      case DataType::Float: {
        float v = static_cast<float>(values[i]);
        std::memcpy(out + i * size, &v, size);
        break;
      }
      case DataType::Double: std::memcpy(out + i * size, &values[i], size); break;
      case DataType::Float16: {
        Eigen::half v(roundToOddFloat(values[i]));
        std::memcpy(out + i * size, &v, size);
        break;
      }
      case DataType::BFloat16: {
        Eigen::bfloat16 v(roundToOddFloat(values[i]));
        std::memcpy(out + i * size, &v, size);
        break;
      }
      default:
        throw std::invalid_argument("fromDoubles: " + dataTypeName(type) + " is not a floating-point type");
    }
  }
  return Tensor(std::move(proto));
}

Tensor Tensor::fromInt64s(std::string name, std::vector<int64_t> dims, const std::vector<int64_t>& values) {
  auto proto = std::make_unique<onnx::TensorProto>();
  proto->set_name(std::move(name));
  proto->set_data_type(static_cast<int32_t>(DataType::Int64));
  for (int64_t dim : dims) proto->add_dims(dim);
  proto->mutable_raw_data()->assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t));
  return Tensor(std::move(proto));
}

}  // namespace bnfold
