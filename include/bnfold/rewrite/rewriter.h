#pragma once
/// \file
/// The Rewriter is the only way to change a graph once it is loaded. Every change goes through it so it can
/// keep use lists right, drop constants a rewrite left without readers, tell its listeners (the driver's
/// worklist, --verify, ...) what changed, and record provenance for the report.

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bnfold/ir/model.h"
#include "bnfold/report/report.h"

namespace bnfold {

class Rule;
class MatchResult;
class PreActivationStatistics;

/// A rewrite that is exact only where one value stays at or above a bound in each channel (high-bias absorption), or
/// within [bound, bound + width) (relu6-to-relu): --verify samples that value there instead of computing it.
struct LowerBoundAssumption {
  std::string value;        ///< the value's name (the same before and after the rewrite)
  int64_t channelAxis = 1;  ///< the axis of its channels
  std::vector<double> before;  ///< the bound per channel, on the value as the original computes it
  std::vector<double> after;   ///< the same bound on the value as the rewrite computes it (moved by after - before)
  std::string statement;       ///< one sentence for the report
  double width = 2.0;          ///< drawn uniform in [bound, bound + width)
};

/// Told about each change the rewriter makes (MLIR's RewriterBase::Listener). The driver is one listener (its
/// worklist); --verify and the driver's root scan are others. Every method does nothing unless overridden.
class RewriteListener {
 public:
  virtual ~RewriteListener() = default;
  /// `node` was just inserted into its graph.
  virtual void nodeCreated(const Node& /*node*/) {}
  /// `node` is about to change: its inputs, attributes or outputs, or it is about to be erased. Reported every
  /// time; a listener that wants the original keeps the first report.
  virtual void nodeWillChange(const Node& /*node*/) {}
  /// `node` changed: an input, an attribute or an output (it stays in its graph).
  virtual void nodeChanged(const Node& /*node*/) {}
  /// `node` was just erased: it is marked erased and out of its graph's list, its inputs not yet detached.
  virtual void nodeErased(const Node& /*node*/) {}
  /// The readers of `from` are about to read `to`, which takes over `from`'s name.
  virtual void valueReplaced(const Value& /*from*/, const Value& /*to*/) {}
  /// The rewrite running now is exact only under `assumption`.
  virtual void assumptionMade(const LowerBoundAssumption& /*assumption*/) {}
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
  /// Adds a listener, told of every change from now on in the order added; it must outlive its membership.
  void addListener(RewriteListener* listener);
  void removeListener(RewriteListener* listener);

  /// The per-layer output statistics the rules share (pre_activation_statistics.h): the rewriter's own, unless
  /// useStatistics gave another (one that outlives a single driver run). apply() brackets each rewrite for it.
  PreActivationStatistics& statistics() { return *statistics_; }
  /// Uses `statistics` (and listens with it) instead of the rewriter's own from now on; it must outlive the rewriter.
  void useStatistics(PreActivationStatistics& statistics);

  /// Applies a successful match of `rule`: the constants the match evaluated become initializers
  /// (materializeConstant), then the rule's rewrite runs; report entries are tagged with the rule's name until the
  /// next beginRule.
  void apply(const Rule& rule, MatchResult& result);

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
  void includeUnchanged(const Node* node) { notifyWillChange(node); }

  /// Says that the rewrite running now is exact only under `assumption` (tells the listeners; --verify checks it there).
  void assume(const LowerBoundAssumption& assumption);

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

  /// Compacts graphs after rewrites (drops removed initializers and values). Called by the driver.
  void finish();

 private:
  void notifyCreated(const Node& node);
  void notifyWillChange(const Node* node);
  void notifyChanged(const Node* node);
  void notifyErased(const Node& node);
  void removeUse(Value* value, Node* node, int slot);
  void dropIfDeadConstant(Value* value);
  void retireValue(Value* value);
  /// Makes `value` an initializer of `graph` holding `tensor`, kept in external data if the model keeps its own there.
  void attachInitializer(Graph& graph, Value* value, std::unique_ptr<Tensor> tensor);
  void markDirty(Graph& graph);

  Model& model_;
  Report& report_;
  const Rule* rule_ = nullptr;
  std::vector<RewriteListener*> listeners_;
  std::unique_ptr<PreActivationStatistics> ownStatistics_;
  PreActivationStatistics* statistics_;
  std::vector<std::pair<std::string, std::size_t>> recorded_;
  std::vector<NodePtr> erasedNodes_;
  std::vector<Graph*> dirtyGraphs_;
  // Initializers retired since the last finish(), which takes them out of their graphs' lists without reading every
  // initializer's Value.
  std::deque<const Value*> retiredInitializers_;
  std::vector<std::string>* erasedLog_ = nullptr;  // names of erased nodes, while materializeConstant runs
};

}  // namespace bnfold
