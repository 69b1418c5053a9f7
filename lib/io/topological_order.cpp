#include "topological_order.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace bnfold {
namespace {

using NameSet = std::unordered_set<std::string_view>;

template <typename Visit>
void forEachSubgraph(const onnx::NodeProto& node, Visit&& visit) {
  for (const auto& attr : node.attribute()) {
    if (attr.has_g()) visit(attr.g());
    for (const auto& graph : attr.graphs()) visit(graph);
  }
}

bool hasSubgraphs(const onnx::NodeProto& node) {
  for (const auto& attr : node.attribute())
    if (attr.has_g() || attr.graphs_size() > 0) return true;
  return false;
}

// The names `graph` reads without defining them itself, including those its own subgraphs read so.
void collectOuterReads(const onnx::GraphProto& graph, NameSet& outerReads) {
  NameSet local;
  for (const auto& input : graph.input()) local.insert(input.name());
  for (const auto& init : graph.initializer()) local.insert(init.name());
  for (const auto& sparse : graph.sparse_initializer()) local.insert(sparse.values().name());
  for (const auto& node : graph.node())
    for (const auto& output : node.output()) local.insert(output);
  NameSet inner;
  for (const auto& node : graph.node()) {
    for (const auto& input : node.input())
      if (!input.empty() && !local.count(input)) outerReads.insert(input);
    forEachSubgraph(node, [&](const onnx::GraphProto& subgraph) { collectOuterReads(subgraph, inner); });
  }
  for (std::string_view name : inner)
    if (!local.count(name)) outerReads.insert(name);
}

// Calls visit(name) for every name `node` depends on: its inputs, and what its subgraphs read from outside.
template <typename Visit>
void forEachRead(const onnx::NodeProto& node, Visit&& visit) {
  for (const auto& input : node.input())
    if (!input.empty()) visit(std::string_view(input));
  if (!hasSubgraphs(node)) return;
  NameSet outerReads;
  forEachSubgraph(node, [&](const onnx::GraphProto& subgraph) { collectOuterReads(subgraph, outerReads); });
  for (std::string_view name : outerReads) visit(name);  // views into the protos: they outlive the set
}

/// A name with its hash, computed once.
struct HashedName {
  explicit HashedName(std::string_view text) : name(text), hash(std::hash<std::string_view>()(text)) {}
  std::string_view name;
  std::size_t hash;
};

// A set of names viewed in place, for the check below: open addressing over 8-byte slots (32 bits of the hash and
// an index into the names), so inserting the outputs of a 50,000-node graph allocates nothing per name and the
// table stays small; a name is compared only when its hash bits match.
class FlatNameSet {
 public:
  explicit FlatNameSet(std::size_t expected) {
    std::size_t capacity = 16;
    while (capacity < expected * 2) capacity *= 2;
    slots_.resize(capacity);
    mask_ = capacity - 1;
    names_.reserve(expected);
  }
  void insert(const HashedName& name) {
    Slot& slot = find(name);
    if (slot.index != 0) return;
    names_.push_back(name.name);
    slot = {tagOf(name.hash), static_cast<uint32_t>(names_.size())};
  }
  bool contains(const HashedName& name) const { return const_cast<FlatNameSet*>(this)->find(name).index != 0; }

