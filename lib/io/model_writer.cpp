// IR -> ModelProto -> file. Tensor protos are lent to the ModelProto for serialization and taken back
// afterwards, so saving neither copies tensor bytes nor changes the model. External tensors are streamed
// from their source file into one data file beside the output.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include <google/protobuf/wire_format_lite.h>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>

#include "bnfold/io/atomic_file.h"
#include "bnfold/error.h"
#include "bnfold/io/model_io.h"

namespace bnfold {
namespace fs = std::filesystem;

class ModelWriter {
 public:
  explicit ModelWriter(Model& model) : model_(model) {}
  ~ModelWriter() { takeBack(); }
  ModelWriter(const ModelWriter&) = delete;
  ModelWriter& operator=(const ModelWriter&) = delete;

  /// Fills `out` with the whole model. Tensors are lent until takeBack() (or destruction). With `streamMainNodes`
  /// the main graph's nodes are left out of `out`: streamedNodes() lists them for the caller to serialize.
  void build(onnx::ModelProto& out, bool streamMainNodes = false) {
    out = model_.shell_;
    fillGraph(*model_.graph_, *out.mutable_graph(), streamMainNodes);
  }

  /// A main-graph node to write: its shell plus its inputs and outputs, or `full` when the node had to be
  /// rebuilt as a whole proto (it holds subgraphs).
  struct StreamedNode {
    const Node* node;
    const onnx::NodeProto* full;
  };
  const std::vector<StreamedNode>& streamedNodes() const { return streamedNodes_; }

  /// Every tensor of the model (initializers and tensor attributes of every graph), in save order.
  std::vector<Tensor*> allTensors() {
    std::vector<Tensor*> tensors;
    tensors.reserve(model_.graph_->initializers_.size());
    collectTensors(*model_.graph_, tensors);
    return tensors;
  }

  /// The main graph's initializer tensors, in the order they appear in the built GraphProto.
  std::vector<Tensor*> mainInitializers() const {
    std::vector<Tensor*> tensors;
    for (Value* value : model_.graph_->initializers_) tensors.push_back(value->initializer_.get());
    return tensors;
  }

  /// Every tensor currently lent, with its proto inside the ModelProto.
  const std::vector<std::pair<Tensor*, onnx::TensorProto*>>& lentTensors() const { return lent_; }

  void takeBack() {
    for (auto& [graph, proto] : lentGraphs_) {
      const int count = proto->initializer_size();
      std::vector<onnx::TensorProto*> protos(static_cast<std::size_t>(count));
      if (count > 0) proto->mutable_initializer()->ExtractSubrange(0, count, protos.data());
      for (int i = 0; i < count; ++i)
        graph->initializers_[static_cast<std::size_t>(i)]->initializer_->returnProto(
            std::unique_ptr<onnx::TensorProto>(protos[static_cast<std::size_t>(i)]));
    }
    lentGraphs_.clear();
    for (auto& [attr, tensor] : lentAttributes_) tensor->returnProto(std::unique_ptr<onnx::TensorProto>(attr->release_t()));
    lentAttributes_.clear();
    lent_.clear();
  }

 private:
  static void fillValueInfo(const std::vector<ValueInfoEntry>& entries,
                            google::protobuf::RepeatedPtrField<onnx::ValueInfoProto>& out) {
    out.Reserve(static_cast<int>(entries.size()));
    for (const ValueInfoEntry& entry : entries) {
      if (entry.removed) continue;
      onnx::ValueInfoProto* info = out.Add();
      *info = entry.info;
      if (entry.value) info->set_name(entry.value->name());
    }
  }

  static void collectTensors(Graph& graph, std::vector<Tensor*>& out) {
    for (auto& node : graph.nodes_) {
      for (auto& slot : node->subgraphs()) collectTensors(*slot.graph, out);
      for (auto& entry : node->tensorAttributes()) out.push_back(entry.second.get());
    }
    for (Value* value : graph.initializers_) out.push_back(value->initializer_.get());
  }

  // Lends a node's tensor attributes to `np` (the node's own shell, or a copy of it) until takeBack().
  void lendTensorAttributes(Node& node, onnx::NodeProto& np) {
    for (auto& [index, tensor] : node.tensorAttributes()) {
      onnx::AttributeProto* attr = np.mutable_attribute(index);
      onnx::TensorProto* lentProto = tensor->lendProto().release();
      attr->set_allocated_t(lentProto);
      lentAttributes_.emplace_back(attr, tensor.get());
      lent_.emplace_back(tensor.get(), lentProto);
    }
  }

