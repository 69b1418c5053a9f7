#include "deferred_parser.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>
#include <utility>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>

namespace bnfold {
namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;
using WireFormat = google::protobuf::internal::WireFormatLite;

constexpr int kModelGraphField = 7;     // ModelProto.graph
constexpr int kGraphNodeField = 1;         // GraphProto.node
constexpr int kGraphInitializerField = 5;  // GraphProto.initializer
constexpr int kNodeInputField = 1;         // NodeProto.input
constexpr int kNodeOutputField = 2;        // NodeProto.output
constexpr int kTensorRawDataField = 9;  // TensorProto.raw_data

bool isLengthDelimited(uint32_t tag) {
  return WireFormat::GetTagWireType(tag) == WireFormat::WIRETYPE_LENGTH_DELIMITED;
}

// The tensor whose raw_data is left where it is: `length` bytes at `offset` of the input being parsed (`proto` has
// every other field).
using LeaveInPlace =
    std::function<std::unique_ptr<Tensor>(std::unique_ptr<onnx::TensorProto> proto, int64_t offset, int64_t length)>;

// raw_data left in a buffer in memory that the tensor does not own: `owner`, when not null, keeps it alive;
// without one, the buffer must outlive every tensor that reads it.
class BufferBytes final : public DeferredBytes {
 public:
  BufferBytes(std::string_view bytes, std::shared_ptr<const void> owner) : bytes_(bytes), owner_(std::move(owner)) {}
  int64_t size() const override { return static_cast<int64_t>(bytes_.size()); }
  void read(int64_t offset, int64_t length, char* out) const override {
    if (offset < 0 || length < 0 || offset + length > size())
      throw std::out_of_range("BufferBytes::read: bytes outside the range");
    std::memcpy(out, bytes_.data() + offset, static_cast<std::size_t>(length));
  }
  std::optional<std::string_view> inMemory() const override { return bytes_; }

 private:
  std::string_view bytes_;
  std::shared_ptr<const void> owner_;
};

class Parser {
 public:
  Parser(CodedInputStream& input, LeaveInPlace leaveInPlace, std::shared_ptr<const std::string> baseDir,
         int64_t inputSize)
      : in_(input), leaveInPlace_(std::move(leaveInPlace)), baseDir_(std::move(baseDir)), inputSize_(inputSize) {}

  bool parseModel(DeferredModel& out) {
    std::string shellBytes, graphBytes;
    bool sawGraph = false;
    {
      StringOutputStream shellStream(&shellBytes);
      CodedOutputStream shell(&shellStream);
      for (uint32_t tag; (tag = in_.ReadTag()) != 0;) {
        if (WireFormat::GetTagFieldNumber(tag) == kModelGraphField && isLengthDelimited(tag)) {
          // Protobuf merges repeated occurrences of a message field; leave that rare case to protobuf.
          if (sawGraph) return false;
          sawGraph = true;
          uint32_t length;
          if (!in_.ReadVarint32(&length)) return false;
          const auto limit = in_.PushLimit(static_cast<int>(length));
          if (!parseGraph(graphBytes, out.mainInitializers, out.mainNodeNames, length) || !in_.ConsumedEntireMessage())
            return false;
          in_.PopLimit(limit);
        } else if (!WireFormat::SkipField(&in_, tag, &shell)) {
          return false;
        }
      }
      if (!in_.ConsumedEntireMessage()) return false;
    }
    if (!out.proto.ParseFromString(shellBytes)) return false;
    if (sawGraph && !out.proto.mutable_graph()->ParseFromString(graphBytes)) return false;
    return true;
  }

