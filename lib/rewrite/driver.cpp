#include "bnfold/rewrite/driver.h"

#include <deque>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "op_versions.h"
#include "root_scan.h"

namespace bnfold {

namespace {

// Keyed by the model's interned op type (Model::internOpType), which every node's opType() is: a lookup per node
// hashes a pointer, not the op's name.
using RulesByOp = std::unordered_map<const std::string*, std::vector<const Rule*>>;

RulesByOp bucketByRootOp(Model& model, const std::vector<const Rule*>& rules) {
  RulesByOp buckets;
  for (const Rule* rule : rules)
    for (const std::string& op : rule->rootOps()) buckets[&model.internOpType(op)].push_back(rule);
  return buckets;
}

// Whether each rule knows the versions of the ops it reads and writes at the model's opset: once per run.
std::unordered_map<const Rule*, std::optional<std::string>> opsetProblemsOf(const RulesByOp& buckets, int64_t opset) {
  std::unordered_map<const Rule*, std::optional<std::string>> problems;
  for (const auto& [op, rules] : buckets)
    for (const Rule* rule : rules)
      if (!problems.count(rule))
        problems[rule] = opsetProblem(rule->opVersions(), opset, "rule " + std::string(rule->name()));
  return problems;
}

// One run: the roots in graph order first, then the nodes rewrites touched, until none is left. It listens to the
// rewriter to learn what each rewrite touched.
class Driver final : public RewriteListener {
 public:
  Driver(Model& model, const std::vector<const Rule*>& rules, const RewriteDriverOptions& options, Report& report)
      : options_(options),
        rulesByOp_(bucketByRootOp(model, rules)),
        opsetProblems_(opsetProblemsOf(rulesByOp_, model.opsetVersion(""))),
        context_(model, options.ruleOptions),
        roots_(rulesByOp_.empty() ? std::vector<Graph*>{} : model.allGraphs(),
               [this](const Node& node) { return rulesByOp_.count(&node.opType()) > 0; }),
        rewriter_(model, report) {
    if (options.statistics) rewriter_.useStatistics(*options.statistics);
    context_.setStatistics(&rewriter_.statistics());
  }

  void run() {
    rewriter_.addListener(this);
    rewriter_.addListener(&roots_);
    context_.followChanges(rewriter_);
    for (RewriteListener* listener : options_.listeners) rewriter_.addListener(listener);
    for (;;) {
      bool fromScan = true;
      Node* node = roots_.next();
      if (!node) {
        node = nextFromWorklist();
        if (!node) break;
        fromScan = false;
      }
      visit(*node, fromScan);
    }
    rewriter_.removeListener(this);
    rewriter_.removeListener(&roots_);
    context_.stopFollowing(rewriter_);
    for (RewriteListener* listener : options_.listeners) rewriter_.removeListener(listener);
    rewriter_.finish();
  }

  void nodeCreated(const Node& node) override { touched_.push_back(const_cast<Node*>(&node)); }
  void nodeChanged(const Node& node) override { touched_.push_back(const_cast<Node*>(&node)); }
  // The nodes that fed an erased node are looked at again: a reader of their outputs may have lost its only rival.
  void nodeErased(const Node& node) override {
    for (Value* input : node.inputs())
      if (input && input->producer() && !input->producer()->isErased()) touched_.push_back(input->producer());
  }

 private:
  Node* nextFromWorklist() {
    if (worklist_.empty()) return nullptr;
    Node* node = worklist_.front();
    worklist_.pop_front();
    queued_.erase(node);
    return node;
  }

  // Only nodes some chosen rule starts from go on the worklist: most nodes of a large graph are not one.
  void enqueue(Node* node) {
    if (!node->isErased() && rulesByOp_.count(&node->opType()) && !roots_.willYield(*node) && queued_.insert(node).second)
      worklist_.push_back(node);
  }

  void visit(Node& node, bool fromScan) {
    if (node.isErased() || !node.isOnnxDomain()) return;
    auto bucket = rulesByOp_.find(&node.opType());
    if (bucket == rulesByOp_.end()) return;
    failures_.clear();
    if (context_.isKept(node)) {
      notifyVisited(node, fromScan, true, false);
      return;
    }
    bool rewritten = false;
    for (const Rule* rule : bucket->second) {
      std::optional<MatchResult> result = matchRule(*rule, node);
      if (!result) continue;
      applyRewrite(*rule, node, *result);
      rewritten = true;
      break;
    }
    notifyVisited(node, fromScan, false, rewritten);
  }

  // The rule's match at `node`, or nullopt with its failure added to failures_.
  std::optional<MatchResult> matchRule(const Rule& rule, const Node& node) {
    // Every rule reads input 0 and replaces output 0 of its root (BatchNormalization, Add, Mul, ...); a node with
    // either omitted ("") is malformed, and no rule looks at it.
    if (node.inputs().empty() || !node.input(0)) {
      failures_.push_back({&rule, {reason::kMissingInput, "input 0 is omitted"}});
      return std::nullopt;
    }
    if (node.outputs().empty() || !node.output(0)) {
      failures_.push_back({&rule, {reason::kMissingOutput, "output 0 is omitted"}});
      return std::nullopt;
    }
    if (const auto& problem = opsetProblems_.at(&rule)) {
      failures_.push_back({&rule, {reason::kUnsupportedOpset, *problem}});
      return std::nullopt;
    }
    MatchResult result = context_.match(rule, node);
    if (!result.matched()) {
      failures_.push_back({&rule, result.failure()});
      return std::nullopt;
    }
    return result;
  }

  void applyRewrite(const Rule& rule, const Node& root, MatchResult& result) {
    if (++rewrites_ > options_.maxRewrites)
      throw std::runtime_error("rules did not reach a fixed point after " + std::to_string(options_.maxRewrites) +
                               " rewrites");
    for (DriverObserver* observer : options_.observers) observer->rewriteStarting(rule, root);
    rewriter_.apply(rule, result);
    rewriter_.beginRule(nullptr);
    const RecordedEntries recorded = rewriter_.takeRecorded();
    for (DriverObserver* observer : options_.observers) observer->rewriteFinished(rule, rewriter_, recorded);
    requeueTouched();
  }

  // Look again at what changed and at whatever reads it.
  void requeueTouched() {
    if (!options_.revisitTouched) {
      touched_.clear();
      return;
    }
    for (Node* touched : touched_) {
      if (touched->isErased()) continue;
      enqueue(touched);
      for (Value* output : touched->outputs())
        if (output)
          for (const Use& use : output->uses()) enqueue(use.node);
    }
    touched_.clear();
  }

  void notifyVisited(const Node& node, bool fromScan, bool kept, bool rewritten) {
    for (DriverObserver* observer : options_.observers)
      observer->rootVisited(node, fromScan, kept, rewritten, failures_);
  }

  const RewriteDriverOptions& options_;
  const RulesByOp rulesByOp_;
  const std::unordered_map<const Rule*, std::optional<std::string>> opsetProblems_;
  RuleContext context_;
  RootScan roots_;
  Rewriter rewriter_;
  std::deque<Node*> worklist_;
  std::unordered_set<Node*> queued_;  // what is on the worklist
  std::vector<Node*> touched_;        // created or changed by the rewrite running now, in the order told
  std::vector<RuleFailure> failures_;  // of the root being visited
  std::size_t rewrites_ = 0;
};

}  // namespace

void driveRules(Model& model, const std::vector<const Rule*>& rules, const RewriteDriverOptions& options,
                Report& report) {
  Driver(model, rules, options, report).run();
}

}  // namespace bnfold
