#include "region.h"

#include <algorithm>
#include <functional>
#include <stdexcept>

#include "bnfold/ir/model.h"
#include "interpreter.h"
#include "analysis/value_shape.h"

namespace bnfold::verify {
namespace {

ConstantOperand operandOf(const Tensor& tensor) {
  // Strings have no bytes to read as numbers: the interpreter refuses such a constant if the region computes with it
  // (an invalid model's Mul of floats and strings), and the rewrite then "cannot be verified".
  if (tensor.dataType() == DataType::String) return {tensor.dataType(), tensor.dims(), nullptr};
  return {tensor.dataType(), tensor.dims(), tensor.byteSource()};
}

bool isConstantNode(const Node& node) { return node.isOnnxOp("Constant"); }

// Kahn's algorithm over the region's own edges: the graph's order would cost a walk over the whole graph.
std::vector<RegionNode> inEvaluationOrder(std::vector<RegionNode> nodes) {
  std::unordered_map<std::string, std::size_t> producerOf;
  for (std::size_t i = 0; i < nodes.size(); ++i)
    for (const std::string& output : nodes[i].outputs)
      if (!output.empty()) producerOf[output] = i;
  std::vector<RegionNode> ordered;
  std::vector<bool> placed(nodes.size(), false);
  while (ordered.size() < nodes.size()) {
    bool progress = false;
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      if (placed[i]) continue;
      bool ready = true;
      for (const std::string& input : nodes[i].inputs) {
        auto it = input.empty() ? producerOf.end() : producerOf.find(input);
        if (it != producerOf.end() && it->second != i && !placed[it->second]) ready = false;
      }
      if (!ready) continue;
      placed[i] = true;
      ordered.push_back(nodes[i]);
      progress = true;
    }
    if (!progress) throw std::runtime_error("the region has a cycle");
  }
  return ordered;
}

}  // namespace

const onnx::AttributeProto* findAttribute(const RegionNode& node, const std::string& name) {
  for (const auto& attribute : node.attributes.attribute())
    if (attribute.name() == name) return &attribute;
  return nullptr;
}
int64_t intAttribute(const RegionNode& node, const std::string& name, int64_t fallback) {
  const auto* attribute = findAttribute(node, name);
  return attribute ? attribute->i() : fallback;
}
double floatAttribute(const RegionNode& node, const std::string& name, double fallback) {
  const auto* attribute = findAttribute(node, name);
  return attribute ? attribute->f() : fallback;
}
std::vector<int64_t> intsAttribute(const RegionNode& node, const std::string& name) {
  const auto* attribute = findAttribute(node, name);
  if (!attribute) return {};
  return {attribute->ints().begin(), attribute->ints().end()};
}
std::string stringAttribute(const RegionNode& node, const std::string& name, const std::string& fallback) {
  const auto* attribute = findAttribute(node, name);
  return attribute ? attribute->s() : fallback;
}

void RegionRecorder::begin() {
  changed_.clear();
  changedSet_.clear();
  created_.clear();
  before_.clear();
  assumptions_.clear();
}

void RegionRecorder::assumptionMade(const LowerBoundAssumption& assumption) { assumptions_.push_back(assumption); }

RegionRecorder::Captured RegionRecorder::capture(const Node& node) const {
  Captured captured;
  RegionNode& copy = captured.node;
  copy.opType = node.opType();
  copy.name = node.name();
  *copy.attributes.mutable_attribute() = node.proto().attribute();
  for (const auto& attribute : node.proto().attribute())
    if (attribute.type() == onnx::AttributeProto::TENSOR)
      if (const Tensor* tensor = node.attributeTensor(attribute.name()))
        copy.tensorAttributes[attribute.name()] = operandOf(*tensor);
  for (const Value* input : node.inputs()) {
    copy.inputs.push_back(input ? input->name() : "");
    if (!input) continue;
    if (const Tensor* tensor = input->constantTensor()) {
      captured.constants[input->name()] = operandOf(*tensor);
    } else if (!input->producer() || !isConstantNode(*input->producer())) {
      RuntimeInput runtime{input->name(), analysis::knownShape(*input), DataType::Undefined};
      if (auto type = analysis::knownElementType(*input)) runtime.type = *type;
      captured.inputs.push_back(std::move(runtime));
    }
  }
  for (const Value* output : node.outputs()) copy.outputs.push_back(output ? output->name() : "");
  if (isConstantNode(node) && node.output(0))
    if (const Tensor* tensor = node.output(0)->constantTensor())
      captured.constants[node.output(0)->name()] = operandOf(*tensor);
  return captured;
}

void RegionRecorder::nodeWillChange(const Node& node) {
  if (!changedSet_.insert(&node).second) return;
  // A node created by this rewrite has no "before".
  if (std::find(created_.begin(), created_.end(), &node) != created_.end()) return;
  changed_.push_back(&node);
  before_.push_back(capture(node));
}

void RegionRecorder::nodeCreated(const Node& node) { created_.push_back(&node); }

std::vector<Node*> RegionRecorder::liveNodes() const {
  std::vector<Node*> live;
  for (const auto* list : {&changed_, &created_})
    for (const Node* node : *list)
      if (!node->isErased()) live.push_back(const_cast<Node*>(node));
  return live;
}

