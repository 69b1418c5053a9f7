// `bnfold info MODEL`: what is in a model, with an eye on BatchNormalization; with --weights, what folding and
// equalization do to its layers' int8 weights (the library measures, bnfold/check/weight_quant.h; this formats).

#include <algorithm>
#include <iostream>
#include <iomanip>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "batch.h"
#include "bnfold/api/api.h"
#include "bnfold/error.h"
#include "bnfold/io/model_io.h"
#include "commands.h"

namespace bnfold::cli {
namespace {

struct InfoOptions {
  std::string model;
  bool json = false;
  bool weights = false;
  RuleFlags ruleFlags;
};

void printText(const nlohmann::json& info) {
  std::cout << info["file"].get<std::string>() << "\n";
  std::cout << "  ir_version:   " << info["ir_version"] << "\n";
  std::cout << "  producer:     " << info["producer"].get<std::string>() << "\n";
  std::cout << "  opsets:      ";
  for (auto& [domain, version] : info["opsets"].items()) std::cout << " " << domain << "=" << version;
  std::cout << "\n  graphs:       " << info["graphs"] << "\n";
  std::cout << "  nodes:        " << info["nodes"] << "\n";
  std::cout << "  initializers: " << info["initializers"] << " (" << info["initializer_bytes"] << " bytes)\n";
  std::cout << "  ops:\n";
  for (auto& entry : info["ops"])
    std::cout << "    " << entry["count"].get<int64_t>() << "\t" << entry["op"].get<std::string>() << "\n";
  const auto& bn = info["batch_normalization"];
  std::cout << "  BatchNormalization: " << bn["count"];
  if (bn["count"].get<int64_t>() > 0) {
    std::cout << " (input produced by:";
    bool first = true;
    for (auto& [op, count] : bn["input_producers"].items()) {
      std::cout << (first ? " " : ", ") << op << " " << count;
      first = false;
    }
    std::cout << ")";
  }
  std::cout << "\n";
}

// "100.0x", "100.0x, 2 dead", "all dead": the spread of the output channels' weight ranges.
std::string spreadText(const LayerWeightQuant& layer) {
  if (layer.rangeSpread <= 0) return "all dead";
  std::ostringstream text;
  text.setf(std::ios::fixed);
  text.precision(1);
  text << layer.rangeSpread << "x";
  if (layer.deadChannels > 0) text << ", " << layer.deadChannels << " dead";
  return text.str();
}

// The widths of a state's cell: "spread  per-tensor/per-channel  gap".
struct CellWidths {
  int spread = 6;
  int cell() const { return spread + 19; }
};

std::string stateText(const std::optional<LayerWeightQuant>& layer, const CellWidths& widths) {
  if (!layer) return "-";
  std::ostringstream text;
  text << std::left << std::setw(widths.spread) << spreadText(*layer) << std::right << std::setw(7)
       << formatDecibels(layer->perTensorSqnrDb) << "/" << std::left << std::setw(5)
       << formatDecibels(layer->perChannelSqnrDb) << std::right << std::setw(6) << formatDecibels(layer->gapDb);
  return text.str();
}

void printWeightsText(const WeightQuantSummary& summary) {
  if (summary.layers.empty()) {
    std::cout << "  weights: no Conv, ConvTranspose, Gemm or MatMul with a constant floating weight (initializers "
                 "that are also graph inputs count only with --input-defaults-are-constant)\n";
    return;
  }
  std::size_t nameWidth = 5, opWidth = 2;
  CellWidths widths;
  for (const auto& row : summary.layers) {
    nameWidth = std::max(nameWidth, row.node.size());
    opWidth = std::max(opWidth, row.op.size());
    for (const auto* state : {&row.loaded, &row.folded, &row.equalized})
      if (*state) widths.spread = std::max(widths.spread, static_cast<int>(spreadText(**state).size()));
  }
  const int stateWidth = std::max(widths.cell(), 10);
  std::cout << "  weights, int8 symmetric (step max/127): spread = max/min of the output channels' max|W|, then SQNR "
               "in dB per tensor/per channel and the gap\n";
  std::cout << "    " << std::left << std::setw(static_cast<int>(nameWidth)) << "layer" << "  "
            << std::setw(static_cast<int>(opWidth)) << "op" << "  " << std::right << std::setw(5) << "ch" << "  "
            << std::left << std::setw(stateWidth) << "as loaded" << "  " << std::setw(stateWidth) << "after fold"
            << "  after fold --equalize\n";
  for (const auto& row : summary.layers) {
    const auto& any = row.equalized ? row.equalized : row.folded ? row.folded : row.loaded;
    std::cout << "    " << std::left << std::setw(static_cast<int>(nameWidth)) << row.node << "  "
              << std::setw(static_cast<int>(opWidth)) << row.op << "  " << std::right << std::setw(5) << any->channels
              << "  " << std::left << std::setw(stateWidth) << stateText(row.loaded, widths) << "  "
              << std::setw(stateWidth) << stateText(row.folded, widths) << "  " << stateText(row.equalized, widths)
              << "\n";
  }
  if (summary.leftOff.empty()) {
    std::cout << "  no layer stays more than " << formatDecibels(kWeightQuantGapLimitDb)
              << " dB below per channel after fold --equalize\n";
    return;
  }
  std::cout << "  " << summary.leftOff.size() << (summary.leftOff.size() == 1 ? " layer stays" : " layers stay")
            << " more than " << formatDecibels(kWeightQuantGapLimitDb)
            << " dB below per channel after fold --equalize:\n";
  for (const LayerLeftOff& layer : summary.leftOff)
    std::cout << "    " << layer.node << " (" << layer.op << ")  " << formatDecibels(layer.gapDb) << " dB  "
              << layer.reason << ": " << layer.message << "\n";
  std::cout << "  hint: quantize these layers' weights per channel, or keep the BatchNormalization before them "
               "unfolded (fold --keep NAME)\n";
}

bool ruleFlagsGiven(const RuleFlags& flags) {
  const RuleFlags defaults;
  return flags.rules != defaults.rules || !flags.keepNodes.empty() || !flags.keepOps.empty() ||
         flags.inputDefaultsAreConstant || flags.freezeTrainingBatchNorm || flags.equalize ||
         flags.maxConstantMiB != defaults.maxConstantMiB || flags.verify;
}

}  // namespace

CommandRunner addInfoCommand(CLI::App& app) {
  auto options = std::make_shared<InfoOptions>();
  CLI::App* command = app.add_subcommand("info", "Show opsets, an op histogram and the BatchNormalization nodes; "
                                                  "with --weights, what folding costs int8 weights");
  command->add_option("model", options->model, "ONNX model file")->required();
  command->add_flag("--json", options->json, "Print one JSON document instead of text");
  command->add_flag("--weights", options->weights,
                    "Per layer: the spread of its output channels' weight ranges and its int8 weight SQNR per tensor "
                    "against per channel, as loaded, after fold and after fold --equalize (in memory; the rule "
                    "options below apply), and the layers equalize leaves more than 10 dB off, with the reason");
  addRuleFlags(*command, options->ruleFlags);
  // --weights shows the model with and without equalize anyway, and does not verify (fold --equalize --verify does).
  command->get_option("--equalize")->group("");
  command->get_option("--verify")->group("");
  command->footer(
      "\nThe rule options (--rules, --keep, ...) steer the in-memory fold of --weights and need it.\n"
      "See docs/quantization.md, \"What folding costs: info --weights\".\n");
  return [options] {
    if (!options->weights && ruleFlagsGiven(options->ruleFlags))
      throw Error("", "info: the rule options (--rules, --keep, ...) apply only with --weights");
    if (options->ruleFlags.verify)
      throw Error("", "info --weights does not verify; run fold --equalize --verify for that");
    const DriverOptions driverOptions = driverOptionsFrom(options->ruleFlags);
    LoadOptions loadOptions;
    // --weights names unnamed nodes as fold does, so a layer keeps its name through the three states.
    loadOptions.nameUnnamedNodes = options->weights;
    std::optional<WeightQuantSummary> weights;
    nlohmann::json info = namingFile(options->model, [&] {
      auto model = loadModel(options->model, loadOptions);
      nlohmann::json described = describeModel(*model);
      if (options->weights) weights = summarizeWeightQuant(*model, driverOptions);  // folds the model in memory
      return described;
    });
    if (options->json) {
      if (weights) info["weights"] = weightQuantJson(*weights);
      std::cout << info.dump(2) << "\n";
    } else {
      printText(info);
      if (weights) printWeightsText(*weights);
    }
    return kExitOk;
  };
}

}  // namespace bnfold::cli
