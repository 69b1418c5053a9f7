#pragma once
/// \file
/// The Rewriter is the only way to change a graph once it is loaded. Every change goes through it so it can
/// keep use lists right, drop constants a rewrite left without readers, tell the driver what to look at
/// again, and record provenance for the report.

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bnfold/ir/model.h"
#include "bnfold/report/report.h"

namespace bnfold {

class Rule;

/// Told about each change a rewrite makes, before the graph changes (for --verify, which keeps the original
/// form of everything a rewrite touches). A node is reported every time; listeners keep the first report.
class RewriteListener {
 public:
  virtual ~RewriteListener() = default;
  /// `node` is about to change: its inputs, attributes or outputs, or it is about to be erased.
  virtual void nodeWillChange(const Node& node) = 0;
  /// `node` was just created.
  virtual void nodeCreated(const Node& node) = 0;
};

class Rewriter {
 public:
  Rewriter(Model& model, Report& report);
  ~Rewriter();
  Rewriter(const Rewriter&) = delete;
  Rewriter& operator=(const Rewriter&) = delete;

  Model& model() { return model_; }
  /// The rule whose rewrite runs now; its name goes into every report entry it records.
  void beginRule(const Rule* rule) { rule_ = rule; }
  /// Where changes are announced (null: nowhere). The listener must outlive its use.
  void setListener(RewriteListener* listener) { listener_ = listener; }

  /// Adds an initializer to `graph` under a fresh unique name derived from `nameHint`. In IR version 3 it goes to
  /// the main graph instead (and is listed among its inputs by finish()), which `graph` can read.
  Value* addInitializer(const Graph& graph, Tensor tensor, const std::string& nameHint);

  /// Creates a node right before `anchor` in anchor's graph. Outputs get fresh names derived from the hints.
  Node* createNode(const Node* anchor, const std::string& opType, const std::vector<const Value*>& inputs,
                   const std::vector<std::string>& outputNameHints, const std::string& nameHint,
                   std::vector<onnx::AttributeProto> attributes = {});

  /// Points input `slot` of `node` at `value` (null omits it); the input list grows when needed.
  void setInput(const Node* node, int slot, const Value* value);
  /// Sets (or replaces) an attribute.
  void setAttribute(const Node* node, onnx::AttributeProto attribute);
  void removeAttribute(const Node* node, const std::string& name);

  /// Tells the listeners that `node`, which the rewrite leaves unchanged, belongs with the nodes it changes: their
  /// change is exact only through it (an activation between two rescaled layers), so --verify evaluates it with them.
  void includeUnchanged(const Node* node) { willChange(node); }

  /// Every reader of `from` (including graph outputs, which keep `from`'s name by renaming) now reads `to`.
  /// `from`'s producer is then erased when none of its outputs is read any more.
  /// Used when a node disappears: `to` takes over `from`'s name, so consumers and graph outputs keep working.
  /// Precondition: `to` is read by nothing but `from`'s producer, and is not a graph output.
  void replaceValueKeepingName(const Value* from, const Value* to);

  /// Erases `node`; none of its outputs may still be read or be a graph output. The nodes that fed it are looked
  /// at again by the driver (a reader of their outputs may have lost its only rival).
  void eraseNode(const Node* node);

  /// Turns `value`, computed from constants by the pure ops `chain` (in evaluation order), into an initializer of
  /// its graph holding `tensor`, its value: it keeps its name and readers; its producer goes, and so does every
  /// node of the chain nothing else reads (dead-node removal). Records an `evaluated` report entry.
  void materializeConstant(const Value* value, std::unique_ptr<Tensor> tensor, const std::vector<const Node*>& chain);

  /// Appends an entry to a report section, tagged with the current rule's name.
  void record(const std::string& section, nlohmann::json entry);
  /// The same for an entry kept as a record (for the entries a large model has thousands of, like folds).
  void record(const std::string& section, ReportRecord entry);
  /// Where the entries recorded since the last call went: (section, index in it).
  std::vector<std::pair<std::string, std::size_t>> takeRecorded();

  /// Nodes created or changed since the last call (for the driver's worklist).
  std::vector<Node*> takeTouched();

  /// Compacts graphs after rewrites (drops removed initializers and values). Called by the driver.
  void finish();

 private:
  void touch(Node* node);
  void willChange(const Node* node) {
    if (listener_ && node) listener_->nodeWillChange(*node);
  }
  void removeUse(Value* value, Node* node, int slot);
  void dropIfDeadConstant(Value* value);
  void retireValue(Value* value);
  /// Makes `value` an initializer of `graph` holding `tensor`, kept in external data if the model keeps its own there.
  void attachInitializer(Graph& graph, Value* value, std::unique_ptr<Tensor> tensor);
  void markDirty(Graph& graph);

  Model& model_;
  Report& report_;
  const Rule* rule_ = nullptr;
  RewriteListener* listener_ = nullptr;
  std::vector<std::pair<std::string, std::size_t>> recorded_;
  std::vector<Node*> touched_;
  std::vector<NodePtr> erasedNodes_;
  std::vector<Graph*> dirtyGraphs_;
  // Initializers retired since the last finish(), which takes them out of their graphs' lists without reading every
  // initializer's Value (on a 10,000-block chain those reads were a tenth of the rules' misses of the caches).
  std::deque<const Value*> retiredInitializers_;  // not a vector: growing, it copied what had left the caches
  std::vector<std::string>* erasedLog_ = nullptr;  // names of erased nodes, while materializeConstant runs
};

}  // namespace bnfold