 private:
  // Copies the graph's fields except its initializers to `graphBytes` (tag, length and bytes as they are: a
  // graph of 50,000 nodes is megabytes of them), and parses the initializers into Tensors. With `nodeNames`, the
  // nodes' input and output names go there instead of into `graphBytes`.
  bool parseGraph(std::string& graphBytes, std::vector<std::unique_ptr<Tensor>>& initializers,
                  std::optional<NodeNames>& nodeNames, uint32_t length) {
    // `length` counts the initializers too, and a corrupt input may claim any length: reserve no more than the
    // input still holds, and at most 256 MiB.
    constexpr int64_t kMaxReserve = 256 << 20;
    graphBytes.reserve(static_cast<std::size_t>(std::min({static_cast<int64_t>(length), bytesLeft(), kMaxReserve})));
    for (uint32_t tag; (tag = in_.ReadTag()) != 0;) {
      if (!isLengthDelimited(tag)) {
        StringOutputStream graphStream(&graphBytes);
        CodedOutputStream graph(&graphStream);
        if (!WireFormat::SkipField(&in_, tag, &graph)) return false;
        continue;
      }
      uint32_t fieldLength;
      if (!in_.ReadVarint32(&fieldLength)) return false;
      if (WireFormat::GetTagFieldNumber(tag) == kGraphInitializerField) {
        std::unique_ptr<Tensor> tensor;
        if (fieldLength < kDeferredRawDataThreshold) {
          if (!parseSmallTensor(tensor, fieldLength)) return false;
        } else {
          const auto limit = in_.PushLimit(static_cast<int>(fieldLength));
          if (!parseTensor(tensor) || !in_.ConsumedEntireMessage()) return false;
          in_.PopLimit(limit);
        }
        initializers.push_back(std::move(tensor));
        continue;
      }
      if (fieldLength > bytesLeft()) return false;  // truncated or corrupt; checked before allocating for it
      if (WireFormat::GetTagFieldNumber(tag) == kGraphNodeField && nodeNames) {
        if (!copyNodeWithoutNames(graphBytes, tag, fieldLength, *nodeNames)) return false;
        continue;
      }
      const std::size_t end = appendFieldHeader(graphBytes, tag, fieldLength);
      if (!in_.ReadRaw(graphBytes.data() + end, static_cast<int>(fieldLength))) return false;
    }
    return true;
  }

  // Appends the node of `length` bytes to `graphBytes` without its input and output fields, whose names go to
  // `nodeNames`.
  bool copyNodeWithoutNames(std::string& graphBytes, uint32_t tag, uint32_t length, NodeNames& nodeNames) {
    if (length > static_cast<uint32_t>(std::numeric_limits<int>::max())) return false;
    nodeBytes_.resize(length);
    if (!in_.ReadRaw(nodeBytes_.data(), static_cast<int>(length))) return false;
    // The other fields move to the front of nodeBytes_, as they are; `node` reads only what lies past them.
    CodedInputStream node(reinterpret_cast<const uint8_t*>(nodeBytes_.data()), static_cast<int>(length));
    std::size_t kept = 0;
    for (;;) {
      const auto fieldStart = static_cast<std::size_t>(node.CurrentPosition());
      const uint32_t field = node.ReadTag();
      if (field == 0) break;
      const int number = WireFormat::GetTagFieldNumber(field);
      if ((number == kNodeInputField || number == kNodeOutputField) && isLengthDelimited(field)) {
        uint32_t nameLength;
        if (!node.ReadVarint32(&nameLength)) return false;
        const auto nameStart = static_cast<std::size_t>(node.CurrentPosition());
        if (!node.Skip(static_cast<int>(nameLength))) return false;
        (number == kNodeInputField ? nodeNames.inputs : nodeNames.outputs)
            .add(std::string_view(nodeBytes_).substr(nameStart, nameLength));
        continue;
      }
      if (!WireFormat::SkipField(&node, field)) return false;
      const auto fieldEnd = static_cast<std::size_t>(node.CurrentPosition());
      std::memmove(nodeBytes_.data() + kept, nodeBytes_.data() + fieldStart, fieldEnd - fieldStart);
      kept += fieldEnd - fieldStart;
    }
    if (!node.ConsumedEntireMessage()) return false;
    nodeNames.inputs.endList();
    nodeNames.outputs.endList();
    const std::size_t end = appendFieldHeader(graphBytes, tag, static_cast<uint32_t>(kept));
    std::memcpy(graphBytes.data() + end, nodeBytes_.data(), kept);
    return true;
  }

  // Writes the tag and length of a field of `length` bytes at the end of `bytes`, and makes room for the field:
  // returns where its bytes go. In place: two appends per field were a tenth of the copy's cost.
  static std::size_t appendFieldHeader(std::string& bytes, uint32_t tag, uint32_t length) {
    constexpr std::size_t kMaxVarint32 = 5;
    const std::size_t start = bytes.size();
    bytes.resize(start + 2 * kMaxVarint32 + length);
    auto* out = reinterpret_cast<uint8_t*>(bytes.data() + start);
    out = CodedOutputStream::WriteVarint32ToArray(tag, out);
    out = CodedOutputStream::WriteVarint32ToArray(length, out);
    const auto end = static_cast<std::size_t>(reinterpret_cast<char*>(out) - bytes.data());
    bytes.resize(end + length);
    return end;
  }

  int64_t bytesLeft() const { return std::max<int64_t>(0, inputSize_ - in_.CurrentPosition()); }

