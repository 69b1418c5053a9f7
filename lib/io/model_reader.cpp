// ModelProto -> IR. Tensors are moved out of the proto (no byte copies); every other field stays in the
// shells kept by Model, Graph and Node, so what the IR does not model survives untouched.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>

#include "bnfold/error.h"
#include "bnfold/io/borrowed_model.h"
#include "bnfold/io/model_io.h"
#include "deferred_parser.h"
#include "message_depth.h"
#include "topological_order.h"

namespace bnfold {
namespace fs = std::filesystem;

// How the reader gets each graph's nodes into a topological order (see topological_order.h).
enum class StoredOrder {
  // Check the stored order before building, and sort when it is not topological.
  kCheck,
  // Build in the stored order at once: the check is a pass over every name, which most models, stored sorted, do
  // not need. When a main-graph node reads a name not defined yet, the nodes not built yet are sorted there, and
  // the build goes on under kCheck. Anything else the order would decide fails the build: a subgraph node reading
  // a name not defined yet, a subgraph node output shadowing an outer name (whether a reader means the outer or
  // the inner value depends on the order), and every error; the caller then builds again under kCheck.
  kTrust,
};

// Thrown under StoredOrder::kTrust when the stored order cannot be trusted to mean what sorting would.
struct StoredOrderNotTrusted {};

class ModelReader {
 public:
  ModelReader(Model& model, std::string file, const LoadOptions& options, StoredOrder order = StoredOrder::kCheck)
      : model_(model), file_(std::move(file)), options_(options), order_(order) {}

  /// `mainInitializers`: the main graph's initializers when they were parsed apart from `proto`; `mainNodeNames`:
  /// likewise the input and output names of its nodes, which are read apart only under StoredOrder::kTrust.
  void read(onnx::ModelProto&& proto, const std::string& baseDir,
            std::vector<std::unique_ptr<Tensor>> mainInitializers = {},
            const NodeNames* mainNodeNames = nullptr) {
    mainNodeNames_ = mainNodeNames;
    model_.path_ = file_;
    model_.baseDir_ = baseDir;
    sharedBaseDir_ = baseDir.empty() ? nullptr : std::make_shared<const std::string>(baseDir);
    model_.shell_.Swap(&proto);
    if (!model_.shell_.has_graph()) throw Error(file_, "not an ONNX model: it has no graph");
    std::unique_ptr<onnx::GraphProto> graph(model_.shell_.release_graph());
    if (options_.nameUnnamedNodes && hasUnnamedNode(*graph)) {
      // The names given to unnamed nodes while the graph is built must not clash with names met later: reserve
      // every name first. Otherwise the model reserves them on its first request for a new name.
      model_.nodeNamesReserved_ = model_.valueNamesReserved_ = true;
      model_.nodeNames_.reserve(static_cast<std::size_t>(graph->node_size()));
      model_.valueNames_.reserve(mainInitializers.size() + static_cast<std::size_t>(graph->initializer_size()) +
                                 static_cast<std::size_t>(graph->input_size() + graph->node_size()));
      for (const auto& tensor : mainInitializers) model_.valueNames_.insert(tensor->name());
      reserveNames(*graph);
      if (mainNodeNames)
        for (std::size_t i = 0; i < mainNodeNames->outputs.nameCount(); ++i)
          model_.valueNames_.insert(mainNodeNames->outputs.name(i));
      for (const auto& function : model_.shell_.functions())
        for (const auto& node : function.node()) model_.nodeNames_.insert(node.name());
    }
    pinTrainingInfoNames();
    buildGraph(*model_.graph_, *graph, std::move(mainInitializers));
  }

 private:
  static bool hasUnnamedNode(const onnx::GraphProto& graph) {
    for (const auto& node : graph.node()) {
      if (node.name().empty()) return true;
      for (const auto& attr : node.attribute()) {
        if (attr.has_g() && hasUnnamedNode(attr.g())) return true;
        for (const auto& g : attr.graphs())
          if (hasUnnamedNode(g)) return true;
      }
    }
    return false;
  }

  void reserveNames(const onnx::GraphProto& graph) {
    for (const auto& init : graph.initializer()) model_.valueNames_.insert(init.name());
    for (const auto& input : graph.input()) model_.valueNames_.insert(input.name());
    for (const auto& node : graph.node()) {
      if (!node.name().empty()) model_.nodeNames_.insert(node.name());
      for (const auto& output : node.output()) model_.valueNames_.insert(output);
      for (const auto& attr : node.attribute()) {
        if (attr.has_g()) reserveNames(attr.g());
        for (const auto& g : attr.graphs()) reserveNames(g);
      }
    }
  }