namespace {

// Fills nodes/constants/inputs of a region from captured nodes; Constant nodes become constants.
template <typename Captures>
void assemble(Region& region, const Captures& captures) {
  std::unordered_set<std::string> produced;
  std::vector<RegionNode> nodes;
  std::map<std::string, RuntimeInput> inputs;
  for (const auto& captured : captures) {
    for (const auto& [name, operand] : captured.constants) region.constants[name] = operand;
    if (captured.node.opType == "Constant") continue;
    for (const std::string& output : captured.node.outputs)
      if (!output.empty()) produced.insert(output);
    nodes.push_back(captured.node);
    for (const RuntimeInput& input : captured.inputs) inputs.emplace(input.name, input);
  }
  for (const auto& [name, input] : inputs)
    if (!produced.count(name) && !region.constants.count(name)) region.inputs.push_back(input);
  region.nodes = inEvaluationOrder(std::move(nodes));
}

}  // namespace

RegionPair RegionRecorder::finish(const Model& model) {
  RegionPair pair;
  pair.assumptions = assumptions_;
  pair.before.opset = pair.after.opset = model.opsetVersion("");
  if (before_.empty() && created_.empty()) throw std::runtime_error("the rewrite changed no node");

  std::vector<Captured> after;
  std::unordered_set<const Node*> liveSet;
  for (Node* node : liveNodes()) {
    after.push_back(capture(*node));
    liveSet.insert(node);
  }
  const Graph* graph = nullptr;
  for (const Node* node : changed_) graph = graph ? graph : node->graph();
  for (const Node* node : created_) graph = graph ? graph : node->graph();

  // Nodes the rewrite left alone but that lie between nodes it changed (a layout path from a layer to its BN)
  // belong to both regions: without them, the original would read their result as a run-time input.
  std::unordered_set<std::string> producedBefore;
  for (const Captured& captured : before_)
    for (const std::string& output : captured.node.outputs)
      if (!output.empty()) producedBefore.insert(output);
  // In the order found (deterministic, unlike an order of pointers), with a set for lookups; `noPath` remembers
  // the nodes already searched in vain, so that a graph of diamonds is not searched once per path.
  std::vector<const Node*> between;
  std::unordered_set<const Node*> inBetween, noPath;
  auto addBetween = [&](const Node* node) {
    if (inBetween.insert(node).second) between.push_back(node);
  };
  std::function<bool(const Value*, int)> leadsBack = [&](const Value* value, int depth) {
    if (!value || value->name().empty()) return false;
    if (producedBefore.count(value->name())) return true;
    const Node* producer = value->producer();
    if (!producer || depth == 0 || liveSet.count(producer) || noPath.count(producer)) return false;
    if (inBetween.count(producer)) return true;
    bool found = false;
    for (const Value* input : producer->inputs()) found = leadsBack(input, depth - 1) || found;
    if (found) addBetween(producer);
    else noPath.insert(producer);
    return found;
  };
  constexpr int kLongestPathBetween = 16;
  if (graph)
    for (const Captured& captured : before_)
      for (const RuntimeInput& input : captured.inputs)
        if (!producedBefore.count(input.name)) leadsBack(graph->lookup(input.name), kLongestPathBetween);
  // Likewise the unchanged pure ops that compute a run-time input of the original from constants (a chain the
  // rewrite evaluated only in part): they make it a constant, as the rewrite saw it.
  std::unordered_set<const Node*> notConstant;
  std::function<bool(const Value*, int)> computedFromConstants = [&](const Value* value, int depth) {
    if (!value) return true;
    if (value->constantTensor()) return true;
    const Node* producer = value->producer();
    if (!producer || depth == 0 || liveSet.count(producer) || notConstant.count(producer) ||
        !isEvaluableOp(producer->opType()) || !producer->isOnnxDomain())
      return false;
    if (inBetween.count(producer)) return true;
    for (const Value* input : producer->inputs())
      if (!computedFromConstants(input, depth - 1)) {
        notConstant.insert(producer);
        return false;
      }
    addBetween(producer);
    return true;
  };
  if (graph)
    for (const Captured& captured : before_)
      for (const RuntimeInput& input : captured.inputs)
        if (!producedBefore.count(input.name)) computedFromConstants(graph->lookup(input.name), kLongestPathBetween);
  std::vector<Captured> before = before_;
  for (const Node* node : between) {
    before.push_back(capture(*node));
    after.push_back(before.back());
    liveSet.insert(node);
  }
  assemble(pair.before, before);
  assemble(pair.after, after);

  // Outputs: values the original region computed that the rest of the model still reads under the same name.
  for (const RegionNode& node : pair.before.nodes) {
    for (const std::string& name : node.outputs) {
      if (name.empty() || !graph) continue;
      const Value* value = graph->lookup(name);
      if (!value) continue;
      bool readOutside = value->isGraphOutput();
      for (const Use& use : value->uses()) readOutside = readOutside || !liveSet.count(use.node);
      if (readOutside) pair.before.outputs.push_back(name);
    }
  }
  pair.after.outputs = pair.before.outputs;
  // An output the rewrite turned into a constant (an evaluated chain that something else reads too).
  for (const std::string& name : pair.after.outputs)
    if (const Value* value = graph->lookup(name))
      if (const Tensor* tensor = value->constantTensor()) pair.after.constants[name] = operandOf(*tensor);

  for (const RuntimeInput& input : pair.after.inputs) {
    const bool known = std::any_of(pair.before.inputs.begin(), pair.before.inputs.end(),
                                   [&](const RuntimeInput& other) { return other.name == input.name; });
    if (!known)
      throw std::runtime_error("the rewritten nodes read '" + input.name + "' at run time, which the original did not");
  }
  return pair;
}

}  // namespace bnfold::verify
