#pragma once
/// \file
/// The native IR: Value, Node, Graph. A Value knows its producer and every use (node + input slot), so
/// "who reads this value" is one lookup. Nodes keep the NodeProto they were loaded from (minus inputs,
/// outputs and subgraphs, which live in the IR), so attributes of every kind and unknown fields survive.
/// Only the Rewriter (bnfold/rewrite/rewriter.h) and the loader change a graph.

#include <cstdint>
#include <list>
#include <memory>
#include <memory_resource>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <onnx/onnx_pb.h>

#include "bnfold/ir/inline_vector.h"
#include "bnfold/ir/tensor.h"
#include "bnfold/ir/value_table.h"

namespace bnfold {

class Graph;
class Model;
class Node;

/// Destroys a node or value made in its graph's memory (see Graph): the memory goes back with the graph.
struct DeleteInGraph {
  template <typename T>
  void operator()(T* object) const;
};
using NodePtr = std::unique_ptr<Node, DeleteInGraph>;
using ValuePtr = std::unique_ptr<Value, DeleteInGraph>;

/// One reading of a value: node `node` reads it at input slot `slot`.
struct Use {
  Node* node;
  int slot;
  bool operator==(const Use& other) const { return node == other.node && slot == other.slot; }
};

/// Short lists held inline (see InlineVector): most values have one reader, most nodes one output and at most three
/// inputs (a Conv or Gemm with its bias).
using UseList = InlineVector<Use, 1>;
using NodeInputs = InlineVector<Value*, 3>;
using NodeOutputs = InlineVector<Value*, 1>;

class Value {
 public:
  const std::string& name() const { return name_; }
  /// The graph whose scope defines this value.
  Graph* graph() const { return graph_; }
  /// The node computing this value, or null for graph inputs and initializers.
  Node* producer() const { return producer_; }
  int producerOutputIndex() const { return producerOutput_; }
  /// Every node input reading this value, in any graph (subgraphs read outer values too).
  const UseList& uses() const { return uses_; }
  bool hasUses() const { return !uses_.empty(); }

  /// True once a rewrite removed this value. It keeps its name, which is never handed out again, but no lookup finds
  /// it any more.
  bool isRetired() const { return retired_; }

  bool isGraphInput() const { return graphInput_; }
  bool isGraphOutput() const { return graphOutput_; }
  /// The initializer tensor, or null.
  Tensor* initializer() const { return initializer_.get(); }
  bool isSparseInitializer() const { return sparseInitializer_; }

  /// The type declared for this value by its graph's value_info, inputs or outputs (in that order), or null.
  /// Constant time for value_info; graph inputs/outputs are looked up in their (short) lists.
  const onnx::TypeProto* declaredType() const;

  /// The constant tensor behind this value: an initializer, or the `value` of a Constant node. Null
  /// otherwise. Whether an initializer that is also a graph input counts as constant is the caller's
  /// policy (see Graph::constantOf).
  const Tensor* constantTensor() const;

 private:
  friend class Graph;
  friend class Rewriter;
  friend class ModelReader;
  friend class ModelWriter;
  friend class ValueTable;

  explicit Value(Graph* graph);

  std::string name_;
  Graph* graph_ = nullptr;
  Node* producer_ = nullptr;
  int producerOutput_ = -1;
  std::uint32_t tableSlot_ = UINT32_MAX;  // its slot in its graph's ValueTable when last placed there (a hint)
  UseList uses_;
  bool graphInput_ = false;
  bool graphOutput_ = false;
  bool sparseInitializer_ = false;
  bool retired_ = false;
  int valueInfoIndex_ = -1;  // this value's entry in graph_->valueInfo_, or -1
  std::unique_ptr<Tensor> initializer_;
};

/// An attribute holding a graph (If/Loop/Scan bodies) keeps it here, as IR.
struct SubgraphSlot {
  int attributeIndex;  ///< index into the NodeProto's attributes
  int graphIndex;      ///< -1 for a GRAPH attribute, else the position in a GRAPHS attribute
  std::unique_ptr<Graph> graph;
};

class Node {
 public:
  ~Node();
  /// The op type, read from the model's one copy of it (Model::internOpType), not from the NodeProto.
  const std::string& opType() const { return *opType_; }
  /// The domain as stored ("" or "ai.onnx" for standard ONNX ops).
  const std::string& domain() const { return proto_->domain(); }
  /// True for the standard ONNX domain ("" or "ai.onnx"). Known from construction, like the op type.
  bool isOnnxDomain() const { return onnxDomain_; }
  const std::string& name() const { return proto_->name(); }
  /// True for the standard ONNX op `opType` (domain "" or "ai.onnx").
  /// Inline: rules ask this of most nodes they look at, and a size check settles most answers.
  bool isOnnxOp(std::string_view type) const { return opType() == type && isOnnxDomain(); }

