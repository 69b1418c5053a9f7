#include "bnfold/rewrite/driver.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "bnfold/rewrite/rewriter.h"
#include "constant_eval.h"
#include "op_versions.h"
#include "root_scan.h"
#include "verify/region.h"
#include "verify/verifier.h"

namespace bnfold {

const Rule* findRule(const std::string& name) {
  for (const auto& rule : builtinRules())
    if (name == rule->name()) return rule.get();
  return nullptr;
}

std::vector<std::string> parseRuleSelection(const std::string& selection) {
  std::vector<std::string> tokens;
  std::stringstream stream(selection);
  for (std::string token; std::getline(stream, token, ',');) {
    token.erase(0, token.find_first_not_of(" \t"));
    token.erase(token.find_last_not_of(" \t") + 1);
    if (!token.empty()) tokens.push_back(token);
  }
  std::unordered_set<std::string> chosen;
  auto addDefaults = [&] {
    for (const auto& rule : builtinRules())
      if (rule->enabledByDefault()) chosen.insert(rule->name());
  };
  auto requireKnown = [](const std::string& name) {
    if (findRule(name)) return;
    std::string known;
    for (const auto& rule : builtinRules()) known += (known.empty() ? "" : ", ") + std::string(rule->name());
    throw std::invalid_argument("unknown rule '" + name + "' (known rules: " + (known.empty() ? "none" : known) + ")");
  };
  // A selection that starts with a change (+x / -x) changes the defaults.
  if (tokens.empty() || tokens.front()[0] == '+' || tokens.front()[0] == '-') addDefaults();
  for (const std::string& token : tokens) {
    if (token == "none") {
      chosen.clear();
    } else if (token == "default") {
      addDefaults();
    } else if (token == "all") {
      for (const auto& rule : builtinRules()) chosen.insert(rule->name());
    } else if (token[0] == '-') {
      requireKnown(token.substr(1));
      chosen.erase(token.substr(1));
    } else {
      const std::string name = token[0] == '+' ? token.substr(1) : token;
      requireKnown(name);
      chosen.insert(name);
    }
  }
  std::vector<std::string> ordered;
  for (const auto& rule : builtinRules())
    if (chosen.count(rule->name())) ordered.push_back(rule->name());
  return ordered;
}

namespace {

struct Failure {
  const Rule* rule;
  MatchFailure failure;
};

// Whether one of the rules that failed on `node` only because a parameter or weight is an overridable default
// (params-overridable) would rewrite it if such defaults were constants. Matching changes nothing.
bool wouldRewriteWithInputDefaults(const Node& node, const std::vector<Failure>& failures, const RuleContext& relaxed) {
  for (const Failure& f : failures) {
    if (f.failure.code != reason::kParamsOverridable) continue;
    const bool matched = f.rule->match(node, relaxed).matched();
    relaxed.constantEvaluator().discardPending();
    if (matched) return true;
  }
  return false;
}

// Whether `node` is still in the model: not erased, and neither is any node owning a graph around it.
bool isInModel(const Node& node) {
  for (const Node* n = &node; n; n = n->graph()->ownerNode())
    if (n->isErased()) return false;
  return true;
}

// One "skipped" entry for each BatchNormalization left in the model, in graph order. `batchNorms`: every
// BatchNormalization the model had before the rules ran, in that order (nodes never move), less any erased before the
// root scan reached it, when no rewrite made a new one; null to look through every node of every graph instead.
void recordSkippedBatchNorms(Model& model, const RuleContext& context,
                             const std::unordered_map<const Node*, std::vector<Failure>>& failures,
                             const std::vector<const Node*>* batchNorms, Report& report) {
  RuleOptions relaxedOptions = context.options();
  relaxedOptions.inputDefaultsAreConstant = true;
  const RuleContext relaxed(model, relaxedOptions);
  std::vector<const Node*> found;
  if (!batchNorms) {
    for (Graph* graph : model.allGraphs())
      for (const auto& node : graph->nodes())
        if (node->isOnnxOp("BatchNormalization")) found.push_back(node.get());
    batchNorms = &found;
  }
  for (const Node* batchNorm : *batchNorms) {
    const Node& node = *batchNorm;
    if (!isInModel(node)) continue;
    nlohmann::json entry = nlohmann::json::object();  // key by key: a braced list costs a copy of each value
    entry["node"] = node.name();
    entry["op"] = node.opType();
    entry["graph"] = node.graph()->name();
    auto it = failures.find(&node);
    if (context.isKept(node)) {
      entry["reason"] = reason::kKeptByUser.str();
      entry["message"] = "kept by --keep or --keep-op";
    } else if (it == failures.end() || it->second.empty()) {
      entry["reason"] = reason::kNoRuleEnabled.str();
      entry["message"] = "no enabled rule applies to BatchNormalization";
    } else {
      entry["reason"] = it->second.front().failure.code.str();
      entry["message"] = it->second.front().failure.message;
      nlohmann::json details = nlohmann::json::array();
      for (const Failure& f : it->second)
        details.push_back({{"rule", f.rule->name()}, {"reason", f.failure.code.str()}, {"message", f.failure.message}});
      entry["details"] = std::move(details);
      if (!context.options().inputDefaultsAreConstant && wouldRewriteWithInputDefaults(node, it->second, relaxed))
        entry["would_fold_with"] = "--input-defaults-are-constant";
    }
    report.add("skipped", std::move(entry));
  }
}

// --verify for the rewrite just made: its original and rewritten nodes compared (lib/verify).
nlohmann::json verifyRewrite(verify::RegionRecorder& recorder, verify::Verifier& verifier, const Model& model,
                             const Rule& rule, uint64_t seed) {
  try {
    verify::VerifySettings settings;
    settings.seed = seed;
    settings.batchNormAsInference = rule.verifiesAgainstFrozenBatchNorm();
    return verifier.verify(recorder.finish(model), settings);
  } catch (const std::exception& e) {
    return {{"passed", false},
            {"seed", seed},
            {"outputs", nlohmann::json::array()},
            {"error", std::string("cannot be verified: ") + e.what()}};
  }
}

// The verdict goes on the rule's own entries; the constants it evaluated on the way are part of its rewrite.
void attachVerdict(Report& report, const std::vector<std::pair<std::string, std::size_t>>& recorded,
                   const nlohmann::json& verdict) {
  bool attached = false;
  for (const auto& [section, index] : recorded)
    if (section != "evaluated") {
      report.entry(section, index)["verify"] = verdict;
      attached = true;
    }
  if (!attached)
    for (const auto& [section, index] : recorded) report.entry(section, index)["verify"] = verdict;
}

}  // namespace

std::string InputDefaultsHint::message() const {
  if (wouldFold == 0) return "";
  std::string text = std::to_string(wouldFold) + " BatchNormalization would fold with --input-defaults-are-constant";
  if (initializers > 0 && initializersAsInputs == initializers)
    return text + ": every initializer of this model is also a graph input";
  return text + ": " + std::to_string(initializersAsInputs) + " of its " + std::to_string(initializers) +
         " initializers are also graph inputs, which a caller may override";
}

InputDefaultsHint inputDefaultsHint(Model& model, const Report& report) {
  InputDefaultsHint hint;
  for (const auto& entry : report.section("skipped"))
    if (entry.contains("would_fold_with")) ++hint.wouldFold;
  if (hint.wouldFold == 0) return hint;  // no message: the initializers of a large model need not be read again
  for (Graph* graph : model.allGraphs())
    for (const Value* value : graph->initializers()) {
      ++hint.initializers;
      if (value->isGraphInput()) ++hint.initializersAsInputs;
    }
  return hint;
}

void runRules(Model& model, const DriverOptions& options, Report& report) {
  report.setOpset(model.opsetVersion(""));
  report.setRules(options.rules);
  report.setReorderedGraphs(model.reorderedGraphs());
  std::unordered_map<std::string, std::vector<const Rule*>> rulesByOp;
  // Rules that run once the others reached their fixed point (Rule::runsAfterFixedPoint), each root once.
  std::unordered_map<std::string, std::vector<const Rule*>> lateRulesByOp;
  for (const auto& rule : builtinRules()) {
    if (std::find(options.rules.begin(), options.rules.end(), rule->name()) == options.rules.end()) continue;
    for (const std::string& op : rule->rootOps())
      (rule->runsAfterFixedPoint() ? lateRulesByOp : rulesByOp)[op].push_back(rule.get());
  }
  for (const std::string& name : options.rules)
    if (!findRule(name)) throw std::invalid_argument("unknown rule '" + name + "'");

  const RuleContext context(model, options.ruleOptions);
  const int64_t opset = model.opsetVersion("");
  // Whether each rule knows the versions of the ops it reads and writes at this opset: once per run.
  std::unordered_map<const Rule*, std::optional<std::string>> opsetProblems;
  for (const auto* byOp : {&rulesByOp, &lateRulesByOp})
    for (const auto& [op, rules] : *byOp)
      for (const Rule* rule : rules)
        if (!opsetProblems.count(rule))
          opsetProblems[rule] = opsetProblem(rule->opVersions(), opset, "rule " + std::string(rule->name()));
  // The failures of the BatchNormalizations no rule rewrote, for their "skipped" entries.
  std::unordered_map<const Node*, std::vector<Failure>> failures;
  std::vector<Failure> nodeFailures;
  // Whether the scan's BatchNormalizations are all the model has: not once a rewrite makes a new one.
  bool batchNormsComplete = !rulesByOp.empty();
  verify::RegionRecorder recorder;
  verify::Verifier verifier;
  std::size_t verified = 0, verifyFailed = 0;
  // The roots first, in graph order (none when no rule is chosen), then the nodes rewrites touched.
  RootScan roots(
      rulesByOp.empty() ? std::vector<Graph*>{} : model.allGraphs(),
      [&rulesByOp](const Node& node) { return rulesByOp.count(node.opType()) > 0; },
      options.verify || options.injectFaultForTesting ? &recorder : nullptr);
  {
    Rewriter rewriter(model, report);
    rewriter.setListener(&roots);
    std::deque<Node*> worklist;
    std::unordered_set<Node*> queued;  // what is on the worklist
    // Only nodes some chosen rule starts from go on the worklist: most nodes of a large graph are not one.
    auto enqueue = [&](Node* node) {
      if (!node->isErased() && rulesByOp.count(node->opType()) && !roots.willYield(*node) &&
          queued.insert(node).second)
        worklist.push_back(node);
    };

    std::size_t rewrites = 0;
    bool late = false;                              // the late rules' turn: their roots are all on the worklist
    std::unordered_set<const Node*> failureLogged;  // nodes with an entry in a rule's failureSection
    for (;;) {
      Node* node = roots.next();
      if (!node) {
        if (worklist.empty() && !late && !lateRulesByOp.empty()) {
          late = true;
          rulesByOp = std::move(lateRulesByOp);
          for (Graph* graph : model.allGraphs())
            for (const auto& candidate : graph->nodes())
              if (rulesByOp.count(candidate->opType())) worklist.push_back(candidate.get());
        }
        if (worklist.empty()) break;
        node = worklist.front();
        worklist.pop_front();
        queued.erase(node);
      }
      if (node->isErased() || !node->isOnnxDomain()) continue;
      auto bucket = rulesByOp.find(node->opType());
      if (bucket == rulesByOp.end() || context.isKept(*node)) continue;
      nodeFailures.clear();
      bool rewritten = false;
      // Every rule reads input 0 and replaces output 0 of its root (BatchNormalization, Add, Mul, ...); a node
      // with either omitted ("") is malformed, and no rule looks at it.
      const bool operandOmitted = node->inputs().empty() || !node->input(0);
      const bool resultOmitted = node->outputs().empty() || !node->output(0);
      for (const Rule* rule : bucket->second) {
        if (operandOmitted || resultOmitted) {
          nodeFailures.push_back({rule, operandOmitted ? MatchFailure{reason::kMissingInput, "input 0 is omitted"}
                                                       : MatchFailure{reason::kMissingOutput, "output 0 is omitted"}});
          continue;
        }
        if (const auto& problem = opsetProblems.at(rule)) {
          nodeFailures.push_back({rule, {reason::kUnsupportedOpset, *problem}});
          continue;
        }
        MatchResult result = rule->match(*node, context);
        if (!result.matched()) {
          context.constantEvaluator().discardPending();
          const char* section = rule->failureSection();
          if (section && !result.quiet() && failureLogged.insert(node).second)
            report.add(section, nlohmann::json{{"rule", rule->name()},
                                               {"node", node->name()},
                                               {"op", node->opType()},
                                               {"reason", result.failure().code.str()},
                                               {"message", result.failure().message}});
          nodeFailures.push_back({rule, result.failure()});
          continue;
        }
        if (++rewrites > options.maxRewrites)
          throw std::runtime_error("rules did not reach a fixed point after " + std::to_string(options.maxRewrites) +
                                   " rewrites");
        rewriter.beginRule(rule);
        recorder.begin();
        // Constants the match computed from chains become initializers first (the match holds their tensors).
        for (EvaluatedConstant& evaluated : context.constantEvaluator().takePending())
          rewriter.materializeConstant(evaluated.value, std::move(evaluated.tensor), evaluated.nodes);
        rule->rewrite(result.match(), rewriter);
        if (options.injectFaultForTesting) options.injectFaultForTesting(rewriter, recorder.liveNodes());
        rewriter.beginRule(nullptr);
        const auto recorded = rewriter.takeRecorded();
        if (options.verify) {
          const nlohmann::json verdict =
              verifyRewrite(recorder, verifier, model, *rule, options.verifySeed + rewrites);
          ++verified;
          if (!verdict.value("passed", false)) ++verifyFailed;
          attachVerdict(report, recorded, verdict);
        }
        rewritten = true;
        // Look again at what changed and at whatever reads it (late rules visit each root once).
        const std::vector<Node*> touchedNodes = rewriter.takeTouched();
        if (late) break;
        for (Node* touched : touchedNodes) {
          if (touched->isErased()) continue;
          if (touched->order() == Node::kUnnumbered && touched->isOnnxOp("BatchNormalization"))
            batchNormsComplete = false;  // made by a rewrite
          enqueue(touched);
          for (Value* output : touched->outputs())
            if (output)
              for (const Use& use : output->uses()) enqueue(use.node);
        }
        break;
      }
      // Only a BatchNormalization's failures are reported (as "skipped"); other roots' are dropped.
      if (node->isOnnxOp("BatchNormalization")) {
        if (!rewritten) failures[node] = std::move(nodeFailures);
        else if (!failures.empty()) failures.erase(node);
      }
    }
    rewriter.setListener(nullptr);
    rewriter.finish();
  }
  if (options.verify)
    report.setVerification({{"rewrites", verified},
                            {"passed", verified - verifyFailed},
                            {"failed", verifyFailed},
                            {"seed", options.verifySeed}});
  recordSkippedBatchNorms(model, context, failures, batchNormsComplete ? &roots.batchNorms() : nullptr, report);
}

}  // namespace bnfold