 private:
  struct Slot {
    uint32_t tag = 0;
    uint32_t index = 0;  // 1 + position in names_; 0: empty
  };
  static uint32_t tagOf(std::size_t hash) { return static_cast<uint32_t>(hash >> 32); }
  // The slot holding `name`, or the empty slot where it would go.
  Slot& find(const HashedName& name) {
    const uint32_t tag = tagOf(name.hash);
    for (std::size_t i = name.hash & mask_;; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (slot.index == 0 || (slot.tag == tag && names_[slot.index - 1] == name.name)) return slot;
    }
  }
  std::vector<Slot> slots_;
  std::vector<std::string_view> names_;
  std::size_t mask_ = 0;
};

// The common case, cheaply: is every read of a name some node of this graph writes preceded by that write? A read
// not yet written when it is met is kept aside (most are initializers or graph inputs) and looked up again once
// every output is known: if some node writes it, that node comes at or after the reader. Names from enclosing
// graphs and names defined nowhere are written by no node here, so they pass. One hash per name, no copies.
bool storedOrderIsTopological(const onnx::GraphProto& graph) {
  std::size_t outputCount = 0;
  for (const auto& node : graph.node()) outputCount += static_cast<std::size_t>(node.output_size());
  FlatNameSet written(outputCount);
  std::vector<HashedName> notYetWritten;
  for (const auto& node : graph.node()) {
    forEachRead(node, [&](std::string_view name) {
      HashedName hashed(name);
      if (!written.contains(hashed)) notYetWritten.push_back(hashed);
    });
    for (const auto& output : node.output())
      if (!output.empty()) written.insert(HashedName(output));
  }
  for (const HashedName& name : notYetWritten)
    if (written.contains(name)) return false;
  return true;
}

// Length of the longest increasing subsequence: the nodes that can stay put.
std::size_t longestIncreasingRun(const std::vector<int>& order) {
  std::vector<int> tails;
  for (int index : order) {
    auto it = std::lower_bound(tails.begin(), tails.end(), index);
    if (it == tails.end()) tails.push_back(index);
    else *it = index;
  }
  return tails.size();
}

// With Kahn's algorithm stuck, every node not emitted has a predecessor not emitted; walking predecessors must
// come back to a node already seen, which lies on a cycle.
std::vector<int> findCycle(const std::vector<std::vector<int>>& predecessors, const std::vector<bool>& emitted) {
  const int n = static_cast<int>(predecessors.size());
  int current = 0;
  while (emitted[static_cast<std::size_t>(current)]) ++current;
  std::vector<int> seenAt(static_cast<std::size_t>(n), -1);
  std::vector<int> path;
  while (seenAt[static_cast<std::size_t>(current)] < 0) {
    seenAt[static_cast<std::size_t>(current)] = static_cast<int>(path.size());
    path.push_back(current);
    for (int predecessor : predecessors[static_cast<std::size_t>(current)]) {
      if (!emitted[static_cast<std::size_t>(predecessor)]) {
        current = predecessor;
        break;
      }
    }
  }
  // The path walked from readers to producers; the cycle in dependency order is its tail, reversed.
  std::vector<int> cycle(path.begin() + seenAt[static_cast<std::size_t>(current)], path.end());
  std::reverse(cycle.begin(), cycle.end());
  std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
  return cycle;
}

}  // namespace

NodeOrderResult sortNodesTopologically(onnx::GraphProto& graph, const DefinedUpFront& definedUpFront) {
  NodeOrderResult result;
  if (storedOrderIsTopological(graph)) return result;

  const int n = graph.node_size();
  std::unordered_map<std::string_view, int> producer;
  producer.reserve(static_cast<std::size_t>(n) * 2);
  for (int i = 0; i < n; ++i) {
    for (const auto& output : graph.node(i).output()) {
      // A name written twice is an error the reader reports with both nodes; do not guess an order for it.
      if (!output.empty() && !producer.emplace(output, i).second) return result;
    }
  }
  std::vector<std::vector<int>> predecessors(static_cast<std::size_t>(n));
  std::vector<std::vector<int>> successors(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    forEachRead(graph.node(i), [&](std::string_view name) {
      // A name also defined up front is an error the reader reports ("already defined"): no edge for it.
      if (definedUpFront(std::string(name))) return;
      auto it = producer.find(name);
      if (it == producer.end()) return;  // from an enclosing graph, or undefined
      predecessors[static_cast<std::size_t>(i)].push_back(it->second);
      successors[static_cast<std::size_t>(it->second)].push_back(i);
    });
  }

  std::vector<std::size_t> waitingFor(static_cast<std::size_t>(n));
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int i = 0; i < n; ++i) {
    waitingFor[static_cast<std::size_t>(i)] = predecessors[static_cast<std::size_t>(i)].size();
    if (waitingFor[static_cast<std::size_t>(i)] == 0) ready.push(i);
  }
  std::vector<int> order;
  order.reserve(static_cast<std::size_t>(n));
  std::vector<bool> emitted(static_cast<std::size_t>(n), false);
  while (!ready.empty()) {
    const int next = ready.top();
    ready.pop();
    order.push_back(next);
    emitted[static_cast<std::size_t>(next)] = true;
    for (int successor : successors[static_cast<std::size_t>(next)])
      if (--waitingFor[static_cast<std::size_t>(successor)] == 0) ready.push(successor);
  }
  if (static_cast<int>(order.size()) < n) {
    result.cycle = findCycle(predecessors, emitted);
    return result;
  }

  result.movedNodes = order.size() - longestIncreasingRun(order);
  if (result.movedNodes == 0) return result;
  // Permute the NodeProtos by pointer: no node is copied.
  auto& nodes = *graph.mutable_node();
  std::vector<onnx::NodeProto*> stored(static_cast<std::size_t>(n));
  nodes.ExtractSubrange(0, n, stored.data());
  for (int index : order) nodes.AddAllocated(stored[static_cast<std::size_t>(index)]);
  return result;
}

}  // namespace bnfold
