#include "root_scan.h"

#include <utility>

#include "ir/prefetch.h"

namespace bnfold {

namespace {

// The rules read a root's neighbourhood: its proto and attributes, its inputs' and outputs' values, and its
// parameters' tensors and bytes. In a model larger than the caches each of those is a chain of dependent loads from
// RAM (node -> proto -> attribute list -> attribute -> name), one block after another. But the loader parses a node's
// proto with its attributes and names, and an initializer's tensor with its proto and bytes, so each lies within a
// kilobyte or so after its first line: the scan asks for those lines whole, some nodes ahead, without following their
// pointers. Two distances, because the tensors are found through the values, which must be in the cache by then.
constexpr int kValueDistance = 8;   // nodes ahead of the scan: the node's proto lines and its values
constexpr int kTensorDistance = 4;  // nodes ahead: its values' names and name-table entries, its initializer tensors
constexpr int kProtoLines = 16;     // on the benchmark's chain a Conv's proto to its last attribute's name spans 16
constexpr int kTensorLines = 8;     // and a small initializer's Tensor, TensorProto and bytes 528 bytes

void prefetchValues(const Node& node) {
  prefetchLines(&node.proto(), kProtoLines);
  for (const Value* input : node.inputs())
    if (input) prefetchLines(input, 2);  // a Value may straddle two lines
  for (const Value* output : node.outputs())
    if (output) prefetchLines(output, 2);
}

void prefetchTensors(const Node& node) {
  for (const Value* input : node.inputs()) {
    if (!input) continue;
    prefetchLines(input->name().data());
    input->graph()->prefetchNameEntry(*input);
    if (const Tensor* tensor = input->initializer()) prefetchLines(tensor, kTensorLines);
  }
  for (const Value* output : node.outputs()) {
    if (!output) continue;
    prefetchLines(output->name().data());
    output->graph()->prefetchNameEntry(*output);  // a fold's result gives its name (and entry) to its input
  }
}

}  // namespace

RootScan::RootScan(std::vector<Graph*> graphs, std::function<bool(const Node&)> isRoot, RewriteListener* next)
    : graphs_(std::move(graphs)), isRoot_(std::move(isRoot)), next_(next) {
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
  if (next_) next_->nodeWillChange(node);
  // The node may be about to leave its list: the scan passes it first, so that its place stays valid.
  if (graph_ < graphs_.size() && place_->get() == &node) pass();
}

void RootScan::nodeCreated(const Node& node) {
  if (next_) next_->nodeCreated(node);
}

void RootScan::pass() {
  Node* node = place_->get();
  ++place_;
  prefetchAhead();
  if (node->order() != Node::kUnnumbered) {
    if (node->isOnnxOp("BatchNormalization")) batchNorms_.push_back(node);
    if (isRoot_(*node)) passed_.push_back({node, graph_});
  }
  skipFinishedGraphs();
}

void RootScan::prefetchAhead() const {
  const auto end = graphs_[graph_]->nodes().end();
  auto ahead = place_;
  int distance = 1;
  for (; distance < kTensorDistance && ahead != end; ++distance) ++ahead;
  if (ahead == end) return;
  prefetchTensors(**ahead);
  for (; distance < kValueDistance && ahead != end; ++distance) ++ahead;
  if (ahead == end) return;
  prefetchValues(**ahead);
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
