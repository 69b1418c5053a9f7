// The report's sections become categories, so findings do not need to know the rules by name, and a new rule's
// rewrites are findings as soon as the rule records them.

#include "bnfold/check/findings.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <sstream>
#include <utility>

#include "bnfold/error.h"
#include "bnfold/ir/model.h"
#include "bnfold/report/reason_codes.h"
#include "bnfold/report/report.h"
#include "bnfold/check/fold.h"
#include "bnfold/check/weight_quant.h"
#include "rules/batch_norm.h"

namespace bnfold {
namespace {

std::string stringField(const nlohmann::json& entry, const char* key) {
  auto it = entry.find(key);
  return it != entry.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string singleQuoted(const std::string& name) { return "'" + name + "'"; }

// The category of a rewrite recorded in `section`. A frozen BN is a training-mode BN in the checked model.
std::string categoryOfSection(const std::string& section) {
  static const std::map<std::string, std::string> categories = {
      {"folds", "foldable-bn"},      {"expanded", "training-bn"},    {"frozen", "training-bn"},
      {"bias_absorbed", "bias-add"}, {"scale_folded", "scale-fold"}, {"decomposed", "decomposable-bn"}};
  auto it = categories.find(section);
  return it == categories.end() ? "other-rewrite" : it->second;
}

// Report entries name the node a rewrite removes and the layer it goes into with a few conventional fields
// (not one per rule): "node" (with "op"), or "bn" / "add" / "mul"; and "into" / "layer" with "<field>_op".
struct NamedField {
  const char* field;
  const char* op;  // the op the field implies, or the field holding the op
};
constexpr NamedField kRemovedNodeFields[] = {
    {"node", nullptr}, {"bn", "BatchNormalization"}, {"add", "Add"}, {"mul", "Mul"}};
constexpr NamedField kTargetFields[] = {{"into", "into_op"}, {"layer", "layer_op"}};

std::string rewriteMessage(const std::string& section, const Finding& finding) {
  const std::string who = (finding.op.empty() ? std::string("node") : finding.op) + " " + singleQuoted(finding.node);
  std::string target;
  for (const NamedField& field : kTargetFields) {
    const std::string name = stringField(finding.entry, field.field);
    if (name.empty()) continue;
    const std::string op = stringField(finding.entry, field.op);
    target = (op.empty() ? "" : op + " ") + singleQuoted(name);
    break;
  }
  const std::string into = target.empty() ? "" : " into " + target;
  const std::string by = finding.rule.empty() ? "" : " (" + finding.rule + ")";
  const std::string cause = stringField(finding.entry, "cause");
  const std::string because = cause.empty() ? "" : " [" + cause + "]";
  if (section == "folds") return who + " can be folded" + into + by;
  if (section == "expanded")
    return "training-mode " + who + because + " computes batch statistics; fold would expand it into primitive ops" + by;
  if (section == "frozen") return "training-mode " + who + because + " would be frozen to inference mode" + by;
  if (section == "bias_absorbed") return who + " can be absorbed into the bias of " + (target.empty() ? "a layer" : target) + by;
  if (section == "scale_folded") return who + " can be folded into the weights of " + (target.empty() ? "a layer" : target) + by;
  if (section == "decomposed") return who + " would be decomposed into elementwise ops" + by;
  return who + ": " + section + into + by;
}

// A report section's entry as a finding (every section but "skipped").
Finding rewriteFinding(const std::string& section, const nlohmann::json& entry) {
  Finding finding;
  finding.category = categoryOfSection(section);
  finding.entry = entry;
  for (const NamedField& field : kRemovedNodeFields) {
    finding.node = stringField(entry, field.field);
    if (finding.node.empty()) continue;
    finding.op = field.op ? field.op : stringField(entry, "op");
    break;
  }
  if (finding.op.empty() && finding.category.find("-bn") != std::string::npos) finding.op = "BatchNormalization";
  finding.graph = stringField(entry, "graph");
  finding.rule = stringField(entry, "rule");
  finding.message = rewriteMessage(section, finding);
  return finding;
}

std::string numberText(const nlohmann::json& value) {
  if (!value.is_number()) return value.is_string() ? value.get<std::string>() : "?";
  std::ostringstream text;
  text.precision(3);
  text << value.get<double>();
  return text.str();
}

// A rewrite whose "verify" object did not pass.
Finding verifyFailedFinding(const std::string& section, const nlohmann::json& entry) {
  Finding finding = rewriteFinding(section, entry);
  finding.category = "verify-failed";
  finding.severity = Severity::Error;
  const nlohmann::json& verify = entry["verify"];
  std::string what = finding.rule.empty() ? section : finding.rule;
  what += " of " + (finding.op.empty() ? std::string("node") : finding.op) + " " + singleQuoted(finding.node);
  for (const NamedField& field : kTargetFields) {
    const std::string name = stringField(entry, field.field);
    if (!name.empty()) {
      what += " into " + singleQuoted(name);
      break;
    }
  }
  if (verify.contains("error") && verify["error"].is_string())
    finding.message = what + " failed verification: " + verify["error"].get<std::string>();
  else
    finding.message = what + " failed verification: max relative error " + numberText(verify["max_rel_error"]) +
                      " > tolerance " + numberText(verify["tolerance"]) + " (max absolute error " +
                      numberText(verify["max_abs_error"]) + ")";
  return finding;
}

// A graph whose nodes were not stored in topological order (sorted on load; fold writes it sorted).
Finding reorderedFinding(const nlohmann::json& entry) {
  Finding finding;
  finding.category = "unsorted-graph";
  finding.entry = entry;
  finding.graph = stringField(entry, "graph");
  const std::string owner = stringField(entry, "subgraph_of");
  const std::string where = owner.empty() ? "graph " + singleQuoted(finding.graph)
                                          : "subgraph " + singleQuoted(finding.graph) + " of node " + singleQuoted(owner);
  const auto moved = entry.value("moved_nodes", std::size_t{0});
  finding.message = "the nodes of " + where + " are not in topological order (" + std::to_string(moved) +
                    (moved == 1 ? " node" : " nodes") + " out of place); fold writes them sorted";
  return finding;
}

// A BatchNormalization left in place. Training mode is decided from the node itself, so a training-mode BN is
// found even when no rule that handles training mode ran.
Finding skippedFinding(const nlohmann::json& entry, const Node* node, int64_t opset) {
  Finding finding;
  finding.entry = entry;
  finding.node = stringField(entry, "node");
  finding.op = stringField(entry, "op");
  finding.graph = stringField(entry, "graph");
  finding.reason = stringField(entry, "reason");
  auto details = entry.find("details");
  if (details != entry.end() && details->is_array() && !details->empty())
    finding.rule = stringField(details->front(), "rule");
  const std::string why = finding.reason + ": " + stringField(entry, "message");
  const std::string who = (finding.op.empty() ? std::string("BatchNormalization") : finding.op) + " " + singleQuoted(finding.node);
  const rules::BatchNormForm form = node ? rules::readBatchNormForm(*node, opset) : rules::BatchNormForm{};
  if (form.training) {
    // Keeping a training-mode BN does not make it an inference model: it stays a training-bn finding.
    finding.category = "training-bn";
    finding.message = "training-mode " + who + " [" + form.trainingCause + "] is left in place: " + why;
  } else if (finding.reason == reason::kKeptByUser.str()) {
    finding.category = "kept-bn";
    finding.message = who + " is kept by --keep/--keep-op";
  } else {
    finding.category = "unfoldable-bn";
    finding.message = who + " cannot be folded: " + why;
  }
  return finding;
}

bool ranEqualize(const Report& report) {
  const nlohmann::json& rules = report.json()["rules"];
  return rules.is_array() && std::find(rules.begin(), rules.end(), "equalize") != rules.end();
}

// A layer equalization left more than kWeightQuantGapLimitDb off, with the measured figures as its entry.
Finding weightQuantGapFinding(const LayerWeightQuant& layer, const LayerLeftOff& leftOff) {
  Finding finding;
  finding.category = "weight-quant-gap";
  finding.node = layer.node;
  finding.op = layer.op;
  finding.graph = layer.graph;
  finding.rule = "equalize";
  finding.reason = leftOff.reason;
  auto sqnr = [](double db) { return std::isfinite(db) ? nlohmann::json(db) : nlohmann::json(nullptr); };
  finding.entry = {{"node", layer.node},
                   {"op", layer.op},
                   {"per_tensor_sqnr_db", sqnr(layer.perTensorSqnrDb)},
                   {"per_channel_sqnr_db", sqnr(layer.perChannelSqnrDb)},
                   {"gap_db", sqnr(layer.gapDb)},
                   {"reason", leftOff.reason},
                   {"message", leftOff.message}};
  finding.message = layer.op + " " + singleQuoted(layer.node) + ": per-tensor int8 weight SQNR " +
                    formatDecibels(layer.gapDb) + " dB below per channel after equalize [" + leftOff.reason + ": " +
                    leftOff.message + "]; quantize it per channel or keep its BatchNormalization (--keep)";
  return finding;
}

}  // namespace

const std::vector<FindingCategory>& findingCategories() {
  static const std::vector<FindingCategory> categories = {
      {"foldable-bn", "a BatchNormalization `fold` would fold into a layer before or after it"},
      {"training-bn", "a training-mode BatchNormalization (expanded, frozen, or left in place)"},
      {"unfoldable-bn", "an inference-mode BatchNormalization no rule can remove (with the rule's reason code)"},
      {"kept-bn", "an inference-mode BatchNormalization kept by --keep/--keep-op"},
      {"bias-add", "an Add that would become a layer's bias"},
      {"scale-fold", "a Mul that would be folded into a layer's weights"},
      {"decomposable-bn", "a BatchNormalization that would be decomposed into elementwise ops"},
      {"other-rewrite", "any other rewrite a rule would do"},
      {"unsorted-graph", "a graph whose nodes are not stored in topological order (fold sorts them and says so)"},
      {"input-defaults", "BatchNormalization left only because its parameters are initializers that are also graph "
                         "inputs; one finding per model saying how many would fold with --input-defaults-are-constant"},
      {"weight-quant-gap", "with --equalize: a layer whose per-tensor int8 weight SQNR stays more than 10 dB below "
                           "per channel after fold and equalize, with the reason equalize could not reach it"},
      {"verify-failed", "a rewrite whose --verify check failed: the rewritten nodes do not compute what the original "
                        "did (always fails, exit code 1)"},
      {"invalid-model", "the model cannot be read or is structurally invalid (always fails, exit code 2)"}};
  return categories;
}

std::set<std::string> parseFailOn(const std::string& text) {
  const auto& categories = findingCategories();
  std::set<std::string> chosen;
  std::stringstream stream(text);
  for (std::string token; std::getline(stream, token, ',');) {
    token.erase(0, token.find_first_not_of(" \t"));
    token.erase(token.find_last_not_of(" \t") + 1);
    if (token.empty()) continue;
    const auto known = std::find_if(categories.begin(), categories.end(),
                                    [&](const FindingCategory& category) { return token == category.name; });
    if (token == "none") {
      chosen.clear();
    } else if (token == "all") {
      for (const auto& category : categories) chosen.insert(category.name);
    } else if (known != categories.end()) {
      chosen.insert(token);
    } else {
      std::string names;
      for (const auto& category : categories) names += (names.empty() ? "" : ", ") + std::string(category.name);
      throw Error("", "--fail-on: unknown category '" + token + "' (known: " + names + ", all, none)");
    }
  }
  return chosen;
}

const char* severityName(Severity severity) { return severity == Severity::Error ? "error" : "warning"; }

std::vector<Finding> findingsOf(Model& model, const Report& report, const std::set<std::string>& failOn,
                                const RuleOptions& ruleOptions) {
  std::vector<Finding> findings;
  for (const auto& entry : report.section(kReorderedSection)) findings.push_back(reorderedFinding(entry));
  for (const char* section : kReportSections) {
    // A constant chain evaluated for a rule is part of that rule's rewrite, found there.
    if (std::string(section) == "skipped" || std::string(section) == "evaluated") continue;
    for (const auto& entry : report.section(section)) findings.push_back(rewriteFinding(section, entry));
  }
  // Sections a newer rule may add are findings too.
  for (const auto& [key, value] : report.json().items()) {
    // Nodes and links a rule left alone change nothing.
    if (!value.is_array() || Report::sectionKind(key) != SectionKind::Rewrites) continue;
    if (std::find(std::begin(kReportSections), std::end(kReportSections), key) != std::end(kReportSections)) continue;
    for (const auto& entry : value) findings.push_back(rewriteFinding(key, entry));
  }
  // The BNs left in place, by graph and name, to read their form.
  std::map<std::pair<std::string, std::string>, const Node*> remaining;
  for (Graph* graph : model.allGraphs())
    for (const auto& node : graph->nodes())
      if (node->isOnnxOp("BatchNormalization")) remaining.emplace(std::make_pair(graph->name(), node->name()), node.get());
  const int64_t opset = model.opsetVersion("");
  for (const auto& entry : report.section("skipped")) {
    // BNs that would fold with --input-defaults-are-constant make one finding for the model, not one each.
    if (entry.contains("would_fold_with")) continue;
    auto it = remaining.find({stringField(entry, "graph"), stringField(entry, "node")});
    findings.push_back(skippedFinding(entry, it == remaining.end() ? nullptr : it->second, opset));
  }
  const InputDefaultsHint hint = inputDefaultsHint(model, report);
  if (hint.wouldFold > 0) {
    Finding finding;
    finding.category = "input-defaults";
    finding.op = "BatchNormalization";
    finding.reason = reason::kParamsOverridable.str();
    finding.message = hint.message();
    findings.push_back(std::move(finding));
  }
  if (ranEqualize(report)) {
    const std::vector<LayerWeightQuant> layers = layerWeightQuant(model, ruleOptions);
    std::map<std::string, const LayerWeightQuant*> byName;
    for (const LayerWeightQuant& layer : layers) byName.emplace(layer.node, &layer);
    for (const LayerLeftOff& leftOff : layersLeftOff(layers, model, report, ruleOptions))
      findings.push_back(weightQuantGapFinding(*byName.at(leftOff.node), leftOff));
  }
  for (Finding& finding : findings)
    finding.severity = failOn.count(finding.category) ? Severity::Error : Severity::Warning;
  for (Finding& finding : failedVerifications(report)) findings.push_back(std::move(finding));
  return findings;
}

std::vector<Finding> failedVerifications(const Report& report) {
  std::vector<Finding> findings;
  if (!report.hasVerification()) return findings;  // no verdicts, and no need to turn every record into JSON
  for (const auto& [section, entries] : report.json().items()) {
    if (!entries.is_array() || section == "rules" || section == kReorderedSection) continue;
    for (const auto& entry : entries)
      if (entry.is_object() && entry.contains("verify") && !entry["verify"].value("passed", false))
        findings.push_back(verifyFailedFinding(section, entry));
  }
  return findings;
}

Finding invalidModelFinding(const std::string& message) {
  Finding finding;
  finding.category = "invalid-model";
  finding.severity = Severity::Error;
  finding.message = message;
  return finding;
}

}  // namespace bnfold
