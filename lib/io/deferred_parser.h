#pragma once
// Parses a model file without reading the main graph's large raw_data payloads: each such tensor gets a
// FileRange pointing into the file instead. Everything else is parsed by protobuf as usual.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <onnx/onnx_pb.h>

#include "bnfold/ir/tensor.h"

namespace bnfold {

/// The input names of the main graph's nodes, when the parser keeps them apart from the NodeProtos. Parsed into the
/// protos, each name was a string of its own: 100,000 allocations for a large graph, freed again as soon as the
/// graph was built, and the rules' allocations then reused those scattered holes, long out of the CPU caches.
class NodeInputNames {
 public:
  /// Nodes, in file order.
  std::size_t nodeCount() const { return nodeEnds_.size(); }
  std::size_t inputCount(std::size_t node) const { return nodeEnds_[node] - firstInput(node); }
  /// Input `slot` of node `node` ("" for an omitted input); valid while this object lives.
  std::string_view input(std::size_t node, std::size_t slot) const {
    const std::size_t index = firstInput(node) + slot;
    const std::size_t start = index == 0 ? 0 : nameEnds_[index - 1];
    return std::string_view(bytes_).substr(start, nameEnds_[index] - start);
  }

  /// Adds the next input name of the node being read.
  void addName(std::string_view name) {
    bytes_.append(name);
    nameEnds_.push_back(bytes_.size());
  }
  /// Closes the node being read: the next name belongs to the next node.
  void endNode() { nodeEnds_.push_back(nameEnds_.size()); }

 private:
  std::size_t firstInput(std::size_t node) const { return node == 0 ? 0 : nodeEnds_[node - 1]; }

  std::string bytes_;                 // every name, back to back
  std::vector<std::size_t> nameEnds_;  // where each name ends in bytes_
  std::vector<std::size_t> nodeEnds_;  // where each node's names end in nameEnds_
};

struct DeferredModel {
  onnx::ModelProto proto;  ///< the whole model except the main graph's initializers
  std::vector<std::unique_ptr<Tensor>> mainInitializers;  ///< in file order
  /// When asked for: the main graph's node inputs, which the nodes in `proto` then lack.
  std::optional<NodeInputNames> mainNodeInputs;
};

/// raw_data payloads at least this large stay in the file.
constexpr uint32_t kDeferredRawDataThreshold = 4096;

/// Parses the open file `fd` (positioned at 0); with `inputsApart`, the main graph's node inputs go to
/// `out.mainNodeInputs`. Returns false when the bytes are not a well-formed ModelProto or use a layout this parser
/// does not handle (the caller then parses it the ordinary way).
bool parseDeferred(int fd, const std::string& path, const std::string& baseDir, bool inputsApart, DeferredModel& out);

}  // namespace bnfold
