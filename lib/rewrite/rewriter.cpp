#include "bnfold/rewrite/rewriter.h"

#include <algorithm>
#include <iterator>
#include <memory_resource>
#include <stdexcept>
#include <unordered_set>

#include "bnfold/rewrite/pre_activation_statistics.h"
#include "bnfold/rewrite/rule.h"
#include "constant_eval.h"

namespace bnfold {

Rewriter::Rewriter(Model& model, Report& report)
    : model_(model),
      report_(report),
      ownStatistics_(std::make_unique<PreActivationStatistics>()),
      statistics_(ownStatistics_.get()) {
  addListener(statistics_);
}

void Rewriter::useStatistics(PreActivationStatistics& statistics) {
  removeListener(statistics_);
  statistics_ = &statistics;
  addListener(statistics_);
}
Rewriter::~Rewriter() { finish(); }

void Rewriter::addListener(RewriteListener* listener) { listeners_.push_back(listener); }

void Rewriter::removeListener(RewriteListener* listener) {
  listeners_.erase(std::remove(listeners_.begin(), listeners_.end(), listener), listeners_.end());
}

void Rewriter::notifyCreated(const Node& node) {
  ++model_.changeCount_;
  for (RewriteListener* listener : listeners_) listener->nodeCreated(node);
}

void Rewriter::notifyWillChange(const Node* node) {
  if (!node) return;
  ++model_.changeCount_;
  for (RewriteListener* listener : listeners_) listener->nodeWillChange(*node);
}

void Rewriter::notifyChanged(const Node* node) {
  if (!node || node->erased_) return;
  for (RewriteListener* listener : listeners_) listener->nodeChanged(*node);
}

void Rewriter::notifyErased(const Node& node) {
  for (RewriteListener* listener : listeners_) listener->nodeErased(node);
}

void Rewriter::assume(const LowerBoundAssumption& assumption) {
  for (RewriteListener* listener : listeners_) listener->assumptionMade(assumption);
}

void Rewriter::apply(const Rule& rule, MatchResult& result) {
  beginRule(&rule);
  statistics_->beginRewrite();
  // The match read these constants as tensors it holds; they become initializers before the rewrite reads them.
  for (EvaluatedConstant& evaluated : result.evaluatedConstants())
    materializeConstant(evaluated.value, std::move(evaluated.tensor), evaluated.nodes);
  result.evaluatedConstants().clear();
  rule.rewrite(result.match(), *this);
  statistics_->endRewrite();
}

Value* Rewriter::addInitializer(const Graph& constGraph, Tensor tensor, const std::string& nameHint) {
  // IR version 3 wants every initializer among its own graph's inputs, which a subgraph cannot take (an If branch
  // has none, a Loop or Scan body's are fixed): there the tensor goes to the main graph, which subgraphs read.
  auto& graph = model_.irVersion() < 4 ? model_.graph() : const_cast<Graph&>(constGraph);
  Value* value = model_.newValueWithUniqueName(graph, nameHint);
  tensor.setName(value->name());
  attachInitializer(graph, value, std::make_unique<Tensor>(std::move(tensor)));
  return value;
}

void Rewriter::attachInitializer(Graph& graph, Value* value, std::unique_ptr<Tensor> tensor) {
  // A model that keeps its weights in external data gets its new weights there too (as onnx does, from 1 KiB).
  if (model_.usesExternalData() && tensor->byteSize() >= 1024) tensor->setPreferExternal(true);
  value->initializer_ = std::move(tensor);
  graph.initializers_.push_back(value);
  markDirty(graph);  // finish() lists it among the graph inputs in IR version 3
  ++model_.changeCount_;
}

Node* Rewriter::createNode(const Node* anchor, const std::string& opType, const std::vector<const Value*>& inputs,
                           const std::vector<std::string>& outputNameHints, const std::string& nameHint,
                           std::vector<onnx::AttributeProto> attributes) {
  Graph& graph = *anchor->graph_;
  NodePtr owned = graph.newNode();
  Node* node = owned.get();
  node->setOpType(opType);
  node->proto_->set_name(model_.uniqueNodeName(nameHint));
  for (auto& attribute : attributes) *node->proto_->add_attribute() = std::move(attribute);
  for (std::size_t slot = 0; slot < inputs.size(); ++slot) {
    auto* value = const_cast<Value*>(inputs[slot]);
    node->inputs_.push_back(value);
    if (value) value->uses_.push_back({node, static_cast<int>(slot)});
  }
  for (std::size_t i = 0; i < outputNameHints.size(); ++i) {
    Value* value = model_.newValueWithUniqueName(graph, outputNameHints[i]);
    value->producer_ = node;
    value->producerOutput_ = static_cast<int>(i);
    node->outputs_.push_back(value);
  }
  node->position_ = graph.nodes_.insert(anchor->position_, std::move(owned));
  graph.everyNodeNumbered_ = false;  // the new node is kUnnumbered
  notifyCreated(*node);
  return node;
}

void Rewriter::setInput(const Node* constNode, int slot, const Value* constValue) {
  auto* node = const_cast<Node*>(constNode);
  auto* value = const_cast<Value*>(constValue);
  const auto index = static_cast<std::size_t>(slot);
  if (node->inputs_.size() <= index) node->inputs_.resize(index + 1, nullptr);
  Value* old = node->inputs_[index];
  if (old == value) return;
  notifyWillChange(node);
  node->inputs_[index] = value;
  if (value) value->uses_.push_back({node, slot});
  // Trailing omitted inputs are dropped so the node stays in canonical form.
  while (!node->inputs_.empty() && node->inputs_.back() == nullptr) node->inputs_.pop_back();
  notifyChanged(node);
  if (old) removeUse(old, node, slot);
}

void Rewriter::setAttribute(const Node* constNode, onnx::AttributeProto attribute) {
  auto* node = const_cast<Node*>(constNode);
  notifyWillChange(node);
  for (auto& existing : *node->proto_->mutable_attribute()) {
    if (existing.name() == attribute.name()) {
      existing = std::move(attribute);
      notifyChanged(node);
      return;
    }
  }
  *node->proto_->add_attribute() = std::move(attribute);
  notifyChanged(node);
}

void Rewriter::removeAttribute(const Node* constNode, const std::string& name) {
  auto* node = const_cast<Node*>(constNode);
  auto* attrs = node->proto_->mutable_attribute();
  for (int i = 0; i < attrs->size(); ++i) {
    if (attrs->Get(i).name() != name) continue;
    for (const auto& slot : node->subgraphs())
      if (slot.attributeIndex == i) throw std::logic_error("removeAttribute: '" + name + "' holds a subgraph");
    notifyWillChange(node);
    attrs->erase(attrs->begin() + i);
    // Later attributes moved down by one.
    if (Node::Extras* extras = node->extras_.get()) {
      for (auto& slot : extras->subgraphs)
        if (slot.attributeIndex > i) --slot.attributeIndex;
      auto& tensors = extras->tensorAttributes;
      for (auto it = tensors.begin(); it != tensors.end();) {
        if (it->first == i) {
          it = tensors.erase(it);
          continue;
        }
        if (it->first > i) --it->first;
        ++it;
      }
    }
    notifyChanged(node);
    return;
  }
}

void Rewriter::replaceValueKeepingName(const Value* constFrom, const Value* constTo) {
  auto* from = const_cast<Value*>(constFrom);
  auto* to = const_cast<Value*>(constTo);
  if (to->graphOutput_) throw std::logic_error("replaceValueKeepingName: '" + to->name() + "' is a graph output");
  Node* oldProducer = from->producer_;
  Graph& graph = *to->graph_;
  if (from->graph_ != to->graph_) throw std::logic_error("replaceValueKeepingName: values of different graphs");
  // The readers of `from` read the same name afterwards: only the two producers change.
  notifyWillChange(oldProducer);
  notifyWillChange(to->producer_);
  for (RewriteListener* listener : listeners_) listener->valueReplaced(*from, *to);

  // Detach the readers of `to` that belong to the node going away (its only readers, by precondition).
  if (oldProducer) {
    for (std::size_t slot = 0; slot < oldProducer->inputs_.size(); ++slot) {
      if (oldProducer->inputs_[slot] != to) continue;
      oldProducer->inputs_[slot] = nullptr;
      auto& uses = to->uses_;
      uses.erase(std::remove(uses.begin(), uses.end(), Use{oldProducer, static_cast<int>(slot)}), uses.end());
    }
  }
  // Readers of `from` now read `to`.
  for (const Use& use : from->uses_) {
    use.node->inputs_[static_cast<std::size_t>(use.slot)] = to;
    to->uses_.push_back(use);
    notifyChanged(use.node);
  }
  from->uses_.clear();
  // `to` takes `from`'s name and entry, and `from`, retired, `to`'s: that entry keeps `to`'s old name reserved.
  // Graph outputs and value_info follow the value.
  if (!graph.valuesByName_.swapEntries(from, to))
    throw std::logic_error("replaceValueKeepingName: '" + from->name_ + "' or '" + to->name_ + "' is not registered");
  std::swap(from->name_, to->name_);
  from->retired_ = true;
  if (from->initializer_) {
    retiredInitializers_.push_back(from);
    markDirty(graph);
  }
  // `to`'s own value_info described its old name; `from`'s entry now describes `to`.
  if (to->valueInfoIndex_ >= 0) graph.valueInfo_[static_cast<std::size_t>(to->valueInfoIndex_)].removed = true;
  to->valueInfoIndex_ = from->valueInfoIndex_;
  if (to->valueInfoIndex_ >= 0) graph.valueInfo_[static_cast<std::size_t>(to->valueInfoIndex_)].value = to;
  from->valueInfoIndex_ = -1;
  if (from->graphOutput_)
    for (auto& entry : graph.outputs_)
      if (entry.value == from) entry.value = to;
  to->graphOutput_ = from->graphOutput_;
  from->graphOutput_ = false;
  markDirty(graph);
  if (to->producer_) notifyChanged(to->producer_);
  if (oldProducer) {
    // The remaining outputs of the old producer must be unread for it to go.
    bool stillRead = false;
    for (Value* output : oldProducer->outputs_)
      if (output && output != from && (output->hasUses() || output->graphOutput_)) stillRead = true;
    if (!stillRead) {
      eraseNode(oldProducer);
    } else {
      // The old producer stays for its other outputs; this one becomes an omitted output.
      oldProducer->outputs_[static_cast<std::size_t>(from->producerOutput_)] = nullptr;
      retireValue(from);
      notifyChanged(oldProducer);
    }
  }
}

void Rewriter::eraseNode(const Node* constNode) {
  auto* node = const_cast<Node*>(constNode);
  if (node->erased_) return;
  for (Value* output : node->outputs_) {
    if (!output) continue;
    if (output->hasUses() || output->graphOutput_)
      throw std::logic_error("eraseNode: output '" + output->name() + "' of '" + node->name() + "' is still read");
  }
  Graph& graph = *node->graph_;
  notifyWillChange(node);
  node->erased_ = true;
  if (erasedLog_) erasedLog_->push_back(node->name());
  notifyErased(*node);
  auto owned = std::move(*node->position_);
  graph.nodes_.erase(node->position_);
  if (!node->subgraphs().empty()) --graph.nodesWithSubgraphs_;
  for (Value* output : node->outputs_)
    if (output) retireValue(output);
  for (std::size_t slot = 0; slot < node->inputs_.size(); ++slot) {
    Value* input = node->inputs_[slot];
    if (!input) continue;
    node->inputs_[slot] = nullptr;
    removeUse(input, node, static_cast<int>(slot));
  }
  erasedNodes_.push_back(std::move(owned));
}

void Rewriter::removeUse(Value* value, Node* node, int slot) {
  auto& uses = value->uses_;
  auto it = std::find(uses.begin(), uses.end(), Use{node, slot});
  if (it != uses.end()) uses.erase(it);
  dropIfDeadConstant(value);
}

// A constant whose last reader a rewrite removed goes too, and so does a Constant or pure op (see
// isConstantFoldableOp) none of whose outputs is read any more; nothing else is removed. Graph inputs, graph
// outputs and names read by training_info stay.
void Rewriter::dropIfDeadConstant(Value* value) {
  if (value->hasUses() || value->graphOutput_ || value->graphInput_ || model_.isPinned(value->name_)) return;
  if (value->initializer_) {
    retireValue(value);
    return;
  }
  Node* producer = value->producer_;
  if (!producer || producer->erased_ || !(producer->isOnnxOp("Constant") || isConstantFoldableOp(*producer))) return;
  for (const Value* output : producer->outputs_)
    if (output && (output->hasUses() || output->graphOutput_ || model_.isPinned(output->name_))) return;
  eraseNode(producer);
}

void Rewriter::materializeConstant(const Value* constValue, std::unique_ptr<Tensor> tensor,
                                   const std::vector<const Node*>& chain) {
  auto* value = const_cast<Value*>(constValue);
  Graph& graph = *value->graph_;
  nlohmann::json entry = {{"value", value->name_},
                          {"graph", graph.name()},
                          {"data_type", dataTypeName(tensor->dataType())},
                          {"dims", tensor->dims()}};
  nlohmann::json ops = nlohmann::json::array(), nodes = nlohmann::json::array();
  for (const Node* node : chain) {
    ops.push_back(node->opType());
    nodes.push_back(node->name());
  }
  entry["ops"] = std::move(ops);
  entry["nodes"] = std::move(nodes);

  tensor->setName(value->name_);
  attachInitializer(graph, value, std::move(tensor));
  std::vector<std::string> erased;
  erasedLog_ = &erased;
  if (Node* producer = value->producer_) {
    notifyWillChange(producer);
    // The producer loses this output; it (and the chain behind it) goes when nothing else reads it.
    producer->outputs_[static_cast<std::size_t>(value->producerOutput_)] = nullptr;
    value->producer_ = nullptr;
    value->producerOutput_ = -1;
    bool stillRead = false;
    for (const Value* output : producer->outputs_)
      if (output && (output->hasUses() || output->graphOutput_ || model_.isPinned(output->name_))) stillRead = true;
    if (!stillRead) eraseNode(producer);
    else notifyChanged(producer);
  }
  erasedLog_ = nullptr;
  entry["removed_nodes"] = erased;
  record("evaluated", std::move(entry));
}

void Rewriter::retireValue(Value* value) {
  Graph& graph = *value->graph_;
  // The value keeps its name and its entry in the graph's table, where the name stays reserved and lookups pass it
  // by: a fold retires five values, and taking each out of a table of 100,000 names read two cache lines apiece.
  value->retired_ = true;
  if (value->initializer_) retiredInitializers_.push_back(value);
  if (value->valueInfoIndex_ >= 0) {
    graph.valueInfo_[static_cast<std::size_t>(value->valueInfoIndex_)].removed = true;
    value->valueInfoIndex_ = -1;
  }
  value->producer_ = nullptr;
  // Bytes read from the model file for a replaced weight are not needed again until the end of the run.
  if (value->initializer_) value->initializer_->releaseCachedBytes();
  markDirty(graph);
}

void Rewriter::markDirty(Graph& graph) {
  // Each graph is compacted once in finish(), however many values it lost.
  if (std::find(dirtyGraphs_.begin(), dirtyGraphs_.end(), &graph) == dirtyGraphs_.end()) dirtyGraphs_.push_back(&graph);
}

void Rewriter::record(const std::string& section, nlohmann::json entry) {
  if (rule_) entry["rule"] = rule_->name();
  recorded_.emplace_back(section, report_.sectionSize(section));
  report_.add(section, std::move(entry));
}

void Rewriter::record(const std::string& section, ReportRecord entry) {
  if (rule_) entry.setText("rule", rule_->name());
  recorded_.emplace_back(section, report_.sectionSize(section));
  report_.add(section, std::move(entry));
}

std::vector<std::pair<std::string, std::size_t>> Rewriter::takeRecorded() {
  std::vector<std::pair<std::string, std::size_t>> out;
  out.swap(recorded_);
  return out;
}

void Rewriter::finish() {
  // Retired values leave the initializer lists here, in one pass per graph, looked up in a set of those the rewriter
  // retired rather than read from each initializer's Value. The set's nodes come from one buffer, freed at once.
  std::pmr::monotonic_buffer_resource buffer;
  std::pmr::unordered_set<const Value*> retired(&buffer);
  retired.reserve(retiredInitializers_.size());
  retired.insert(retiredInitializers_.begin(), retiredInitializers_.end());
  for (Graph* graph : dirtyGraphs_) {
    // IR version 3 demands every initializer of the main graph to be listed as a graph input too (onnx::checker
    // rejects the model otherwise): list the ones rewrites added, once it is known which of them survive.
    if (model_.irVersion() < 4 && graph->parent() == nullptr) {
      for (Value* value : graph->initializers_) {
        if (value->retired_ || value->graphInput_) continue;
        ValueInfoEntry entry{value, {}, false};
        entry.info.set_name(value->name_);
        onnx::TypeProto::Tensor* type = entry.info.mutable_type()->mutable_tensor_type();
        type->set_elem_type(static_cast<int32_t>(value->initializer_->dataType()));
        onnx::TensorShapeProto* shape = type->mutable_shape();
        for (int64_t dim : value->initializer_->dims()) shape->add_dim()->set_dim_value(dim);
        graph->inputs_.push_back(std::move(entry));
        value->graphInput_ = true;
      }
    }
    auto& infos = graph->valueInfo_;
    infos.erase(std::remove_if(infos.begin(), infos.end(), [](const ValueInfoEntry& e) { return e.removed; }),
                infos.end());
    for (std::size_t i = 0; i < infos.size(); ++i)
      if (infos[i].value) infos[i].value->valueInfoIndex_ = static_cast<int>(i);
    // Retired values stay among the graph's values, as they stay in its name table, until the graph goes.
    auto& inits = graph->initializers_;
    if (!retired.empty())
      inits.erase(std::remove_if(inits.begin(), inits.end(), [&retired](const Value* v) { return retired.count(v); }),
                  inits.end());
  }
  dirtyGraphs_.clear();
  retiredInitializers_.clear();
  for (NodePtr& node : erasedNodes_) {
    Graph& graph = *node->graph_;
    graph.removedNodes_.push_back(std::move(node));
  }
  erasedNodes_.clear();
}

}  // namespace bnfold
