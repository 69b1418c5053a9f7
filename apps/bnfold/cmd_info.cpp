// `bnfold info MODEL`: what is in a model, with an eye on BatchNormalization.

#include <algorithm>
#include <iostream>
#include <map>

#include <nlohmann/json.hpp>

#include "bnfold/io/model_io.h"
#include "commands.h"

namespace bnfold::cli {
namespace {

struct InfoOptions {
  std::string model;
  bool json = false;
};

std::string producerLabel(const Value* value) {
  if (!value) return "(omitted)";
  if (value->producer()) return value->producer()->opType();
  if (value->initializer()) return "(initializer)";
  if (value->isGraphInput()) return "(graph input)";
  return "(outer scope)";
}

nlohmann::json describe(Model& model) {
  std::map<std::string, int64_t> ops;
  std::map<std::string, int64_t> bnProducers;
  int64_t nodes = 0, batchNorms = 0, initializers = 0, initializerBytes = 0;
  for (Graph* graph : model.allGraphs()) {
    for (const auto& node : graph->nodes()) {
      ++nodes;
      const std::string key = node->isOnnxDomain() ? node->opType() : node->domain() + "::" + node->opType();
      ++ops[key];
      if (node->isOnnxOp("BatchNormalization")) {
        ++batchNorms;
        ++bnProducers[producerLabel(node->input(0))];
      }
    }
    for (const Value* init : graph->initializers()) {
      ++initializers;
      initializerBytes += init->initializer()->byteSize();
    }
  }
  nlohmann::json opsets = nlohmann::json::object();
  for (const auto& opset : model.shell().opset_import())
    opsets[opset.domain().empty() ? "ai.onnx" : opset.domain()] = opset.version();
  std::vector<std::pair<std::string, int64_t>> histogram(ops.begin(), ops.end());
  std::stable_sort(histogram.begin(), histogram.end(), [](auto& a, auto& b) { return a.second > b.second; });
  nlohmann::json opList = nlohmann::json::array();
  for (auto& [op, count] : histogram) opList.push_back({{"op", op}, {"count", count}});
  return {{"file", model.path()},
          {"ir_version", model.irVersion()},
          {"producer", model.shell().producer_name() + " " + model.shell().producer_version()},
          {"opsets", opsets},
          {"graphs", model.allGraphs().size()},
          {"nodes", nodes},
          {"initializers", initializers},
          {"initializer_bytes", initializerBytes},
          {"ops", opList},
          {"batch_normalization", {{"count", batchNorms}, {"input_producers", bnProducers}}}};
}

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

}  // namespace

CommandRunner addInfoCommand(CLI::App& app) {
  auto options = std::make_shared<InfoOptions>();
  CLI::App* command = app.add_subcommand("info", "Show opsets, an op histogram and the BatchNormalization nodes");
  command->add_option("model", options->model, "ONNX model file")->required();
  command->add_flag("--json", options->json, "Print one JSON document instead of text");
  return [options] {
    LoadOptions loadOptions;
    loadOptions.nameUnnamedNodes = false;
    auto model = loadModel(options->model, loadOptions);
    const nlohmann::json info = describe(*model);
    if (options->json) std::cout << info.dump(2) << "\n";
    else printText(info);
    return kExitOk;
  };
}

}  // namespace bnfold::cli