  /// Inputs; null stands for an omitted optional input ("").
  const NodeInputs& inputs() const { return inputs_; }
  /// Input `i`, or null when it is omitted or beyond the list.
  Value* input(std::size_t i) const { return i < inputs_.size() ? inputs_[i] : nullptr; }
  /// Outputs; null stands for an omitted optional output.
  const NodeOutputs& outputs() const { return outputs_; }
  Value* output(std::size_t i) const { return i < outputs_.size() ? outputs_[i] : nullptr; }

  Graph* graph() const { return graph_; }
  bool isErased() const { return erased_; }

  /// Increases along the graph's node list, so that two nodes' places compare without walking it. Loading numbers
  /// the nodes 0, 1, 2, ...; a node a rewrite makes is kUnnumbered until Graph::numberNodes. Nodes never move, so
  /// the numbered ones stay in increasing order.
  std::uint32_t order() const { return order_; }
  static constexpr std::uint32_t kUnnumbered = UINT32_MAX;

  /// The attribute called `name`, or null. Subgraph and tensor payloads are held elsewhere (see below).
  const onnx::AttributeProto* attribute(const std::string& name) const;
  int64_t attributeInt(const std::string& name, int64_t fallback) const;
  float attributeFloat(const std::string& name, float fallback) const;
  std::vector<int64_t> attributeInts(const std::string& name) const;
  std::string attributeString(const std::string& name, const std::string& fallback) const;
  bool hasAttribute(const std::string& name) const { return attribute(name) != nullptr; }
  /// The tensor of a TENSOR attribute (e.g. Constant's `value`), or null.
  const Tensor* attributeTensor(const std::string& name) const;

  /// Subgraphs held by this node's attributes, in attribute order.
  const std::vector<SubgraphSlot>& subgraphs() const;

  /// The NodeProto without inputs, outputs and graph/tensor payloads.
  const onnx::NodeProto& proto() const { return *proto_; }

 private:
  friend class Graph;
  friend class Rewriter;
  friend class ModelReader;
  friend class ModelWriter;

  Node(Graph* graph, std::unique_ptr<onnx::NodeProto> proto);
  /// Sets the op type in the proto and in opType_.
  void setOpType(const std::string& type);

  // What few nodes have, kept apart so that every other node is smaller (a graph may have 100,000 nodes).
  struct Extras {
    std::vector<SubgraphSlot> subgraphs;
    // TENSOR attributes: attribute index -> tensor (moved out of the proto on load, lent back on save).
    std::vector<std::pair<int, std::unique_ptr<Tensor>>> tensorAttributes;
    std::unique_ptr<Tensor> derivedConstant;  // Constant with value_float/value_ints/...
  };
  using TensorAttributes = decltype(Extras::tensorAttributes);
  const TensorAttributes& tensorAttributes() const;
  /// This node's extras, made on first use.
  Extras& extras();

  std::unique_ptr<onnx::NodeProto> proto_;  // the one parsed from the file (not a copy), or a new one; never null
  const std::string* opType_;               // proto_->op_type(), as interned by the model
  NodeInputs inputs_;
  NodeOutputs outputs_;
  Graph* graph_ = nullptr;
  std::pmr::list<NodePtr>::iterator position_;
  bool erased_ = false;
  bool onnxDomain_ = true;             // proto_'s domain is "" or "ai.onnx" (domains are set only on construction)
  std::uint32_t order_ = kUnnumbered;  // in the padding after erased_ and onnxDomain_
  std::unique_ptr<Extras> extras_;  // null for most nodes
  friend class Value;
};

/// "Conv 'conv1'": how messages name a node.
std::string describe(const Node& node);

/// A graph input, output or value_info entry: the proto (type, doc string) plus the value it describes.
struct ValueInfoEntry {
  Value* value;               ///< null when the entry names nothing in this graph (kept as it is)
  onnx::ValueInfoProto info;  // its name is refreshed from value->name() on save
  bool removed = false;       ///< its value went away; dropped when the rewriter finishes
};

class Graph {
 public:
  Graph(Model* model, Graph* parent, Node* owner);
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  const std::string& name() const { return shell_.name(); }
  Model* model() const { return model_; }
  /// The enclosing graph for a subgraph, else null.
  Graph* parent() const { return parent_; }
  /// The node owning this subgraph, else null.
  Node* ownerNode() const { return owner_; }

