#pragma once
// The part of a graph one rewrite changed, before and after, as small stand-alone graphs that the reference
// interpreter (interpreter.h) can evaluate. A RegionRecorder listens to the Rewriter while one rule rewrites:
// every node the rewrite changes or erases is copied before its first change, every node it creates is noted.
// Afterwards the "before" region is those copies and the "after" region is the same nodes as they now are plus
// the new ones. Values are matched by name: a rewrite keeps the names its readers see.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <onnx/onnx_pb.h>

#include "bnfold/ir/graph.h"
#include "bnfold/rewrite/rewriter.h"

namespace bnfold::verify {

/// A constant operand: element type, dims and bytes that stay readable after the graph changes.
struct ConstantOperand {
  DataType type = DataType::Undefined;
  std::vector<int64_t> dims;
  std::shared_ptr<const DeferredBytes> bytes;
};

/// A value the region reads at run time: the verifier feeds it random data.
struct RuntimeInput {
  std::string name;
  std::optional<std::vector<int64_t>> knownShape;  ///< dims as far as known (-1 unknown), or nullopt
  DataType type = DataType::Undefined;             ///< Undefined when not known
};

struct RegionNode {
  std::string opType;
  std::string name;
  onnx::NodeProto attributes;                        ///< the node's attributes (inputs/outputs not used)
  std::map<std::string, ConstantOperand> tensorAttributes;  ///< TENSOR attributes (ConstantOfShape's value)
  std::vector<std::string> inputs;                   ///< "" for an omitted input
  std::vector<std::string> outputs;                  ///< "" for an omitted output
};

/// A region node's attribute `name`, or null; and its value by kind, with a fallback when it is absent.
const onnx::AttributeProto* findAttribute(const RegionNode& node, const std::string& name);
int64_t intAttribute(const RegionNode& node, const std::string& name, int64_t fallback);
double floatAttribute(const RegionNode& node, const std::string& name, double fallback);
std::vector<int64_t> intsAttribute(const RegionNode& node, const std::string& name);
std::string stringAttribute(const RegionNode& node, const std::string& name, const std::string& fallback);

/// A small graph: nodes in evaluation order, the constants and run-time values they read, and the outputs
/// whose values the rest of the model sees.
struct Region {
  int64_t opset = 0;
  std::vector<RegionNode> nodes;
  std::map<std::string, ConstantOperand> constants;
  std::vector<RuntimeInput> inputs;
  std::vector<std::string> outputs;
};

struct RegionPair {
  Region before;
  Region after;
  /// What the rewrite is exact under (Rewriter::assume); empty for an exact rewrite.
  std::vector<LowerBoundAssumption> assumptions;
};

class RegionRecorder : public RewriteListener {
 public:
  /// Starts recording one rewrite.
  void begin();
  void nodeWillChange(const Node& node) override;
  void nodeCreated(const Node& node) override;
  void assumptionMade(const LowerBoundAssumption& assumption) override;

  /// Ends the rewrite: the region as it was and as it is now. Throws std::runtime_error when the regions cannot be
  /// put side by side (the rewrite changed nothing, or reads a run-time value the original did not).
  RegionPair finish(const Model& model);

  /// Nodes the rewrite changed or created that are still in the graph (for the test-only fault hook).
  std::vector<Node*> liveNodes() const;

 private:
  struct Captured {
    RegionNode node;
    std::map<std::string, ConstantOperand> constants;
    std::vector<RuntimeInput> inputs;
  };
  Captured capture(const Node& node) const;

  std::vector<const Node*> changed_;  // in the order of their first change
  std::unordered_set<const Node*> changedSet_;
  std::vector<const Node*> created_;
  std::vector<Captured> before_;
  std::vector<LowerBoundAssumption> assumptions_;
};

}  // namespace bnfold::verify
