#pragma once
/// \file
/// A rewrite rule: a stable kebab-case name, the op types it is rooted at, a `match` that inspects the graph
/// and either returns what it found or a reason code, and a `rewrite` that cannot fail. Every fallible check
/// belongs in `match`, so a rule never gives up half-way through changing a graph.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bnfold/ir/model.h"
#include "bnfold/report/reason_codes.h"

namespace bnfold {

class Rewriter;
class ConstantEvaluator;
class PreActivationStatistics;

/// Why a rule did not apply: a code from the closed list (bnfold/report/reason_codes.h) and a sentence.
struct MatchFailure {
  MatchFailure() = default;
  MatchFailure(ReasonCode code_, std::string message_, bool quiet_ = false)
      : code(code_), message(std::move(message_)), quiet(quiet_) {}
  ReasonCode code;
  std::string message;
  /// Not worth a report entry even for a rule with a failureSection (e.g. a node that is not where the rule starts).
  bool quiet = false;
};

/// What a rule found; each rule derives its own.
struct Match {
  virtual ~Match() = default;
};

/// A value a match found constant by evaluating the chain of pure ops behind it (RuleContext::constantOf): its
/// tensor and the nodes that computed it, in evaluation order. It belongs to the match that asked: applying the
/// match turns it into an initializer first (Rewriter::apply).
struct EvaluatedConstant {
  const Value* value = nullptr;
  std::unique_ptr<Tensor> tensor;
  std::vector<const Node*> nodes;
};

class MatchResult {
 public:
  static MatchResult failure(ReasonCode code, std::string message) {
    MatchResult result;
    result.failure_ = {code, std::move(message)};
    return result;
  }
  /// A failure not worth a report entry even for a rule with a failureSection (e.g. a node that is not where the
  /// rule starts).
  static MatchResult quietFailure(ReasonCode code, std::string message) {
    MatchResult result;
    result.failure_ = {code, std::move(message), true};
    return result;
  }
  template <typename M>
  static MatchResult success(std::unique_ptr<M> match) {
    MatchResult result;
    result.match_ = std::move(match);
    return result;
  }
  bool matched() const { return match_ != nullptr; }
  const MatchFailure& failure() const { return failure_; }
  bool quiet() const { return failure_.quiet; }
  Match& match() { return *match_; }
  /// The constants the match evaluated from chains (set by RuleContext::match on success).
  std::vector<EvaluatedConstant>& evaluatedConstants() { return evaluatedConstants_; }

 private:
  friend class RuleContext;
  std::unique_ptr<Match> match_;
  MatchFailure failure_;
  std::vector<EvaluatedConstant> evaluatedConstants_;
};

/// Versions of one ONNX op (the since_version of each of its schemas), ascending.
struct OpVersions {
  std::string op;
  std::vector<int64_t> versions;
};

/// Options the user sets that rules consult.
struct RuleOptions {
  /// Initializers that are also graph inputs (IR >= 4) are overridable defaults; treat them as constants.
  bool inputDefaultsAreConstant = false;
  /// Turn training-mode BatchNormalization into inference mode (changes the function; off by default).
  bool freezeTrainingBatchNorm = false;
  /// Node-name glob patterns and op types no rule may touch.
  std::vector<std::string> keepNodes;
  std::vector<std::string> keepOps;
  /// Constant chains (Identity, Cast, Reshape, Add(var, eps), ... of constants) are evaluated for the rules only
  /// when no op's result is larger than this many bytes.
  int64_t maxConstantBytes = int64_t{64} << 20;
  /// A rule may use a second thread for a large computation (equalize's analysis of a long chain); the batch
  /// command turns this off when it folds several models at once.
  bool concurrent = true;
};

class Rule;

/// What a rule sees besides the node: the model and the user's options.
class RuleContext {
 public:
  RuleContext(const Model& model, const RuleOptions& options);
  /// The context keeps a reference to the options, so they must outlive it.
  RuleContext(const Model& model, RuleOptions&& options) = delete;
  ~RuleContext();
  RuleContext(const RuleContext&) = delete;
  RuleContext& operator=(const RuleContext&) = delete;
  const Model& model() const { return model_; }
  const RuleOptions& options() const { return options_; }
  int64_t opset() const { return model_.opsetVersion(""); }

  /// True when the user asked to keep this node (--keep / --keep-op): no rule may change or remove it.
  bool isKept(const Node& node) const;

