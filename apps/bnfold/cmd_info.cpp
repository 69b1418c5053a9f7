// `bnfold info MODEL`: what is in a model, with an eye on BatchNormalization.

#include <algorithm>
#include <iostream>
#include <map>

#include <nlohmann/json.hpp>

#include "bnfold/api/api.h"
#include "bnfold/io/model_io.h"
#include "commands.h"

namespace bnfold::cli {
namespace {

struct InfoOptions {
  std::string model;
  bool json = false;
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
    const nlohmann::json info = describeModel(*model);
    if (options->json) std::cout << info.dump(2) << "\n";
    else printText(info);
    return kExitOk;
  };
}

}  // namespace bnfold::cli