  // training_info graphs read main-graph initializers by name; those must never be removed.
  void pinTrainingInfoNames() {
    for (const auto& info : model_.shell_.training_info()) {
      for (const auto* graph : {&info.initialization(), &info.algorithm()}) pinNamesReadBy(*graph);
      for (const auto& binding : info.initialization_binding()) model_.pinnedNames_.insert(binding.key());
      for (const auto& binding : info.update_binding()) model_.pinnedNames_.insert(binding.key());
    }
  }

  void pinNamesReadBy(const onnx::GraphProto& graph) {
    for (const auto& node : graph.node()) {
      for (const auto& input : node.input()) model_.pinnedNames_.insert(input);
      for (const auto& attr : node.attribute()) {
        if (attr.has_g()) pinNamesReadBy(attr.g());
        for (const auto& g : attr.graphs()) pinNamesReadBy(g);
      }
    }
    for (const auto& output : graph.output()) model_.pinnedNames_.insert(output.name());
  }

  std::string graphLabel(const Graph& graph) const {
    return graph.parent() ? "subgraph '" + graph.name() + "' of node '" + graph.ownerNode()->name() + "'"
                          : "graph '" + graph.name() + "'";
  }

  void buildGraph(Graph& graph, onnx::GraphProto& proto, std::vector<std::unique_ptr<Tensor>> tensors = {}) {
    graph.shell_.set_name(proto.name());  // for error messages while the graph is built
    std::size_t valueCount = tensors.size() + static_cast<std::size_t>(proto.initializer_size() + proto.input_size());
    for (const auto& node : proto.node()) valueCount += static_cast<std::size_t>(node.output_size());
    const NodeNames* namesApart = graph.parent() ? nullptr : mainNodeNames_;  // the main graph's, in stored order
    if (namesApart) valueCount += namesApart->outputs.nameCount();
    // No rehashing while a large graph is built, nor while the rules add to it: each fold adds up to two values
    // (its weight and bias) and the values it removes keep their entries, so a quarter more is room for a model
    // whose every fifth node is a folded BatchNormalization. Rehashed during the rules, the table of a 100,000-value
    // graph was read and written again once it had left the CPU caches.
    graph.valuesByName_.reserve(valueCount + valueCount / 4);
    const int initCount = proto.initializer_size();
    std::vector<onnx::TensorProto*> inits(static_cast<std::size_t>(initCount));
    if (initCount > 0) proto.mutable_initializer()->ExtractSubrange(0, initCount, inits.data());
    for (onnx::TensorProto* raw : inits)
      tensors.push_back(std::make_unique<Tensor>(std::unique_ptr<onnx::TensorProto>(raw), sharedBaseDir_));
    // Room for the folds' new weights and biases, appended before finish() drops what they replace: a fold adds at
    // most two initializers for the four (or more) its BatchNormalization reads. Grown during the rules, the list
    // was copied after it had left the CPU caches.
    graph.initializers_.reserve(tensors.size() + tensors.size() / 2);
    for (auto& tensor : tensors) {
      if (tensor->name().empty()) throw Error(file_, graphLabel(graph) + " has an initializer without a name");
      tensor->validate(file_);
      if (tensor->isExternal()) model_.usesExternalData_ = true;
      Value* defined = nullptr;
      Value* value = graph.newValue(tensor->name(), &defined);
      if (defined) throw Error(file_, graphLabel(graph) + " defines initializer '" + tensor->name() + "' twice");
      value->initializer_ = std::move(tensor);
      graph.initializers_.push_back(value);
    }
    for (auto& sparse : *proto.mutable_sparse_initializer()) {
      const std::string& name = sparse.values().name();
      Value* value = graph.findLocal(name) ? graph.findLocal(name) : graph.newValue(name);
      value->sparseInitializer_ = true;
      graph.sparseInitializers_.emplace_back();
      graph.sparseInitializers_.back().Swap(&sparse);
    }
    proto.clear_sparse_initializer();
    for (auto& input : *proto.mutable_input()) {
      Value* value = graph.findLocal(input.name());
      if (!value) value = graph.newValue(input.name());
      value->graphInput_ = true;
      graph.inputs_.push_back({value, {}});
      graph.inputs_.back().info.Swap(&input);
    }
    proto.clear_input();

    sortNodes(graph, proto);
    // Each node keeps the NodeProto parsed for it, taken out of the graph's list (no copy, no second shell).
    std::vector<std::unique_ptr<onnx::NodeProto>> nodeProtos;
    takeNodes(proto, nodeProtos);
    // kTrust does not sort: names kept apart are in the order of the nodes.
    if (namesApart && (order_ != StoredOrder::kTrust || namesApart->nodeCount() != nodeProtos.size()))
      throw StoredOrderNotTrusted();  // not how the parser and the reader are used together: parse the usual way
    for (std::size_t i = 0; i < nodeProtos.size(); ++i) {
      if (buildNode(graph, nodeProtos[i], namesApart, i)) continue;
      // Node i reads a name not defined yet: sort the nodes not built, as sorting the whole graph would have.
      // The nodes built so far read only what came before them, so a stable sort keeps them where they are.
      // Sorting reads the protos' names: the ones kept apart go back in first.
      if (namesApart) {
        for (std::size_t j = i; j < nodeProtos.size(); ++j) {
          for (std::size_t slot = 0; slot < namesApart->inputs.size(j); ++slot)
            nodeProtos[j]->add_input(std::string(namesApart->inputs.at(j, slot)));
          for (std::size_t slot = 0; slot < namesApart->outputs.size(j); ++slot)
            nodeProtos[j]->add_output(std::string(namesApart->outputs.at(j, slot)));
        }
        namesApart = nullptr;
      }
      order_ = StoredOrder::kCheck;
      for (std::size_t j = i; j < nodeProtos.size(); ++j) proto.mutable_node()->AddAllocated(nodeProtos[j].release());
      nodeProtos.resize(i);
      sortNodes(graph, proto);
      takeNodes(proto, nodeProtos);
      --i;  // build the node now at position i
    }

    for (auto& output : *proto.mutable_output()) {
      Value* value = graph.lookup(output.name());
      if (!value) throw Error(file_, graphLabel(graph) + " has output '" + output.name() + "' that nothing defines");
      value->graphOutput_ = true;
      graph.outputs_.push_back({value, {}});
      graph.outputs_.back().info.Swap(&output);
    }
    proto.clear_output();
    for (auto& info : *proto.mutable_value_info()) {
      // value_info may describe names that do not exist here, or repeat one: keep those as they are, unlinked.
      Value* value = graph.findLocal(info.name());
      if (value && value->valueInfoIndex_ >= 0) value = nullptr;
      if (value) value->valueInfoIndex_ = static_cast<int>(graph.valueInfo_.size());
      graph.valueInfo_.push_back({value, {}});
      graph.valueInfo_.back().info.Swap(&info);
    }
    proto.clear_value_info();
    graph.shell_.Swap(&proto);
  }

