#include "root_scan.h"

#include <utility>

namespace bnfold {

RootScan::RootScan(std::vector<Graph*> graphs, std::function<bool(const Node&)> isRoot)
    : graphs_(std::move(graphs)), isRoot_(std::move(isRoot)) {
  for (std::size_t i = 0; i < graphs_.size(); ++i) {
    graphs_[i]->numberNodes();  // a model rewritten before has nodes made since loading
    if (i > 0) indexOfGraph_.emplace(graphs_[i], i);
  }
  if (!graphs_.empty()) place_ = graphs_.front()->nodes().begin();
  skipFinishedGraphs();
}

Node* RootScan::next() {
  while (passed_.empty() && graph_ < graphs_.size()) pass();
  if (passed_.empty()) {
    yieldedGraph_ = graphs_.size();
    return nullptr;
  }
  const Root root = passed_.front();
  passed_.pop_front();
  yieldedGraph_ = root.graph;
  yieldedOrder_ = root.node->order();
  return root.node;
}

bool RootScan::willYield(const Node& node) const {
  if (node.order() == Node::kUnnumbered) return false;  // made by a rewrite
  const std::size_t graph = graphIndex(node.graph());
  if (graph == graphs_.size()) return false;  // not a graph the scan looks through
  if (graph != yieldedGraph_) return graph > yieldedGraph_;
  return static_cast<int64_t>(node.order()) > yieldedOrder_;
}

void RootScan::nodeWillChange(const Node& node) {
  // The node may be about to leave its list: the scan passes it first, so that its place stays valid.
  if (graph_ < graphs_.size() && place_->get() == &node) pass();
}

void RootScan::pass() {
  Node* node = place_->get();
  ++place_;
  if (node->order() != Node::kUnnumbered && isRoot_(*node)) passed_.push_back({node, graph_});
  skipFinishedGraphs();
}

void RootScan::skipFinishedGraphs() {
  while (graph_ < graphs_.size() && place_ == graphs_[graph_]->nodes().end())
    if (++graph_ < graphs_.size()) place_ = graphs_[graph_]->nodes().begin();
}

std::size_t RootScan::graphIndex(const Graph* graph) const {
  if (!graphs_.empty() && graph == graphs_.front()) return 0;
  auto it = indexOfGraph_.find(graph);
  return it == indexOfGraph_.end() ? graphs_.size() : it->second;
}

}  // namespace bnfold
