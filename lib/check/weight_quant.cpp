// Layers are read the way the rules read them (rules::readAffineLayer), so what info measures is what a rule
// would rewrite; the keep lists are left out there, since a kept layer is still quantized.

#include "bnfold/check/weight_quant.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>
#include <utility>

#include "bnfold/ir/model.h"
#include "bnfold/report/reason_codes.h"
#include "bnfold/report/report.h"
#include "kernels/weight_quant_stats.h"
#include "rules/affine_layer.h"

namespace bnfold {
namespace {

std::string quoted(const std::string& name) { return "'" + name + "'"; }

std::string stringField(const nlohmann::json& entry, const char* key) {
  auto it = entry.find(key);
  return it != entry.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// What reads a layer's output, for a layer equalize found no link after.
std::string readersText(const Node& node) {
  const Value* output = node.output(0);
  if (!output) return "it has no output";
  if (output->isGraphOutput()) return "its output is a graph output";
  if (output->uses().empty()) return "its output is not read";
  const Node& reader = *output->uses().front().node;
  std::string text = "its output is read by " + quoted(reader.name()) + " (" + reader.opType() + ")";
  if (output->uses().size() > 1) text += " and " + std::to_string(output->uses().size() - 1) + " more";
  return text;
}

LayerLeftOff leftOffReason(const LayerWeightQuant& layer, const Node* node, const Report& report,
                           const RuleContext& context) {
  LayerLeftOff leftOff{layer.node, layer.op, layer.graph, layer.gapDb, "", ""};
  // A layer that writes a residual stream has its pair link left (residual-add) and its output channels scaled
  // with the stream's.
  for (const auto& entry : report.section("equalized"))
    if (stringField(entry, "link") == "residual")
      for (const auto& producer : entry.value("producers", nlohmann::json::array()))
        if (stringField(producer, "layer") == layer.node) {
          leftOff.reason = kLeftOffEqualizedStillOff;
          leftOff.message = "equalized with its residual stream (" +
                            quoted(entry["residual_adds"][0].get<std::string>()) + "), still " +
                            formatDecibels(layer.gapDb) + " dB below per channel";
          return leftOff;
        }
  for (const auto& entry : report.section("not_equalized"))
    if (stringField(entry, "node") == layer.node) {
      leftOff.reason = stringField(entry, "reason");
      leftOff.message = stringField(entry, "message");
      return leftOff;
    }
  for (const auto& entry : report.section("equalized"))
    if (stringField(entry, "layer1") == layer.node) {
      leftOff.reason = kLeftOffEqualizedStillOff;
      leftOff.message = "equalized with " + quoted(stringField(entry, "layer2")) + ", still " +
                        formatDecibels(layer.gapDb) + " dB below per channel";
      return leftOff;
    }
  // Equalize records no entry for a layer it quietly passes by (read by a pool, kept by the user, ...): ask its
  // match why. A layer inside a chain is matched with the chain's first layer and says only that.
  const Rule* equalize = findRule("equalize");
  if (node && equalize) {
    const MatchResult result = context.match(*equalize, *node);
    if (!result.matched() && result.failure().code != reason::kNoFoldableLayer) {
      leftOff.reason = result.failure().code.str();
      leftOff.message = result.failure().message;
      return leftOff;
    }
  }
  leftOff.reason = kLeftOffNoLink;
  leftOff.message = "no layer after it could take its output channels' scales: " +
                    (node ? readersText(*node) : std::string("the layer is gone"));
  return leftOff;
}

}  // namespace

std::string formatDecibels(double db) {
  if (std::isinf(db)) return db > 0 ? "inf" : "-inf";
  std::ostringstream text;
  text.setf(std::ios::fixed);
  text.precision(1);
  text << db;
  return text.str();
}

std::vector<LayerWeightQuant> layerWeightQuant(Model& model, const RuleOptions& options) {
  RuleOptions everyLayer = options;
  everyLayer.keepNodes.clear();
  everyLayer.keepOps.clear();
  const RuleContext context(model, everyLayer);
  std::vector<LayerWeightQuant> layers;
  for (Graph* graph : model.allGraphs())
    for (const auto& node : graph->nodes()) {
      if (!rules::isAffineLayerOp(*node)) continue;
      const auto layer = rules::readAffineLayer(*node, context, nullptr);
      if (!layer) continue;
      const kernels::WeightQuantStats stats =
          kernels::weightQuantStats(layer->layout, layer->weight->toDoubles(), layer->weight->dims());
      layers.push_back({node->name(), node->opType(), graph->name(), stats.channels, stats.deadChannels,
                        stats.rangeSpread, stats.perTensorSqnrDb, stats.perChannelSqnrDb, stats.gapDb()});
    }
  return layers;
}

std::vector<LayerLeftOff> layersLeftOff(const std::vector<LayerWeightQuant>& layers, Model& model,
                                        const Report& report, const RuleOptions& options) {
  std::map<std::string, const Node*> nodes;
  for (Graph* graph : model.allGraphs())
    for (const auto& node : graph->nodes()) nodes.emplace(node->name(), node.get());
  const RuleContext context(model, options);
  std::vector<LayerLeftOff> leftOff;
  for (const LayerWeightQuant& layer : layers) {
    if (!(layer.gapDb > kWeightQuantGapLimitDb)) continue;
    auto it = nodes.find(layer.node);
    leftOff.push_back(leftOffReason(layer, it == nodes.end() ? nullptr : it->second, report, context));
  }
  return leftOff;
}

namespace {

// The layers a run replaced by a new node (a MatMul that became a Gemm), as each report entry that did it names
// them: "replaced_node" -> "into" (bn-fold, bn-forward), "layer" or "node" -> "replaced_by" (bias-add, and
// norm-affine-forward's per-layer entries). New name -> old name.
void collectRenamedLayers(const nlohmann::json& entry, std::map<std::string, std::string>& oldNameOf) {
  if (entry.is_array()) {
    for (const nlohmann::json& item : entry) collectRenamedLayers(item, oldNameOf);
    return;
  }
  if (!entry.is_object()) return;
  auto text = [&](const char* key) -> const std::string* {
    auto it = entry.find(key);
    return it != entry.end() && it->is_string() ? &it->get_ref<const std::string&>() : nullptr;
  };
  const std::string* oldName = text("replaced_node");
  const std::string* newName = oldName ? text("into") : text("replaced_by");
  if (!oldName) oldName = text("layer") ? text("layer") : text("node");
  if (oldName && newName && *oldName != *newName) oldNameOf.emplace(*newName, *oldName);
  for (const auto& item : entry.items())
    if (item.value().is_array()) collectRenamedLayers(item.value(), oldNameOf);
}

}  // namespace

WeightQuantSummary summarizeWeightQuant(Model& model, const DriverOptions& options) {
  DriverOptions foldOptions = options;
  foldOptions.verify = false;
  foldOptions.rules.clear();
  DriverOptions equalizeOptions = foldOptions;
  for (const std::string& name : options.rules) {
    const Rule* rule = findRule(name);
    (rule && rule->runsAfterFixedPoint() ? equalizeOptions : foldOptions).rules.push_back(name);
  }
  if (std::find(equalizeOptions.rules.begin(), equalizeOptions.rules.end(), "equalize") == equalizeOptions.rules.end())
    equalizeOptions.rules.push_back("equalize");

  WeightQuantSummary summary;
  std::map<std::pair<std::string, std::string>, std::size_t> rowOf;  // (graph, node) -> index in summary.layers
  // A layer a rule replaced keeps its row (and the name it was loaded with): one row per layer, not one per name.
  std::map<std::string, std::string> oldNameOf;
  auto rowNameOf = [&](const LayerWeightQuant& layer) {
    std::string name = layer.node;
    for (std::size_t hops = 0; hops < oldNameOf.size(); ++hops) {
      auto old = oldNameOf.find(name);
      if (old == oldNameOf.end() || !rowOf.count({layer.graph, old->second})) break;
      name = old->second;
    }
    return name;
  };
  auto take = [&](std::optional<LayerWeightQuant> LayerWeightQuantStates::*state) {
    for (LayerWeightQuant& layer : layerWeightQuant(model, options.ruleOptions)) {
      auto [it, added] = rowOf.emplace(std::make_pair(layer.graph, rowNameOf(layer)), summary.layers.size());
      if (added) summary.layers.push_back({layer.node, layer.op, layer.graph, {}, {}, {}});
      LayerWeightQuantStates& row = summary.layers[it->second];
      row.op = layer.op;
      row.*state = std::move(layer);
    }
  };
  take(&LayerWeightQuantStates::loaded);
  Report foldReport;
  runRules(model, foldOptions, foldReport);
  collectRenamedLayers(foldReport.json(), oldNameOf);
  take(&LayerWeightQuantStates::folded);
  Report equalizeReport;
  runRules(model, equalizeOptions, equalizeReport);
  collectRenamedLayers(equalizeReport.json(), oldNameOf);
  take(&LayerWeightQuantStates::equalized);
  std::vector<LayerWeightQuant> equalized;
  for (const LayerWeightQuantStates& row : summary.layers)
    if (row.equalized) equalized.push_back(*row.equalized);
  summary.leftOff = layersLeftOff(equalized, model, equalizeReport, options.ruleOptions);
  return summary;
}

}  // namespace bnfold