  // Exporters that store nodes out of order are common and ONNX Runtime accepts them: sort before building.
  void sortNodes(Graph& graph, onnx::GraphProto& proto) {
    if (order_ == StoredOrder::kTrust) return;
    const NodeOrderResult order =
        sortNodesTopologically(proto, [&graph](const std::string& name) { return graph.findLocal(name) != nullptr; });
    if (!order.cycle.empty()) {
      constexpr std::size_t kShown = 8;  // one line, however long the cycle
      std::string path;
      for (std::size_t i = 0; i < order.cycle.size() && i < kShown; ++i)
        path += nodeNameOrOutput(proto.node(order.cycle[i])) + " -> ";
      if (order.cycle.size() > kShown) path += "... (" + std::to_string(order.cycle.size()) + " nodes) -> ";
      path += nodeNameOrOutput(proto.node(order.cycle.front()));
      const onnx::NodeProto& first = proto.node(order.cycle.front());
      throw Error(file_, graphLabel(graph) + " has a cycle through node '" + nodeNameOrOutput(first) + "' (" +
                             first.op_type() + "): " + path);
    }
    if (order.movedNodes > 0) {
      const bool subgraph = graph.parent() != nullptr;
      model_.reorderedGraphs_.push_back(
          {proto.name(), subgraph, subgraph ? graph.ownerNode()->name() : std::string(), order.movedNodes});
    }
  }

  // Unnamed nodes get their names only when built, after sorting: name them by their first output until then.
  static std::string nodeNameOrOutput(const onnx::NodeProto& node) {
    if (!node.name().empty()) return node.name();
    for (const auto& output : node.output())
      if (!output.empty()) return "<unnamed, writes " + output + ">";
    return "<unnamed>";
  }