  // `streamNodes`: list the nodes in streamedNodes_ instead of copying them into `out` (a large graph's node
  // copies cost as much as the rest of saving). Only a node holding subgraphs is still copied.
  void fillGraph(Graph& graph, onnx::GraphProto& out, bool streamNodes = false) {
    out = graph.shell_;
    if (streamNodes) {
      streamedNodes_.reserve(graph.nodes_.size());
      for (auto& nodePtr : graph.nodes_) {
        Node& node = *nodePtr;
        if (node.subgraphs().empty()) {
          lendTensorAttributes(node, *node.proto_);
          streamedNodes_.push_back({&node, nullptr});
        } else {
          nodeCopies_.emplace_back();
          fillNode(node, nodeCopies_.back());
          streamedNodes_.push_back({&node, &nodeCopies_.back()});
        }
      }
    } else {
      out.mutable_node()->Reserve(static_cast<int>(graph.nodes_.size()));
      for (auto& nodePtr : graph.nodes_) fillNode(*nodePtr, *out.add_node());
    }
    fillGraphFields(graph, out);
  }

  void fillNode(Node& node, onnx::NodeProto& np) {
    np = *node.proto_;
    for (Value* input : node.inputs_) np.add_input(input ? input->name() : std::string());
    for (Value* output : node.outputs_) np.add_output(output ? output->name() : std::string());
    for (auto& slot : node.subgraphs()) {
      onnx::AttributeProto* attr = np.mutable_attribute(slot.attributeIndex);
      onnx::GraphProto* body = slot.graphIndex < 0 ? attr->mutable_g() : attr->add_graphs();
      fillGraph(*slot.graph, *body);
    }
    lendTensorAttributes(node, np);
  }

  void fillGraphFields(Graph& graph, onnx::GraphProto& out) {
    out.mutable_initializer()->Reserve(static_cast<int>(graph.initializers_.size()));
    for (Value* value : graph.initializers_) {
      Tensor* tensor = value->initializer_.get();
      tensor->setName(value->name());
      onnx::TensorProto* lentProto = tensor->lendProto().release();
      out.mutable_initializer()->AddAllocated(lentProto);
      lent_.emplace_back(tensor, lentProto);
    }
    lentGraphs_.emplace_back(&graph, &out);
    for (const auto& sparse : graph.sparseInitializers_) *out.add_sparse_initializer() = sparse;
    fillValueInfo(graph.inputs_, *out.mutable_input());
    fillValueInfo(graph.outputs_, *out.mutable_output());
    fillValueInfo(graph.valueInfo_, *out.mutable_value_info());
  }

