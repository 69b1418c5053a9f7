#pragma once
// The driver's roots, found while the rules run rather than in a pass before the first rewrite, so that the
// rules look at a root right after the scan has read it.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <unordered_map>
#include <vector>

#include "bnfold/ir/graph.h"
#include "bnfold/rewrite/rewriter.h"

namespace bnfold {

/// Yields what a pass over the graphs at the start would have listed: every node the graphs had then whose op type
/// `isRoot` accepts, graph by graph (in the order given) and in list order. It leaves out the nodes a rewrite erases
/// before the scan reaches them (they are not in the model any more) and the nodes rewrites make (they were not
/// there at the start).
///
/// It must listen to the rewriter while the rules run: the scan's place is a position in a node list, and a node
/// about to be erased there is passed first.
class RootScan : public RewriteListener {
 public:
  RootScan(std::vector<Graph*> graphs, std::function<bool(const Node&)> isRoot);

  /// The next root, or null when every one has been yielded.
  Node* next();
  /// Whether `node`, if it is a root, is still to be yielded.
  bool willYield(const Node& node) const;
  /// True once every root has been yielded.
  bool done() const { return yieldedGraph_ == graphs_.size(); }
  void nodeWillChange(const Node& node) override;

 private:
  struct Root {
    Node* node;
    std::size_t graph;
  };
  /// Passes the node at the scan's place, keeping it in `passed_` if it is a root.
  void pass();
  /// Moves the scan's place to the next graph's first node while it stands at a graph's end.
  void skipFinishedGraphs();
  std::size_t graphIndex(const Graph* graph) const;

  std::vector<Graph*> graphs_;
  std::unordered_map<const Graph*, std::size_t> indexOfGraph_;  // graphs_ after the first
  std::function<bool(const Node&)> isRoot_;
  std::size_t graph_ = 0;                          // the scan's place: graphs_[graph_] ...
  std::pmr::list<NodePtr>::const_iterator place_;  // ... at this node, not passed yet
  std::deque<Root> passed_;                        // roots passed and not yielded yet, in order
  std::size_t yieldedGraph_ = 0;                   // the last root yielded: its graph ...
  int64_t yieldedOrder_ = -1;                      // ... and Node::order (-1: none in that graph yet)
};

}  // namespace bnfold
