#pragma once
// Brings a GraphProto's nodes into a topological order before the reader builds them. The ONNX spec says nodes
// are stored sorted, but several exporters (keras2onnx, onnxconverter-common, CNTK) and hand edits store them out
// of order, and ONNX Runtime accepts such main graphs (1.30 refuses unsorted subgraphs). The sort is stable: a node keeps its stored place whenever
// that place is valid, so an already sorted graph is left exactly as it is.

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <onnx/onnx_pb.h>

namespace bnfold {

struct NodeOrderResult {
  /// The fewest nodes that had to move to make the order topological; 0 when the stored order already was.
  std::size_t movedNodes = 0;
  /// When the graph has a cycle: its nodes (stored indices) in dependency order, starting at the lowest index;
  /// nothing was moved then.
  std::vector<int> cycle;
};

/// Sorts `graph`'s nodes if their stored order is not topological: Kahn's algorithm, always taking the ready
/// node stored first. A node depends on the nodes of this graph producing its inputs and every value its
/// subgraphs (transitively) read from outside themselves; names the subgraphs define (inputs, initializers, node
/// outputs) are local to them. `definedUpFront(name)` says whether the graph defines `name` before any node
/// runs (initializer, graph input); such names, names from enclosing graphs and names defined nowhere are no
/// dependencies (the reader reports undefined ones); it is only asked when the stored order is not topological.
/// Nodes are permuted in place, never copied.
using DefinedUpFront = std::function<bool(const std::string&)>;
NodeOrderResult sortNodesTopologically(onnx::GraphProto& graph, const DefinedUpFront& definedUpFront);

}  // namespace bnfold