  // Moves `graph`'s nodes, in order, to the end of `nodes`, leaving its node list empty.
  static void takeNodes(onnx::GraphProto& graph, std::vector<std::unique_ptr<onnx::NodeProto>>& nodes) {
    std::vector<onnx::NodeProto*> taken(static_cast<std::size_t>(graph.node_size()));
    if (!taken.empty()) graph.mutable_node()->ExtractSubrange(0, graph.node_size(), taken.data());
    nodes.reserve(nodes.size() + taken.size());
    for (onnx::NodeProto* node : taken) nodes.emplace_back(node);
  }

  // clear() would keep the strings allocated for reuse, for as long as the node lives.
  static void freeStrings(google::protobuf::RepeatedPtrField<std::string>& strings) {
    google::protobuf::RepeatedPtrField<std::string>().Swap(&strings);
  }

  // Builds the node, taking its proto; or, in the main graph under StoredOrder::kTrust, returns false when it reads
  // a name not defined yet, leaving everything (the proto, the model's names) as it was. Its input names are in
  // the proto, or node `index` of `namesApart`; so are its output names.
  bool buildNode(Graph& graph, std::unique_ptr<onnx::NodeProto>& nodeProto, const NodeNames* namesApart,
                 std::size_t index) {
    const std::size_t inputCount =
        namesApart ? namesApart->inputs.size(index) : static_cast<std::size_t>(nodeProto->input_size());
    NodeInputs inputs;
    inputs.reserve(inputCount);
    std::string undefinedInput;  // for the error
    for (std::size_t slot = 0; slot < inputCount; ++slot) {
      const std::string_view name =
          namesApart ? namesApart->inputs.at(index, slot) : std::string_view(nodeProto->input(static_cast<int>(slot)));
      Value* value = name.empty() ? nullptr : graph.lookup(name);
      if (!value && !name.empty()) {
        if (order_ == StoredOrder::kTrust && !graph.parent()) return false;
        undefinedInput = name;
        break;
      }
      inputs.push_back(value);
    }
    NodePtr owned = graph.newNode(std::move(nodeProto));
    Node* node = owned.get();
    onnx::NodeProto& np = *node->proto_;
    if (np.name().empty() && options_.nameUnnamedNodes) {
      np.set_name(model_.uniqueNodeName(np.op_type() + "_" + std::to_string(unnamedCounter_[np.op_type()]++)));
    }
    auto label = [&np] { return "node '" + np.name() + "' (" + np.op_type() + ")"; };  // for errors only
    if (!undefinedInput.empty())
      throw Error(file_, label() + " in " + graphLabel(graph) + " reads '" + undefinedInput +
                             "', which no node, initializer or graph input defines");
    for (std::size_t slot = 0; slot < inputs.size(); ++slot)
      if (inputs[slot]) inputs[slot]->uses_.push_back({node, static_cast<int>(slot)});
    node->inputs_ = std::move(inputs);
    const std::size_t outputCount =
        namesApart ? namesApart->outputs.size(index) : static_cast<std::size_t>(np.output_size());
    node->outputs_.reserve(outputCount);
    freeStrings(*np.mutable_input());
    // Subgraphs and tensors move out of the attributes; subgraphs see the values defined so far.
    for (int a = 0; a < np.attribute_size(); ++a) {
      onnx::AttributeProto& attr = *np.mutable_attribute(a);
      if (attr.has_g()) {
        std::unique_ptr<onnx::GraphProto> body(attr.release_g());
        node->extras().subgraphs.push_back({a, -1, std::make_unique<Graph>(&model_, &graph, node)});
        buildGraph(*node->subgraphs().back().graph, *body);
      }
      const int graphCount = attr.graphs_size();
      if (graphCount > 0) {
        std::vector<onnx::GraphProto*> bodies(static_cast<std::size_t>(graphCount));
        attr.mutable_graphs()->ExtractSubrange(0, graphCount, bodies.data());
        for (int j = 0; j < graphCount; ++j) {
          std::unique_ptr<onnx::GraphProto> body(bodies[static_cast<std::size_t>(j)]);
          node->extras().subgraphs.push_back({a, j, std::make_unique<Graph>(&model_, &graph, node)});
          buildGraph(*node->subgraphs().back().graph, *body);
        }
      }
      if (attr.has_t()) {
        auto tensor = std::make_unique<Tensor>(std::unique_ptr<onnx::TensorProto>(attr.release_t()), sharedBaseDir_);
        tensor->validate(file_);
        node->extras().tensorAttributes.emplace_back(a, std::move(tensor));
      }
    }
    for (std::size_t i = 0; i < outputCount; ++i) {
      const std::string_view name =
          namesApart ? namesApart->outputs.at(index, i) : std::string_view(np.output(static_cast<int>(i)));
      if (name.empty()) {
        node->outputs_.push_back(nullptr);
        continue;
      }
      if (order_ == StoredOrder::kTrust && graph.parent() && graph.parent()->lookup(name))
        throw StoredOrderNotTrusted();
      Value* existing = nullptr;
      // From the proto, the name's bytes move rather than being copied.
      Value* value = graph.newValue(namesApart ? std::string(name) : std::move(*np.mutable_output(static_cast<int>(i))),
                                    &existing);
      if (existing)
        throw Error(file_, label() + " writes '" + value->name() + "', which is already defined" +
                               (existing->producer() ? " by node '" + existing->producer()->name() + "'" : ""));
      value->producer_ = node;
      value->producerOutput_ = static_cast<int>(i);
      node->outputs_.push_back(value);
    }
    freeStrings(*np.mutable_output());
    if (!node->subgraphs().empty()) ++graph.nodesWithSubgraphs_;
    node->order_ = static_cast<std::uint32_t>(graph.nodes_.size());  // appended in list order
    node->position_ = graph.nodes_.insert(graph.nodes_.end(), std::move(owned));
    return true;
  }

