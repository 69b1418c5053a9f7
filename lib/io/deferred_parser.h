#pragma once
// Parses a model without copying the main graph's large raw_data payloads: each such tensor gets DeferredBytes
// pointing into the model file, or into the buffer the model is parsed from, instead. Everything else is parsed by
// protobuf as usual.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <onnx/onnx_pb.h>

#include "bnfold/ir/tensor.h"

namespace bnfold {

/// Lists of names, one per node, back to back in one buffer.
class NameLists {
 public:
  std::size_t listCount() const { return listEnds_.size(); }
  std::size_t size(std::size_t list) const { return listEnds_[list] - firstName(list); }
  /// Name `i` of list `list`; valid while this object lives.
  std::string_view at(std::size_t list, std::size_t i) const { return name(firstName(list) + i); }
  /// Names in all lists, and each of them in list order.
  std::size_t nameCount() const { return nameEnds_.size(); }
  std::string_view name(std::size_t index) const {
    const std::size_t start = index == 0 ? 0 : nameEnds_[index - 1];
    return std::string_view(bytes_).substr(start, nameEnds_[index] - start);
  }
  /// Adds a name to the list being built.
  void add(std::string_view name) {
    bytes_.append(name);
    nameEnds_.push_back(bytes_.size());
  }
  /// Closes the list being built: the next name starts the next list.
  void endList() { listEnds_.push_back(nameEnds_.size()); }

 private:
  std::size_t firstName(std::size_t list) const { return list == 0 ? 0 : listEnds_[list - 1]; }

  std::string bytes_;                  // every name, back to back
  std::vector<std::size_t> nameEnds_;  // where each name ends in bytes_
  std::vector<std::size_t> listEnds_;  // where each list's names end in nameEnds_
};

/// The input and output names of the main graph's nodes, when the parser keeps them apart from the NodeProtos.
/// Parsed into the protos, each name was a string of its own (137,000 on the graph-heavy benchmark model, most with
/// a buffer besides), freed again as soon as its node was built (an output's characters moved into its value), and
/// the rules' allocations then reused those scattered holes, long out of the CPU caches.
struct NodeNames {
  NameLists inputs;   ///< one list per node, in file order
  NameLists outputs;  ///< likewise
  std::size_t nodeCount() const { return inputs.listCount(); }
};

struct DeferredModel {
  onnx::ModelProto proto;  ///< the whole model except the main graph's initializers
  std::vector<std::unique_ptr<Tensor>> mainInitializers;  ///< in file order
  /// When asked for: the main graph's node inputs and outputs, which the nodes in `proto` then lack.
  std::optional<NodeNames> mainNodeNames;
};

/// raw_data payloads at least this large stay where they are.
constexpr uint32_t kDeferredRawDataThreshold = 4096;

/// Parses the open file `fd` (positioned at 0); with `namesApart`, the main graph's node inputs and outputs go to
/// `out.mainNodeNames`. Returns false when the bytes are not a well-formed ModelProto or use a layout this parser
/// does not handle (the caller then parses it the ordinary way).
bool parseDeferred(int fd, const std::string& path, const std::string& baseDir, bool namesApart, DeferredModel& out);
/// The same for a serialized model in memory: large raw_data stays in `bytes`, which `owner` keeps alive (when null,
/// the caller keeps `bytes` alive and unchanged until every tensor of `out` is gone).
bool parseDeferred(std::string_view bytes, const std::shared_ptr<const void>& owner, const std::string& baseDir,
                   bool namesApart, DeferredModel& out);

}  // namespace bnfold
