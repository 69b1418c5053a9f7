#include "bnfold/ir/graph.h"

#include <stdexcept>
#include <unordered_set>

#include "bnfold/ir/model.h"

namespace bnfold {

namespace {
// The standard ONNX domain is written "" or "ai.onnx".
bool isOnnxDomainName(const std::string& domain) { return domain.empty() || domain == "ai.onnx"; }
}  // namespace

Node::Node(Graph* graph, std::unique_ptr<onnx::NodeProto> proto)
    : proto_(proto ? std::move(proto) : std::make_unique<onnx::NodeProto>()),
      opType_(&graph->model()->internOpType(proto_->op_type())),
      graph_(graph),
      onnxDomain_(isOnnxDomainName(proto_->domain())) {}

void Node::setOpType(const std::string& type) {
  proto_->set_op_type(type);
  opType_ = &graph_->model()->internOpType(type);
}
Node::~Node() = default;

std::string describe(const Node& node) { return node.opType() + " '" + node.name() + "'"; }

const std::vector<SubgraphSlot>& Node::subgraphs() const {
  static const std::vector<SubgraphSlot> none;
  return extras_ ? extras_->subgraphs : none;
}

const Node::TensorAttributes& Node::tensorAttributes() const {
  static const TensorAttributes none;
  return extras_ ? extras_->tensorAttributes : none;
}

Node::Extras& Node::extras() {
  if (!extras_) extras_ = std::make_unique<Extras>();
  return *extras_;
}

Value::Value(Graph* graph) : graph_(graph) {}

const onnx::AttributeProto* Node::attribute(const std::string& name) const {
  for (const auto& attr : proto_->attribute())
    if (attr.name() == name) return &attr;
  return nullptr;
}

int64_t Node::attributeInt(const std::string& name, int64_t fallback) const {
  const auto* attr = attribute(name);
  return attr && attr->type() == onnx::AttributeProto::INT ? attr->i() : fallback;
}

float Node::attributeFloat(const std::string& name, float fallback) const {
  const auto* attr = attribute(name);
  return attr && attr->type() == onnx::AttributeProto::FLOAT ? attr->f() : fallback;
}

std::vector<int64_t> Node::attributeInts(const std::string& name) const {
  const auto* attr = attribute(name);
  if (!attr) return {};
  return {attr->ints().begin(), attr->ints().end()};
}

std::string Node::attributeString(const std::string& name, const std::string& fallback) const {
  const auto* attr = attribute(name);
  return attr && attr->type() == onnx::AttributeProto::STRING ? attr->s() : fallback;
}

const Tensor* Node::attributeTensor(const std::string& name) const {
  for (const auto& [index, tensor] : tensorAttributes())
    if (proto_->attribute(index).name() == name) return tensor.get();
  return nullptr;
}

namespace {
// Constant's value_float / value_floats / value_int / value_ints (opset 12+) as a tensor.
std::unique_ptr<Tensor> tensorFromConstantAttribute(const Node& node) {
  if (const auto* attr = node.attribute("value_float"))
    return std::make_unique<Tensor>(Tensor::fromDoubles(node.output(0)->name(), DataType::Float, {}, {attr->f()}));
  if (const auto* attr = node.attribute("value_floats")) {
    std::vector<double> values(attr->floats().begin(), attr->floats().end());
    return std::make_unique<Tensor>(Tensor::fromDoubles(node.output(0)->name(), DataType::Float,
                                                        {static_cast<int64_t>(values.size())}, values));
  }
  if (const auto* attr = node.attribute("value_int"))
    return std::make_unique<Tensor>(Tensor::fromInt64s(node.output(0)->name(), {}, {attr->i()}));
  if (const auto* attr = node.attribute("value_ints")) {
    std::vector<int64_t> values(attr->ints().begin(), attr->ints().end());
    return std::make_unique<Tensor>(
        Tensor::fromInt64s(node.output(0)->name(), {static_cast<int64_t>(values.size())}, values));
  }
  return nullptr;
}
}  // namespace

const Tensor* Value::constantTensor() const {
  if (initializer_) return initializer_.get();
  if (!producer_ || !producer_->isOnnxOp("Constant") || producer_->isErased()) return nullptr;
  if (const Tensor* tensor = producer_->attributeTensor("value")) return tensor;
  std::unique_ptr<Tensor>& derived = producer_->extras().derivedConstant;
  if (!derived) derived = tensorFromConstantAttribute(*producer_);
  return derived.get();
}

const onnx::TypeProto* Value::declaredType() const {
  if (valueInfoIndex_ >= 0) {
    const ValueInfoEntry& entry = graph_->valueInfo()[static_cast<std::size_t>(valueInfoIndex_)];
    if (!entry.removed && entry.info.has_type()) return &entry.info.type();
  }
  if (graphInput_)
    for (const ValueInfoEntry& entry : graph_->inputs())
      if (entry.value == this && entry.info.has_type()) return &entry.info.type();
  if (graphOutput_)
    for (const ValueInfoEntry& entry : graph_->outputs())
      if (entry.value == this && entry.info.has_type()) return &entry.info.type();
  return nullptr;
}

Graph::Graph(Model* model, Graph* parent, Node* owner)
    : model_(model),
      parent_(parent),
      owner_(owner),
#ifdef BNFOLD_HEAP_PER_OBJECT
      memory_(std::pmr::new_delete_resource()),
#else
      memory_(&arena_),
#endif
      nodes_(memory_) {
}
Graph::~Graph() = default;

std::vector<Node*> Graph::nodeList() const {
  std::vector<Node*> list;
  list.reserve(nodes_.size());
  for (const auto& node : nodes_) list.push_back(node.get());
  return list;
}

Value* Graph::findLocal(std::string_view name) const {
  Value* value = valuesByName_.find(name);
  return value && !value->retired_ ? value : nullptr;
}

Value* Graph::lookup(std::string_view name) const {
  for (const Graph* graph = this; graph; graph = graph->parent_)
    if (Value* value = graph->findLocal(name)) return value;
  return nullptr;
}

Value* Graph::newValue(std::string name, Value** replaced) {
  ValuePtr value(new (memory_->allocate(sizeof(Value), alignof(Value))) Value(this));
  value->name_ = std::move(name);
  Value* raw = value.get();
  values_.push_back(std::move(value));
  Value* previous = valuesByName_.insert(raw);
  if (replaced) *replaced = previous;
  return raw;
}

NodePtr Graph::newNode(std::unique_ptr<onnx::NodeProto> proto) {
  return NodePtr(new (memory_->allocate(sizeof(Node), alignof(Node))) Node(this, std::move(proto)));
}

void Graph::numberNodes() {
  if (everyNodeNumbered_) return;
  std::uint32_t order = 0;
  for (const auto& node : nodes_) node->order_ = order++;
  everyNodeNumbered_ = true;
}

std::vector<Graph*> Graph::nestedGraphs() const {
  std::vector<Graph*> out;
  if (nodesWithSubgraphs_ == 0) return out;
  for (const auto& node : nodes_) {
    for (const auto& slot : node->subgraphs()) {
      out.push_back(slot.graph.get());
      auto inner = slot.graph->nestedGraphs();
      out.insert(out.end(), inner.begin(), inner.end());
    }
  }
  return out;
}

namespace {
[[noreturn]] void fail(const Graph& graph, const std::string& message) {
  throw std::logic_error("graph '" + graph.name() + "': " + message);
}

std::size_t countUses(const Value* value, const Node* node, int slot) {
  std::size_t count = 0;
  for (const Use& use : value->uses())
    if (use.node == node && use.slot == slot) ++count;
  return count;
}
}  // namespace

void Graph::verify() const {
  std::unordered_set<const Value*> defined;
  // Values defined by enclosing graphs are visible; the enclosing graph's verify checks their order.
  for (const ValueInfoEntry& input : inputs_) defined.insert(input.value);
  for (const Value* init : initializers_) defined.insert(init);
  for (const auto& value : values_)
    if (value->sparseInitializer_) defined.insert(value.get());
  for (const auto& nodePtr : nodes_) {
    const Node* node = nodePtr.get();
    if (node->erased_) fail(*this, "erased node '" + node->name() + "' is still in the node list");
    if (node->graph_ != this) fail(*this, "node '" + node->name() + "' does not point back at its graph");
    for (std::size_t slot = 0; slot < node->inputs_.size(); ++slot) {
      const Value* input = node->inputs_[slot];
      if (!input) continue;
      if (countUses(input, node, static_cast<int>(slot)) != 1)
        fail(*this, "input " + std::to_string(slot) + " of node '" + node->name() + "' ('" + input->name() +
                        "') is not recorded exactly once in its use list");
      const bool local = input->graph_ == this;
      if (local && !defined.count(input))
        fail(*this, "node '" + node->name() + "' reads '" + input->name() + "' before it is defined");
      if (!local) {
        bool enclosing = false;
        for (const Graph* g = parent_; g; g = g->parent_) enclosing |= input->graph_ == g;
        if (!enclosing) fail(*this, "node '" + node->name() + "' reads '" + input->name() + "' from an unrelated graph");
      }
    }
    for (std::size_t i = 0; i < node->outputs_.size(); ++i) {
      const Value* output = node->outputs_[i];
      if (!output) continue;
      if (output->producer_ != node || output->producerOutput_ != static_cast<int>(i))
        fail(*this, "output '" + output->name() + "' of node '" + node->name() + "' names another producer");
      if (!defined.insert(output).second) fail(*this, "value '" + output->name() + "' is defined twice");
    }
    for (const auto& slot : node->subgraphs()) {
      if (slot.graph->owner_ != node || slot.graph->parent_ != this)
        fail(*this, "subgraph of node '" + node->name() + "' does not point back at it");
      slot.graph->verify();
    }
  }
  for (const auto& value : values_) {
    for (const Use& use : value->uses_) {
      if (use.node->erased_) fail(*this, "value '" + value->name() + "' lists a use by an erased node");
      if (use.node->input(static_cast<std::size_t>(use.slot)) != value.get())
        fail(*this, "value '" + value->name() + "' lists a use that node '" + use.node->name() + "' does not have");
    }
    if (value->producer_ && value->producer_->erased_)
      fail(*this, "value '" + value->name() + "' is produced by an erased node");
    if (!value->retired_ && findLocal(value->name_) != value.get())
      fail(*this, "value '" + value->name() + "' is not registered under its name");
  }
  for (const ValueInfoEntry& output : outputs_) {
    if (!output.value->graphOutput_) fail(*this, "graph output '" + output.value->name() + "' is not flagged");
    if (output.value->graph_ == this && !defined.count(output.value) && !output.value->sparseInitializer_)
      fail(*this, "graph output '" + output.value->name() + "' is never defined");
  }
}

Model::Model() : graph_(std::make_unique<Graph>(this, nullptr, nullptr)) {}
Model::~Model() = default;

int64_t Model::opsetVersion(const std::string& domain) const {
  const bool onnxDomain = isOnnxDomainName(domain);
  for (const auto& opset : shell_.opset_import()) {
    const bool match = onnxDomain ? isOnnxDomainName(opset.domain()) : opset.domain() == domain;
    if (match) return opset.version();
  }
  return -1;
}

bool NameSet::insert(std::string_view name) { return insertHash(hashOf(name)); }

bool NameSet::contains(std::string_view name) const { return size_ > 0 && slots_[slotOf(hashOf(name))] != 0; }

std::size_t NameSet::slotOf(uint64_t hash) const {
  const std::size_t mask = slots_.size() - 1;
  std::size_t i = hash & mask;
  while (slots_[i] != hash && slots_[i] != 0) i = (i + 1) & mask;
  return i;
}

bool NameSet::insertHash(uint64_t hash) {
  if (2 * (size_ + 1) > slots_.size()) reserve(size_ + 1);
  const std::size_t slot = slotOf(hash);
  if (slots_[slot] == hash) return false;
  slots_[slot] = hash;
  ++size_;
  return true;
}

void NameSet::reserve(std::size_t count) {
  std::size_t capacity = slots_.empty() ? 64 : slots_.size();
  while (capacity < 2 * count) capacity *= 2;
  if (capacity == slots_.size()) return;
  std::vector<uint64_t> old(capacity, 0);
  old.swap(slots_);
  size_ = 0;
  for (uint64_t hash : old)
    if (hash != 0) insertHash(hash);
}

namespace {
// `hint`, else the first of hint_1, hint_2, ... that `claim` takes (claim reserves a name when it is free).
template <typename Claim>
std::string reserveUnique(const std::string& hint, Claim claim) {
  if (claim(hint)) return hint;
  for (std::size_t n = 1;; ++n) {
    std::string candidate = hint + "_" + std::to_string(n);
    if (claim(candidate)) return candidate;
  }
}
}  // namespace

void Model::reserveExistingNodeNames() {
  nodeNamesReserved_ = true;
  const std::vector<Graph*> graphs = allGraphs();
  std::size_t count = 0;
  for (const Graph* graph : graphs) count += graph->nodes_.size();
  nodeNames_.reserve(count);
  for (const Graph* graph : graphs)
    for (const auto& node : graph->nodes_)
      if (!node->name().empty()) nodeNames_.insert(node->name());
  for (const auto& function : shell_.functions())
    for (const auto& node : function.node()) nodeNames_.insert(node.name());
}

void Model::reserveExistingValueNames() {
  valueNamesReserved_ = true;
  // The main graph's names stay in its own table (uniqueValueName looks there): only subgraphs' names are copied.
  const std::vector<Graph*> nested = graph_->nestedGraphs();
  std::size_t count = 0;
  for (const Graph* graph : nested) count += graph->values_.size();
  valueNames_.reserve(count);
  for (const Graph* graph : nested)
    for (const auto& value : graph->values_) valueNames_.insert(value->name());
}

std::string Model::uniqueNodeName(const std::string& hint) {
  if (!nodeNamesReserved_) reserveExistingNodeNames();
  return reserveUnique(hint, [this](const std::string& name) { return nodeNames_.insert(name); });
}

std::string Model::uniqueValueName(const std::string& hint) { return claimValueName(hint, true); }

Value* Model::newValueWithUniqueName(Graph& graph, const std::string& hint) {
  return graph.newValue(claimValueName(hint, &graph != graph_.get()));
}

std::string Model::claimValueName(const std::string& hint, bool record) {
  if (!valueNamesReserved_) reserveExistingValueNames();
  return reserveUnique(hint, [this, record](const std::string& name) {
    // A retired value's entry counts: its name stays taken.
    if (graph_->valuesByName_.find(name)) return false;
    return record ? valueNames_.insert(name) : !valueNames_.contains(name);
  });
}

std::vector<Graph*> Model::allGraphs() {
  std::vector<Graph*> graphs{graph_.get()};
  auto nested = graph_->nestedGraphs();
  graphs.insert(graphs.end(), nested.begin(), nested.end());
  return graphs;
}

}  // namespace bnfold