  Model& model_;
  std::vector<StreamedNode> streamedNodes_;
  std::deque<onnx::NodeProto> nodeCopies_;  // stable addresses; they hold lent tensors until takeBack()
  std::vector<std::pair<Graph*, onnx::GraphProto*>> lentGraphs_;
  std::vector<std::pair<onnx::AttributeProto*, Tensor*>> lentAttributes_;
  std::vector<std::pair<Tensor*, onnx::TensorProto*>> lent_;
};

onnx::ModelProto modelToProto(Model& model) {
  onnx::ModelProto out;
  ModelWriter writer(model);
  for (Tensor* tensor : writer.allTensors()) tensor->materialize();
  writer.build(out);
  onnx::ModelProto copy = out;  // the copy owns its tensors; `out` gives the lent ones back
  return copy;
}

namespace {

constexpr int64_t kProtobufLimit = INT_MAX;
// Tensors kept inline may use this much; the rest of the model (nodes, names) needs the remainder.
constexpr int64_t kInlineBudget = kProtobufLimit - (64LL << 20);

void writeAll(int fd, const char* data, std::size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(path, std::string("cannot write: ") + std::strerror(errno));
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

// Copies `range` to the end of `fd` in the kernel (copy_file_range), falling back to a buffer where the
// kernel cannot copy between these files.
void copyFileRange(const FileRange& range, int fd, const std::string& path) {
  loff_t in = range.offset;
  int64_t remaining = range.length;
  while (remaining > 0) {
    const ssize_t n = copy_file_range(range.file->fd(), &in, fd, nullptr, static_cast<std::size_t>(remaining), 0);
    if (n > 0) {
      remaining -= n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) throw Error(range.file->path(), "the file is shorter than when it was loaded");
    break;
  }
  std::vector<char> chunk(static_cast<std::size_t>(std::min<int64_t>(remaining, 8 << 20)));
  while (remaining > 0) {
    const ssize_t n = ::pread(range.file->fd(), chunk.data(), std::min<std::size_t>(chunk.size(), remaining), in);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(range.file->path(), "the file is shorter than when it was loaded");
    writeAll(fd, chunk.data(), static_cast<std::size_t>(n), path);
    in += n;
    remaining -= n;
  }
}

// Appends deferred bytes to `fd`: file to file when they lie unchanged in a file, else computed and written a
// chunk at a time (a folded weight is never held whole).
void writeDeferred(const DeferredBytes& bytes, int fd, const std::string& path) {
  if (const FileRange* range = bytes.fileRange()) {
    copyFileRange(*range, fd, path);
    return;
  }
  if (const std::optional<std::string_view> held = bytes.inMemory()) {
    writeAll(fd, held->data(), held->size(), path);
    return;
  }
  constexpr int64_t kChunk = 1 << 20;  // a multiple of every element size
  std::unique_ptr<char[]> chunk(new char[static_cast<std::size_t>(std::min<int64_t>(kChunk, bytes.size()))]);
  for (int64_t offset = 0; offset < bytes.size(); offset += kChunk) {
    const int64_t length = std::min<int64_t>(kChunk, bytes.size() - offset);
    bytes.read(offset, length, chunk.get());
    writeAll(fd, chunk.get(), static_cast<std::size_t>(length), path);
  }
}

// Appends a tensor's bytes to the data file; external sources are copied file to file.
void appendTensorData(const Tensor& tensor, int fd, const std::string& dataPath) {
  if (const DeferredBytes* deferred = tensor.deferredRawData()) {
    writeDeferred(*deferred, fd, dataPath);
    return;
  }
  if (!tensor.isExternal()) {
    const std::string_view bytes = tensor.bytes();
    writeAll(fd, bytes.data(), bytes.size(), dataPath);
    return;
  }
  const ExternalDataRef ref = tensor.externalData();
  const fs::path source = fs::path(tensor.baseDir().empty() ? "." : tensor.baseDir()) / ref.location;
  const int sourceFd = ::open(source.c_str(), O_RDONLY | O_CLOEXEC);
  if (sourceFd < 0) throw Error(source.string(), "cannot open external data of tensor '" + tensor.name() + "'");
  auto file = std::make_shared<const SourceFile>(sourceFd, source.string());
  copyFileRange(FileRange{file, ref.offset, tensor.byteSize()}, fd, dataPath);
}

void setExternalLocation(onnx::TensorProto& proto, const std::string& location, int64_t offset, int64_t length) {
  proto.clear_raw_data();
  proto.clear_float_data();
  proto.clear_double_data();
  proto.clear_int32_data();
  proto.clear_int64_data();
  proto.clear_uint64_data();
  proto.clear_external_data();
  proto.set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [&](const char* key, const std::string& value) {
    auto* entry = proto.add_external_data();
    entry->set_key(key);
    entry->set_value(value);
  };
  add("location", location);
  add("offset", std::to_string(offset));
  add("length", std::to_string(length));
}


// Buffered writes to a file descriptor, plus file-to-file copies of byte ranges that bypass user memory. A graph of
// 50,000 nodes is written in about a million small pieces (tags, lengths, names), so appending is a bounds check and
// a copy into a fixed buffer.
class FileOutput {
 public:
  FileOutput(int fd, std::string path)
      : fd_(fd), path_(std::move(path)), buffer_(new char[kBufferSize]) {}  // not zeroed: untouched pages cost no RSS

  void append(std::string_view bytes) {
    if (bytes.empty()) return;  // an omitted input's name: its data() may be null, which memcpy must not get
    if (used_ + bytes.size() > kBufferSize) flush();
    if (bytes.size() >= kBufferSize) {
      writeAll(fd_, bytes.data(), bytes.size(), path_);
      return;
    }
    std::memcpy(buffer_.get() + used_, bytes.data(), bytes.size());
    used_ += bytes.size();
  }

  void appendVarint(uint64_t value) {
    if (used_ + kMaxVarint > kBufferSize) flush();
    auto* out = reinterpret_cast<uint8_t*>(buffer_.get() + used_);
    used_ += static_cast<std::size_t>(
        google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(value, out) - out);
  }

  void appendTag(int field) { appendVarint(static_cast<uint64_t>(field) << 3 | 2); }  // length-delimited

  /// Appends `message`, whose ByteSizeLong() was just computed (`size`), without an intermediate string.
  void appendMessage(const google::protobuf::MessageLite& message, std::size_t size) {
    if (size > kBufferSize) {
      std::string bytes;
      message.AppendToString(&bytes);
      append(bytes);
      return;
    }
    if (used_ + size > kBufferSize) flush();
    message.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(buffer_.get() + used_));
    used_ += size;
  }

  void appendDeferred(const DeferredBytes& bytes) {
    flush();
    writeDeferred(bytes, fd_, path_);
  }

  void flush() {
    writeAll(fd_, buffer_.get(), used_, path_);
    used_ = 0;
  }

 private:
  static constexpr std::size_t kBufferSize = 1 << 20;
  static constexpr std::size_t kMaxVarint = 10;
  int fd_;
  std::string path_;
  std::unique_ptr<char[]> buffer_;
  std::size_t used_ = 0;
};

// The same appends into a buffer of the exact size of the model (serializeModel's), which they fill.
class MemoryOutput {
 public:
  MemoryOutput(char* buffer, std::size_t size) : next_(buffer), end_(buffer + size) {}