  /// Nodes in their stored (topological) order.
  const std::pmr::list<NodePtr>& nodes() const { return nodes_; }
  std::size_t nodeCount() const { return nodes_.size(); }
  std::vector<Node*> nodeList() const;

  const std::vector<ValueInfoEntry>& inputs() const { return inputs_; }
  const std::vector<ValueInfoEntry>& outputs() const { return outputs_; }
  const std::vector<ValueInfoEntry>& valueInfo() const { return valueInfo_; }
  /// Initializer values in their stored order.
  const std::vector<Value*>& initializers() const { return initializers_; }

  /// The value with that name defined in this graph (not its parents), or null.
  Value* findLocal(std::string_view name) const;
  /// The value visible under that name here: this graph, then enclosing graphs.
  Value* lookup(std::string_view name) const;
  /// How many values (retired ones included) the graph's name table takes before it grows. Loading leaves room
  /// for a quarter more values than the file has.
  std::size_t valueCapacity() const { return valuesByName_.capacity(); }

  /// Numbers the nodes along the list (Node::order) if a rewrite has made one since loading or the last call.
  void numberNodes();

  /// Every graph nested in this one's nodes, depth-first (not including this graph).
  std::vector<Graph*> nestedGraphs() const;

  /// Checks the invariants: use lists match node inputs, each value has at most one producer whose output
  /// it is, every input is defined before it is read (topological order), no erased node is linked.
  /// Throws std::logic_error describing the first violation.
  void verify() const;

  /// GraphProto fields the IR does not model (doc_string, quantization_annotation, unknown fields).
  const onnx::GraphProto& shell() const { return shell_; }

 private:
  friend class Rewriter;
  friend class ModelReader;
  friend class ModelWriter;
  friend class Model;  // reserveExistingNodeNames, reserveExistingValueNames

  /// A new value of this graph under `name`. Should another live value of the graph have that name, it is
  /// unregistered and returned in `replaced` (callers that cannot allow it check this instead of looking the name
  /// up first). A retired value of that name only gives up its entry.
  Value* newValue(std::string name, Value** replaced = nullptr);
  /// A new node of this graph around `proto` (a new empty one when null), not yet in its list.
  NodePtr newNode(std::unique_ptr<onnx::NodeProto> proto = nullptr);

  friend struct DeleteInGraph;
  friend class Node;
  friend class Value;

  Model* model_;
  Graph* parent_;
  Node* owner_;
  onnx::GraphProto shell_;
  // Nodes, values and the node list live in this arena, freed with the graph, instead of a heap allocation each.
  // Their input, output and use lists are InlineVectors: short ones live in the object, longer ones on the heap (in
  // the arena they cost memory, as they no longer reused what the loader frees). In a sanitizer build `memory_` is
  // the heap, so that every object is checked on its own.
  std::pmr::monotonic_buffer_resource arena_;
  std::pmr::memory_resource* memory_;
  std::pmr::list<NodePtr> nodes_;
  std::vector<ValuePtr> values_;  // every value the graph ever had, retired ones included
  // Keyed by each value's own name_; two values that swap names swap entries. A retired value keeps its entry, which
  // holds its name reserved: findLocal passes it by, and a new value of that name takes the entry over.
  ValueTable valuesByName_;
  std::size_t nodesWithSubgraphs_ = 0;  // nestedGraphs() has nothing to look for when this is 0
  bool everyNodeNumbered_ = true;       // numberNodes() has nothing to do
  std::vector<ValueInfoEntry> inputs_;
  std::vector<ValueInfoEntry> outputs_;
  std::vector<ValueInfoEntry> valueInfo_;
  std::vector<Value*> initializers_;
  std::vector<onnx::SparseTensorProto> sparseInitializers_;
  // The nodes rewrites removed (Rewriter::finish), freed with the graph rather than one object at a time: freeing
  // the nodes and values of 3,700 folds with their protos and tensors was 5% of the run, and a CLI run ends right
  // after saving without freeing anything (see cmd_fold.cpp). Retired values stay in values_. Declared last:
  // destroyed before the arena.
  std::vector<NodePtr> removedNodes_;
};

template <typename T>
void DeleteInGraph::operator()(T* object) const {
  std::pmr::memory_resource* memory = object->graph()->memory_;
  object->~T();
  memory->deallocate(object, sizeof(T), alignof(T));
}

}  // namespace bnfold
