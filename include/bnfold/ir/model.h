#pragma once
/// \file
/// Model: the ModelProto fields around the main graph (kept as loaded) plus the graph as IR.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <onnx/onnx_pb.h>

#include "bnfold/ir/graph.h"

namespace bnfold {

/// A graph whose stored node order was not topological, sorted when the model was loaded.
struct ReorderedGraph {
  std::string graph;       ///< the graph's name
  bool subgraph = false;   ///< false for the main graph
  std::string ownerNode;   ///< for a subgraph, the node whose attribute holds it
  std::size_t movedNodes = 0;  ///< the fewest nodes that had to move (the others kept their relative order)
};

/// The names a model uses, for handing out new ones that clash with none. Names are kept as 64-bit hashes in an
/// open-addressing table, not as strings: a model of 50,000 nodes has over 100,000 names, and copying each into a
/// std::unordered_set cost a sixth of loading it. Two names with one hash make a free name look taken, which only
/// means the next candidate is tried.
class NameSet {
 public:
  /// Adds `name` unless it is (or may be) there already; true when it was added.
  bool insert(std::string_view name);
  /// Whether `name` is (or may be) there.
  bool contains(std::string_view name) const;
  /// Room for `count` names without growing.
  void reserve(std::size_t count);

 private:
  static uint64_t hashOf(std::string_view name) {
    const uint64_t hash = std::hash<std::string_view>{}(name);
    return hash == 0 ? 1 : hash;  // 0 marks an empty slot
  }
  bool insertHash(uint64_t hash);
  /// The slot holding `hash`, or the empty slot where it would go.
  std::size_t slotOf(uint64_t hash) const;
  std::vector<uint64_t> slots_;
  std::size_t size_ = 0;
};

class Model {
 public:
  Model();
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  Graph& graph() { return *graph_; }
  const Graph& graph() const { return *graph_; }

  int64_t irVersion() const { return shell_.ir_version(); }
  /// The opset version imported for `domain` ("" and "ai.onnx" are the same), or -1 when not imported.
  int64_t opsetVersion(const std::string& domain = "") const;

  /// Where the model was loaded from ("" when built in memory) and the folder external data is relative to.
  const std::string& path() const { return path_; }
  const std::string& baseDir() const { return baseDir_; }

  /// A node name not used anywhere in the model yet (and reserved from now on), derived from `hint`.
  std::string uniqueNodeName(const std::string& hint);
  /// A value (tensor) name not used anywhere in the model yet (and reserved from now on).
  std::string uniqueValueName(const std::string& hint);
  /// Whether an initializer of some graph was stored in external data when the model was loaded (known from the
  /// load, so that answering does not read every initializer's proto).
  bool usesExternalData() const { return usesExternalData_; }
  /// Initializer names read from outside the graphs (training_info): they must never be removed.
  bool isPinned(const std::string& valueName) const { return pinnedNames_.count(valueName) != 0; }

  /// The model's one copy of `opType`, which every node of that type points to. Nodes hold no std::string of their
  /// own: a string per node would make each node larger, and a few dozen types serve a whole model.
  const std::string& internOpType(const std::string& opType) { return *opTypes_.insert(opType).first; }

  /// Goes up with every change the Rewriter makes to any graph of the model, so that a cache of what the graphs
  /// compute can tell when it is stale.
  uint64_t changeCount() const { return changeCount_; }

  /// Every ModelProto field except the graph (ir_version, opset_import, metadata, functions, ...).
  const onnx::ModelProto& shell() const { return shell_; }
  onnx::ModelProto& mutableShell() { return shell_; }

  /// Every graph: the main graph first, then nested ones depth-first.
  std::vector<Graph*> allGraphs();

  /// The graphs whose nodes were not stored in topological order and were sorted on load (main graph first,
  /// then subgraphs depth-first); empty when every graph was sorted already. Saving writes the sorted order.
  const std::vector<ReorderedGraph>& reorderedGraphs() const { return reorderedGraphs_; }

 private:
  friend class ModelReader;
  friend class ModelWriter;
  friend class Rewriter;  // newValueWithUniqueName, changeCount_

  /// A new value of `graph` under a name as uniqueValueName(hint) gives. A main-graph value's name is kept by the
  /// graph's table from then on (a retired value keeps its entry), so it is not recorded in valueNames_ as well.
  Value* newValueWithUniqueName(Graph& graph, const std::string& hint);
  /// A name from `hint` that neither the main graph's table nor valueNames_ holds; recorded in valueNames_ if `record`.
  std::string claimValueName(const std::string& hint, bool record);

  onnx::ModelProto shell_;
  std::unordered_set<std::string> opTypes_;  // before graph_: its nodes point into it
  std::unique_ptr<Graph> graph_;
  std::string path_;
  std::string baseDir_;
  // Reserve every node (value) name the model has, on the first request for a new node (value) name: a load that
  // asks for none (`--rules none`, `check`, `info`) never hashes its names, and a fold, which adds tensors but no
  // nodes, hashes no node name. Value names of the main graph are looked up in its ValueTable instead: valueNames_
  // has subgraphs' names and names handed out, except those of main-graph values the Rewriter made. A value a rewrite
  // removed keeps its name and its table entry, so its name stays taken (see Rewriter::retireValue).
  void reserveExistingNodeNames();
  void reserveExistingValueNames();

  NameSet nodeNames_;
  NameSet valueNames_;
  bool nodeNamesReserved_ = false;
  bool valueNamesReserved_ = false;
  bool usesExternalData_ = false;
  uint64_t changeCount_ = 0;
  std::unordered_set<std::string> pinnedNames_;
  std::vector<ReorderedGraph> reorderedGraphs_;
};

}  // namespace bnfold