  void append(std::string_view bytes) {
    if (bytes.empty()) return;  // an omitted input's name: its data() may be null, which memcpy must not get
    std::memcpy(reserve(bytes.size()), bytes.data(), bytes.size());
  }
  void appendVarint(uint64_t value) {
    uint8_t encoded[kMaxVarint];
    const auto length = static_cast<std::size_t>(
        google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(value, encoded) - encoded);
    std::memcpy(reserve(length), encoded, length);
  }
  void appendTag(int field) { appendVarint(static_cast<uint64_t>(field) << 3 | 2); }  // length-delimited
  void appendMessage(const google::protobuf::MessageLite& message, std::size_t size) {
    message.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(reserve(size)));
  }
  void appendDeferred(const DeferredBytes& bytes) {
    const auto size = static_cast<std::size_t>(bytes.size());
    char* out = reserve(size);
    if (const std::optional<std::string_view> held = bytes.inMemory()) std::memcpy(out, held->data(), size);
    else bytes.read(0, bytes.size(), out);
  }
  void flush() {
    if (next_ != end_) throw std::logic_error("MemoryOutput: the model's size was computed wrongly");
  }

 private:
  static constexpr std::size_t kMaxVarint = 10;
  char* reserve(std::size_t size) {
    if (size > static_cast<std::size_t>(end_ - next_))
      throw std::logic_error("MemoryOutput: the model's size was computed wrongly");
    char* out = next_;
    next_ += size;
    return out;
  }
  char* next_;
  char* end_;
};

std::size_t varintSize(uint64_t value) { return google::protobuf::io::CodedOutputStream::VarintSize64(value); }

// Where a field numbered `number` goes in the serialization `bytes` of a `descriptor` message: protobuf writes
// known fields by increasing number and unknown fields last.
std::size_t insertionPoint(const std::string& bytes, const google::protobuf::Descriptor* descriptor, int number) {
  google::protobuf::io::CodedInputStream input(reinterpret_cast<const uint8_t*>(bytes.data()),
                                               static_cast<int>(bytes.size()));
  for (;;) {
    const auto position = static_cast<std::size_t>(input.CurrentPosition());
    const uint32_t tag = input.ReadTag();
    if (tag == 0) return bytes.size();
    const int field = google::protobuf::internal::WireFormatLite::GetTagFieldNumber(tag);
    if (field > number || !descriptor->FindFieldByNumber(field)) return position;
    if (!google::protobuf::internal::WireFormatLite::SkipField(&input, tag)) return bytes.size();
  }
}

std::string serializeDeterministic(const google::protobuf::Message& message) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeWithCachedSizes(&coded);
  }
  return bytes;
}

std::size_t stringFieldSize(const std::string& text) { return 1 + varintSize(text.size()) + text.size(); }