  // A tensor smaller than the deferral threshold cannot hold a raw_data to defer: parsed as it is.
  bool parseSmallTensor(std::unique_ptr<Tensor>& tensor, uint32_t length) {
    std::string bytes;
    if (!in_.ReadString(&bytes, static_cast<int>(length))) return false;
    auto proto = std::make_unique<onnx::TensorProto>();
    if (!proto->ParseFromString(bytes)) return false;
    tensor = std::make_unique<Tensor>(std::move(proto), baseDir_);
    return true;
  }

  bool parseTensor(std::unique_ptr<Tensor>& tensor) {
    std::string tensorBytes;
    std::optional<std::pair<int64_t, int64_t>> rawData;  // offset and length in the input
    {
      StringOutputStream tensorStream(&tensorBytes);
      CodedOutputStream fields(&tensorStream);
      for (uint32_t tag; (tag = in_.ReadTag()) != 0;) {
        if (WireFormat::GetTagFieldNumber(tag) == kTensorRawDataField && isLengthDelimited(tag)) {
          uint32_t length;
          if (!in_.ReadVarint32(&length)) return false;
          if (length >= kDeferredRawDataThreshold) {
            const int64_t offset = in_.CurrentPosition();
            if (!in_.Skip(static_cast<int>(length))) return false;
            rawData.emplace(offset, length);
          } else {
            std::string bytes;
            if (!in_.ReadString(&bytes, static_cast<int>(length))) return false;
            WireFormat::WriteBytes(kTensorRawDataField, bytes, &fields);
            rawData.reset();  // a later raw_data replaces an earlier one
          }
        } else if (!WireFormat::SkipField(&in_, tag, &fields)) {
          return false;
        }
      }
    }
    auto proto = std::make_unique<onnx::TensorProto>();
    if (!proto->ParseFromString(tensorBytes)) return false;
    if (rawData) {
      proto->clear_raw_data();
      tensor = leaveInPlace_(std::move(proto), rawData->first, rawData->second);
    } else {
      tensor = std::make_unique<Tensor>(std::move(proto), baseDir_);
    }
    return true;
  }

  CodedInputStream& in_;
  LeaveInPlace leaveInPlace_;
  std::shared_ptr<const std::string> baseDir_;  // shared by every tensor
  int64_t inputSize_;
  std::string nodeBytes_;  // the node being copied, reused from node to node
};

std::shared_ptr<const std::string> sharedFolder(const std::string& baseDir) {
  return baseDir.empty() ? nullptr : std::make_shared<const std::string>(baseDir);
}

}  // namespace

bool parseDeferred(int fd, const std::string& path, const std::string& baseDir, bool namesApart, DeferredModel& out) {
  struct stat info {};
  if (::fstat(fd, &info) != 0) return false;
  const int ownFd = ::dup(fd);  // the tensors keep the file open for as long as they need it
  if (ownFd < 0) return false;
  auto file = std::make_shared<const SourceFile>(ownFd, path);
  google::protobuf::io::FileInputStream stream(fd, 1 << 20);
  CodedInputStream input(&stream);
  const auto sharedBaseDir = sharedFolder(baseDir);
  const LeaveInPlace inFile = [&](std::unique_ptr<onnx::TensorProto> proto, int64_t offset, int64_t length) {
    return std::make_unique<Tensor>(std::move(proto), sharedBaseDir, FileRange{file, offset, length});
  };
  Parser parser(input, inFile, sharedBaseDir, static_cast<int64_t>(info.st_size));
  if (namesApart) out.mainNodeNames.emplace();
  return parser.parseModel(out);
}

bool parseDeferred(std::string_view bytes, const std::shared_ptr<const void>& owner, const std::string& baseDir,
                   bool namesApart, DeferredModel& out) {
  if (bytes.size() > static_cast<std::size_t>(std::numeric_limits<int>::max())) return false;
  CodedInputStream input(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int>(bytes.size()));
  // A tensor's folder only locates external data, which raw_data never is.
  const LeaveInPlace inBuffer = [&](std::unique_ptr<onnx::TensorProto> proto, int64_t offset, int64_t length) {
    return std::make_unique<Tensor>(
        std::move(proto),
        std::make_shared<BufferBytes>(bytes.substr(static_cast<std::size_t>(offset), static_cast<std::size_t>(length)),
                                      owner));
  };
  Parser parser(input, inBuffer, sharedFolder(baseDir), static_cast<int64_t>(bytes.size()));
  if (namesApart) out.mainNodeNames.emplace();
  return parser.parseModel(out);
}

}  // namespace bnfold