  Model& model_;
  std::string file_;
  std::shared_ptr<const std::string> sharedBaseDir_;  // Model::baseDir_, shared by every tensor
  LoadOptions options_;
  StoredOrder order_;
  const NodeNames* mainNodeNames_ = nullptr;
  std::unordered_map<std::string, int> unnamedCounter_;
};

namespace {

// Every error of loading is about the model read: the public loaders throw it as InvalidModelError.
template <typename Load>
std::unique_ptr<Model> loadingInvalidModel(Load&& load) {
  try {
    return load();
  } catch (const InvalidModelError&) {
    throw;
  } catch (const Error& e) {
    throw InvalidModelError(e.file(), e.problem());
  }
}

}  // namespace

std::unique_ptr<Model> modelFromProto(onnx::ModelProto&& proto, const std::string& sourceName,
                                      const std::string& baseDir, const LoadOptions& options) {
  return loadingInvalidModel([&] {
    auto model = std::make_unique<Model>();
    ModelReader(*model, sourceName, options).read(std::move(proto), baseDir);
    return model;
  });
}

namespace {

// Builds the model from a parse that can be repeated: first in the stored order, with the main graph's node
// inputs and outputs kept apart from their protos, and only when that fails (see kTrust) from a second parse with
// the order checked, which sorts or reports exactly as it always did.
template <typename Parse>
std::unique_ptr<Model> buildTrustingStoredOrder(const Parse& parse, const std::string& sourceName,
                                                const std::string& baseDir, const LoadOptions& options) {
  auto build = [&](DeferredModel deferred, StoredOrder order) {
    auto model = std::make_unique<Model>();
    ModelReader(*model, sourceName, options, order)
        .read(std::move(deferred.proto), baseDir, std::move(deferred.mainInitializers),
              deferred.mainNodeNames ? &*deferred.mainNodeNames : nullptr);
    return model;
  };
  try {
    return build(parse(/*namesApart=*/true), StoredOrder::kTrust);
  } catch (const Error&) {
  } catch (const StoredOrderNotTrusted&) {
  }
  return build(parse(/*namesApart=*/false), StoredOrder::kCheck);
}

// Loads a serialized model in memory; large raw_data stays in `bytes` (kept alive by `owner`, or by the caller).
std::unique_ptr<Model> modelFromMemory(std::string_view bytes, const std::shared_ptr<const void>& owner,
                                       const std::string& sourceName, const std::string& baseDir,
                                       const LoadOptions& options) {
  if (bytes.empty()) throw InvalidModelError(sourceName, "the model is empty (no bytes)");
  if (bytes.size() > static_cast<std::size_t>(INT_MAX))
    throw InvalidModelError(sourceName, "is larger than protobuf's 2 GiB limit; keep its tensors in external data "
                                        "and pass a path");
  auto parse = [&](bool namesApart) {
    DeferredModel deferred;
    if (parseDeferred(bytes, owner, baseDir, namesApart, deferred)) return deferred;
    deferred = DeferredModel();  // a layout the deferred parser leaves to protobuf
    if (!deferred.proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
      throw InvalidModelError(sourceName,
                              "not a valid ONNX model: the protobuf cannot be parsed (corrupt or truncated bytes)");
    return deferred;
  };
  return loadingInvalidModel([&] { return buildTrustingStoredOrder(parse, sourceName, baseDir, options); });
}

}  // namespace

std::unique_ptr<Model> modelFromBytes(std::string_view bytes, const std::string& sourceName, const std::string& baseDir,
                                      const LoadOptions& options) {
  // One copy the model owns, for the tensors that stay in it; the bytes of the small ones are parsed out of it.
  auto copy = std::make_shared<const std::string>(bytes);
  return modelFromMemory(*copy, copy, sourceName, baseDir, options);
}

std::unique_ptr<Model> modelFromBorrowedBytes(std::string_view bytes, const std::string& sourceName,
                                              const std::string& baseDir, const LoadOptions& options) {
  return modelFromMemory(bytes, nullptr, sourceName, baseDir, options);
}

namespace {

// Parses the model file open as `fd` from its start. Large raw_data stays in the file until a rule reads it; the
// writer copies it file to file.
// `namesApart`: the main graph's node inputs and outputs kept apart (see NodeNames), when the deferred parser reads it.
DeferredModel parseModelFile(int fd, bool regular, const std::string& path, const std::string& baseDir,
                             bool namesApart) {
  DeferredModel deferred;
  bool parsed = regular && ::lseek(fd, 0, SEEK_SET) == 0 && parseDeferred(fd, path, baseDir, namesApart, deferred);
  if (!parsed && !regular) {
    google::protobuf::io::FileInputStream input(fd, 1 << 20);
    parsed = deferred.proto.ParseFromZeroCopyStream(&input);
  } else if (!parsed) {
    deferred = DeferredModel();
    parsed = ::lseek(fd, 0, SEEK_SET) == 0;
    if (parsed) {
      google::protobuf::io::FileInputStream input(fd, 1 << 20);
      parsed = deferred.proto.ParseFromZeroCopyStream(&input);
    }
  }
  if (!parsed && regular) {
    const std::optional<int> depth = modelMessageDepth(fd);
    if (depth && *depth > kMaxMessageDepth)
      throw Error(path, "nests messages " + std::to_string(*depth) + " levels deep (subgraphs inside subgraphs); " +
                            "protobuf's limit, which bnfold keeps, is " + std::to_string(kMaxMessageDepth));
  }
  if (!parsed) throw Error(path, "not a valid ONNX model: the protobuf cannot be parsed (corrupt or truncated file)");
  return deferred;
}

struct FileCloser {
  int fd;
  ~FileCloser() { ::close(fd); }
};

}  // namespace

namespace {

std::unique_ptr<Model> loadModelFile(const std::string& path, const LoadOptions& options) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(path, "no such file");
  if (fs::is_directory(path, ec)) throw Error(path, "is a folder, not a model file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(path, std::string("cannot open: ") + std::strerror(errno));
  const FileCloser closer{fd};
  struct stat info {};
  fstat(fd, &info);
  // A pipe or device (`bnfold fold /dev/stdin`) is read as a stream; only a regular file can be read lazily.
  const bool regular = S_ISREG(info.st_mode);
  if (regular && info.st_size == 0) throw Error(path, "the file is empty");
  const fs::path modelPath(path);
  const std::string baseDir = modelPath.has_parent_path() ? modelPath.parent_path().string() : ".";

  // A regular file can be parsed again; a stream is read once, so its order is checked first.
  if (regular) {
    auto parse = [&](bool namesApart) { return parseModelFile(fd, regular, path, baseDir, namesApart); };
    return buildTrustingStoredOrder(parse, path, baseDir, options);
  }
  DeferredModel deferred = parseModelFile(fd, regular, path, baseDir, false);
  auto model = std::make_unique<Model>();
  ModelReader(*model, path, options, StoredOrder::kCheck)
      .read(std::move(deferred.proto), baseDir, std::move(deferred.mainInitializers));
  return model;
}

}  // namespace

std::unique_ptr<Model> loadModel(const std::string& path, const LoadOptions& options) {
  return loadingInvalidModel([&] { return loadModelFile(path, options); });
}

}  // namespace bnfold