// A streamed node's NodeProto size. Its shell holds every field but input (1) and output (2), which protobuf
// writes first, so the node's bytes are those two fields followed by the shell's own serialization.
std::size_t streamedNodeSize(const ModelWriter::StreamedNode& streamed) {
  if (streamed.full) return streamed.full->ByteSizeLong();
  std::size_t size = streamed.node->proto().ByteSizeLong();
  static const std::string kOmitted;
  for (const Value* input : streamed.node->inputs()) size += stringFieldSize(input ? input->name() : kOmitted);
  for (const Value* output : streamed.node->outputs()) size += stringFieldSize(output ? output->name() : kOmitted);
  return size;
}

template <typename Output>
void appendStreamedNode(const ModelWriter::StreamedNode& streamed, std::size_t size, Output& out) {
  out.appendTag(1);  // GraphProto.node
  out.appendVarint(size);
  if (streamed.full) {
    out.appendMessage(*streamed.full, size);
    return;
  }
  auto appendName = [&out](int field, const Value* value) {
    const std::string_view name = value ? std::string_view(value->name()) : std::string_view();
    out.appendTag(field);
    out.appendVarint(name.size());
    out.append(name);
  };
  for (const Value* input : streamed.node->inputs()) appendName(1, input);
  for (const Value* output : streamed.node->outputs()) appendName(2, output);
  const onnx::NodeProto& shell = streamed.node->proto();
  out.appendMessage(shell, shell.GetCachedSize());
}

// The model in the pieces it is written in: the main graph's nodes streamed from the IR (`nodes`), and the deferred
// bytes of its initializers (splicedBytes[i] for initializer i; null when its proto is complete) copied from where
// they were loaded or computed chunk by chunk. The bytes are exactly what protobuf would write for the complete
// message; the sizes are known before any is written.
class StreamedModel {
 public:
  StreamedModel(onnx::ModelProto& proto, const std::vector<ModelWriter::StreamedNode>& nodes,
                const std::vector<const DeferredBytes*>& splicedBytes)
      : proto_(proto), nodes_(nodes), splicedBytes_(splicedBytes) {
    onnx::GraphProto* graph = proto.mutable_graph();
    nodeSizes_.resize(nodes.size());
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      nodeSizes_[i] = streamedNodeSize(nodes[i]);
      nodeBytes_ += 1 + varintSize(nodeSizes_[i]) + nodeSizes_[i];
    }
    // Initializers with deferred bytes are written in three pieces; the others straight from their protos, whose
    // sizes ByteSizeLong() caches.
    for (std::size_t i = 0; i < splicedBytes.size(); ++i) {
      const onnx::TensorProto& tensor = graph->initializer(static_cast<int>(i));
      std::size_t size = tensor.ByteSizeLong();
      if (const DeferredBytes* raw = splicedBytes[i]) {
        std::string bytes = serializeDeterministic(tensor);
        const std::size_t split = insertionPoint(bytes, onnx::TensorProto::descriptor(), 9);
        const auto length = static_cast<uint64_t>(raw->size());
        size = bytes.size() + 1 + varintSize(length) + length;
        pieces_.push_back({bytes.substr(0, split), bytes.substr(split), raw, size});
      }
      initializerBytes_ += 1 + varintSize(size) + size;
    }
    // The graph without its initializers, and the model without its graph.
    google::protobuf::RepeatedPtrField<onnx::TensorProto> initializers;
    initializers.Swap(graph->mutable_initializer());
    graph->ByteSizeLong();
    graphBytes_ = serializeDeterministic(*graph);
    initializers.Swap(graph->mutable_initializer());
    onnx::GraphProto* detached = proto.release_graph();
    proto.ByteSizeLong();
    modelBytes_ = serializeDeterministic(proto);
    proto.set_allocated_graph(detached);