  /// The constant tensor behind `value` when it is a compile-time constant under the user's options, else
  /// null with `whyNot` (when given) set to a failure saying why (e.g. a graph input fed at run time). A value
  /// computed from constants by a chain of pure ops (Identity, Cast, Reshape, Add(var, eps), ...) counts: it is
  /// evaluated, and when the match that asked goes through match() below and succeeds, its result carries the
  /// tensor (MatchResult::evaluatedConstants). What was evaluated is forgotten once the model changes.
  const Tensor* constantOf(const Value* value, MatchFailure* whyNot = nullptr) const;
  /// The values of an integer constant (axes, a shape): as constantOf, and also nullopt with `whyNot` when the
  /// constant holds no integers (an invalid model: such an operand is int64).
  std::optional<std::vector<int64_t>> integersOf(const Value* value, MatchFailure* whyNot = nullptr) const;

  /// Runs `rule`'s match at `root`; a successful result carries the constants the match evaluated.
  MatchResult match(const Rule& rule, const Node& root) const;

  /// The value's dims as far as known (-1 for an unknown dim), or nullopt when even the rank is unknown: the shape
  /// layer's answer (bnfold::analysis::knownShape), remembered between matches. While the context follows the
  /// Rewriter that changes the model, a change forgets only the shapes it can affect; otherwise any change forgets all.
  std::optional<std::vector<int64_t>> knownShape(const Value& value) const;
  /// From now until stopFollowing, `rewriter` tells this context of every change it makes.
  void followChanges(Rewriter& rewriter) const;
  void stopFollowing(Rewriter& rewriter) const;
  /// The layers' output statistics earlier rewrites recorded (pre_activation_statistics.h), or null when the caller
  /// keeps none.
  const PreActivationStatistics* statistics() const { return statistics_; }
  void setStatistics(const PreActivationStatistics* statistics) { statistics_ = statistics; }

 private:
  /// constantOf before its type check: a constant of any element type.
  const Tensor* anyConstantOf(const Value* value, MatchFailure* whyNot) const;

  class Shapes;
  const Model& model_;
  const RuleOptions& options_;
  std::unique_ptr<ConstantEvaluator> evaluator_;
  std::unique_ptr<Shapes> shapes_;
  const PreActivationStatistics* statistics_ = nullptr;
};

class Rule {
 public:
  virtual ~Rule() = default;
  /// Stable kebab-case id, used by --rules and in the report.
  virtual const char* name() const = 0;
  /// One line for --help.
  virtual const char* summary() const = 0;
  /// Op types (standard ONNX domain) this rule is rooted at.
  virtual std::vector<std::string> rootOps() const = 0;
  /// Every standard-domain op the rule matches, folds into, looks through or emits, with the versions
  /// (since_version) it was written for.
  /// The driver leaves a model alone, with reason unsupported-opset, when its opset puts any of these ops at
  /// another version, or is newer than bnfold knows: a new version may mean something else.
  virtual std::vector<OpVersions> opVersions() const = 0;
  virtual bool enabledByDefault() const { return true; }
  /// For --verify: the rewrite is meant to equal the original with training-mode BatchNormalization evaluated in
  /// inference mode (train-bn-freeze changes the function on purpose), not the original itself.
  virtual bool verifiesAgainstFrozenBatchNorm() const { return false; }
  /// Runs only once the other rules reached their fixed point, visiting each of its roots once in graph order
  /// (a rule that computes a fixed point of its own, like equalize over a whole chain). The driver knows nothing of
  /// this: lib/check/fold.cpp runs each such rule in a driveRules of its own (in priority order) with
  /// RewriteDriverOptions::revisitTouched off.
  virtual bool runsAfterFixedPoint() const { return false; }
  /// Reads RuleContext::statistics(): lib/check/fold.cpp records them only when an enabled rule does.
  virtual bool readsPreActivationStatistics() const { return false; }
  /// The report section where lib/check/fold.cpp records this rule's match failures (those not quiet), one entry per
  /// node: {rule, node, op, reason, message}. Null: failures are not reported (BatchNormalization's go to `skipped`).
  virtual const char* failureSection() const { return nullptr; }

  /// Inspects `root` without changing anything.
  virtual MatchResult match(const Node& root, const RuleContext& context) const = 0;
  /// Applies a successful match through the rewriter. Must not fail.
  virtual void rewrite(Match& match, Rewriter& rewriter) const = 0;
};

/// True when `name` matches the shell-style glob `pattern` (`*`, `?`, `[...]`).
bool globMatch(const std::string& pattern, const std::string& name);

}  // namespace bnfold