    graphSplit_ = insertionPoint(graphBytes_, onnx::GraphProto::descriptor(), 5);
    modelSplit_ = insertionPoint(modelBytes_, onnx::ModelProto::descriptor(), 7);
    graphSize_ = nodeBytes_ + graphBytes_.size() + initializerBytes_;
  }

  /// Protobuf cannot read a message this large back.
  bool exceedsProtobufLimit() const { return modelBytes_.size() + graphSize_ > static_cast<std::size_t>(INT_MAX); }
  std::size_t size() const { return modelBytes_.size() + 1 + varintSize(graphSize_) + graphSize_; }

  template <typename Output>
  void write(Output& out) const {
    const onnx::GraphProto& graph = proto_.graph();
    out.append(std::string_view(modelBytes_).substr(0, modelSplit_));
    out.appendTag(7);
    out.appendVarint(graphSize_);
    // node is GraphProto's field 1, so the nodes come first.
    for (std::size_t i = 0; i < nodes_.size(); ++i) appendStreamedNode(nodes_[i], nodeSizes_[i], out);
    out.append(std::string_view(graphBytes_).substr(0, graphSplit_));
    auto piece = pieces_.begin();
    for (std::size_t i = 0; i < splicedBytes_.size(); ++i) {
      out.appendTag(5);
      if (splicedBytes_[i]) {
        out.appendVarint(piece->size);
        out.append(piece->before);
        out.appendTag(9);
        out.appendVarint(static_cast<uint64_t>(piece->raw->size()));
        out.appendDeferred(*piece->raw);
        out.append(piece->after);
        ++piece;
      } else {
        const onnx::TensorProto& tensor = graph.initializer(static_cast<int>(i));
        out.appendVarint(tensor.GetCachedSize());
        out.appendMessage(tensor, static_cast<std::size_t>(tensor.GetCachedSize()));
      }
    }
    out.append(std::string_view(graphBytes_).substr(graphSplit_));
    out.append(std::string_view(modelBytes_).substr(modelSplit_));
    out.flush();
  }

 private:
  struct Piece {
    std::string before, after;  // the tensor's serialization around where raw_data goes
    const DeferredBytes* raw = nullptr;
    std::size_t size = 0;
  };
  const onnx::ModelProto& proto_;
  const std::vector<ModelWriter::StreamedNode>& nodes_;
  const std::vector<const DeferredBytes*>& splicedBytes_;
  std::vector<std::size_t> nodeSizes_;
  std::size_t nodeBytes_ = 0;
  std::vector<Piece> pieces_;
  std::size_t initializerBytes_ = 0;
  std::string graphBytes_, modelBytes_;
  std::size_t graphSplit_ = 0, modelSplit_ = 0, graphSize_ = 0;
};

// The deferred bytes to splice into each main initializer (null: the proto is complete, or the tensor goes to the
// data file, `external`). Only the main graph's initializers are spliced; any other deferred tensor that stays
// inline (a folded weight in a subgraph) is read into its proto now.
std::vector<const DeferredBytes*> splicedBytesOf(ModelWriter& writer, const std::vector<Tensor*>& inlineTensors,
                                                 const std::unordered_set<const Tensor*>& external) {
  const std::vector<Tensor*> mainInitializers = writer.mainInitializers();
  if (std::any_of(inlineTensors.begin(), inlineTensors.end(), [](const Tensor* t) { return t->deferredRawData(); })) {
    const std::unordered_set<const Tensor*> spliceable(mainInitializers.begin(), mainInitializers.end());
    for (Tensor* tensor : inlineTensors) {
      if (tensor->deferredRawData() && external.count(tensor) == 0 && spliceable.count(tensor) == 0)
        tensor->materialize();
    }
  }
  std::vector<const DeferredBytes*> splicedBytes;
  splicedBytes.reserve(mainInitializers.size());
  for (const Tensor* tensor : mainInitializers)
    splicedBytes.push_back(external.count(tensor) ? nullptr : tensor->deferredRawData());
  return splicedBytes;
}

// Bytes a tensor takes when written inline, its deferred data included.
int64_t inlineSize(const Tensor& tensor) {
  const DeferredBytes* deferred = tensor.deferredRawData();
  return static_cast<int64_t>(tensor.proto().ByteSizeLong()) + (deferred ? deferred->size() + 16 : 0);
}

}  // namespace

void saveModel(Model& model, const std::string& path, const SaveOptions& options) {
  const Destination destination = destinationOf(path);  // a folder or socket is refused before any work
  const fs::path target(path);
  const std::string dataFileName =
      options.externalDataFileName.empty() ? target.filename().string() + ".data" : options.externalDataFileName;
  const fs::path dataPath = (target.has_parent_path() ? target.parent_path() : fs::path(".")) / dataFileName;

  onnx::ModelProto proto;  // declared before the writer: it must outlive the lent tensors' return
  ModelWriter writer(model);
  // Choose what goes to the data file: everything that was external, plus the largest inline tensors when
  // the inline ones would not fit in one protobuf.
  std::vector<Tensor*> toExternal;
  std::vector<Tensor*> inlineTensors;
  int64_t inlineBytes = 0;
  const std::vector<Tensor*> tensors = writer.allTensors();
  inlineTensors.reserve(tensors.size());
  for (Tensor* tensor : tensors) {
    if (tensor->isExternal() || tensor->prefersExternal()) {
      toExternal.push_back(tensor);
    } else {
      inlineTensors.push_back(tensor);
      inlineBytes += inlineSize(*tensor);
    }
  }
  if (options.spillLargeModels && inlineBytes > kInlineBudget) {
    std::stable_sort(inlineTensors.begin(), inlineTensors.end(),
                     [](const Tensor* a, const Tensor* b) { return a->byteSize() > b->byteSize(); });
    for (Tensor* tensor : inlineTensors) {
      if (inlineBytes <= kInlineBudget) break;
      if (tensor->dataType() == DataType::String) continue;
      inlineBytes -= inlineSize(*tensor);
      toExternal.push_back(tensor);
    }
  }
  struct Placement {
    int64_t offset;
    int64_t length;
  };
  std::unordered_map<const Tensor*, Placement> placements;
  std::unique_ptr<AtomicFile> dataFile;
  if (!toExternal.empty()) {
    if (destination == Destination::SpecialFile)
      throw Error(path, "is not a regular file, and this model keeps " + std::to_string(toExternal.size()) +
                            " tensors in a data file beside the model ('" + dataFileName +
                            "'); write it to a regular file in a folder");
    dataFile = std::make_unique<AtomicFile>(dataPath.string());
    int64_t offset = 0;
    for (Tensor* tensor : toExternal) {
      appendTensorData(*tensor, dataFile->fd(), dataPath.string());
      tensor->releaseCachedBytes();
      placements[tensor] = {offset, tensor->byteSize()};
      offset += tensor->byteSize();
    }
  }

  std::unordered_set<const Tensor*> external;
  for (const auto& placed : placements) external.insert(placed.first);
  const std::vector<const DeferredBytes*> splicedBytes = splicedBytesOf(writer, inlineTensors, external);
  writer.build(proto, /*streamMainNodes=*/true);
  // Originals of the protos whose storage fields change, restored before the writer gives them back.
  std::vector<std::pair<onnx::TensorProto*, onnx::TensorProto>> saved;
  auto restore = [&]() {
    for (auto& [lentProto, original] : saved) lentProto->Swap(&original);
    saved.clear();
  };
  try {
    for (const auto& [tensor, lentProto] : writer.lentTensors()) {
      auto placement = placements.find(tensor);
      if (placement == placements.end()) continue;
      onnx::TensorProto original;
      original.Swap(lentProto);  // keep the original's storage; rebuild the lent proto's metadata from it
      saved.emplace_back(lentProto, std::move(original));
      const onnx::TensorProto& source = saved.back().second;
      lentProto->set_name(source.name());
      lentProto->set_data_type(source.data_type());
      *lentProto->mutable_dims() = source.dims();
      if (source.has_doc_string()) lentProto->set_doc_string(source.doc_string());
      setExternalLocation(*lentProto, dataFileName, placement->second.offset, placement->second.length);
    }
    const StreamedModel streamed(proto, writer.streamedNodes(), splicedBytes);
    if (streamed.exceedsProtobufLimit()) throw Error(path, "the model is larger than protobuf's 2 GiB limit");
    AtomicFile modelFile(path);
    FileOutput out(modelFile.fd(), path);
    try {
      streamed.write(out);
    } catch (const Error& e) {
      throw Error(e.file().empty() ? path : e.file(), e.problem());
    }
    restore();
    if (dataFile) dataFile->commit();
    modelFile.commit();
  } catch (...) {
    restore();
    throw;
  }
}

void serializeModel(Model& model, const std::function<char*(std::size_t)>& allocate) {
  onnx::ModelProto proto;  // declared before the writer: it must outlive the lent tensors' return
  ModelWriter writer(model);
  // Written as saveModel writes a file, external tensors left as references: deferred bytes are copied once, from
  // where they were loaded into `allocate`'s buffer.
  const std::vector<const DeferredBytes*> splicedBytes = splicedBytesOf(writer, writer.allTensors(), {});
  writer.build(proto, /*streamMainNodes=*/true);
  const StreamedModel streamed(proto, writer.streamedNodes(), splicedBytes);
  if (streamed.exceedsProtobufLimit())
    throw Error(model.path(), "the model is larger than protobuf's 2 GiB limit; write it to a file, which keeps "
                              "large tensors in external data");
  MemoryOutput out(allocate(streamed.size()), streamed.size());
  streamed.write(out);
}

}  // namespace bnfold
