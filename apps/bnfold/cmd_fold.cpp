// `bnfold fold IN -o OUT`: load, run the selected rules, save atomically, write the report.

#include <filesystem>
#include <iostream>

#include <spdlog/spdlog.h>

#include "bnfold/error.h"
#include "bnfold/io/model_io.h"
#include "bnfold/report/report.h"
#include "bnfold/rewrite/driver.h"
#include "commands.h"

namespace bnfold::cli {
namespace fs = std::filesystem;
namespace {

struct FoldOptions {
  std::string input;
  std::string output;
  std::string report;
  std::string rules = "default";
  std::vector<std::string> keepNodes;
  std::vector<std::string> keepOps;
  bool inputDefaultsAreConstant = false;
  bool freezeTrainingBatchNorm = false;
};

bool sameFile(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec);
}

std::string listRules() {
  std::string text = "Rules (default marked *):\n";
  for (const auto& rule : builtinRules())
    text += std::string("  ") + (rule->enabledByDefault() ? "* " : "  ") + rule->name() + "  " + rule->summary() + "\n";
  return text;
}

int runFold(const FoldOptions& options) {
  DriverOptions driverOptions;
  try {
    driverOptions.rules = parseRuleSelection(options.rules);
  } catch (const std::invalid_argument& e) {
    throw Error("", std::string("--rules: ") + e.what());
  }
  driverOptions.ruleOptions.keepNodes = options.keepNodes;
  driverOptions.ruleOptions.keepOps = options.keepOps;
  driverOptions.ruleOptions.inputDefaultsAreConstant = options.inputDefaultsAreConstant;
  driverOptions.ruleOptions.freezeTrainingBatchNorm = options.freezeTrainingBatchNorm;
  if (sameFile(options.input, options.output))
    throw Error(options.output, "the output would overwrite the input model; choose another -o path");

  auto model = loadModel(options.input);
  Report report;
  report.setInput(options.input);
  report.setOutput(options.output);
  runRules(*model, driverOptions, report);
  saveModel(*model, options.output);
  if (!options.report.empty()) {
    try {
      if (options.report == "-") std::cout << report.dump();
      else report.write(options.report);
    } catch (...) {
      // A run is complete with its report or not at all.
      std::error_code ec;
      fs::remove(options.output, ec);
      throw;
    }
  }
  spdlog::info("{}: {} rewrites, {} BatchNormalization left", options.output, report.rewriteCount(),
               report.section("skipped").size());
  return kExitOk;
}

}  // namespace

CommandRunner addFoldCommand(CLI::App& app) {
  auto options = std::make_shared<FoldOptions>();
  CLI::App* command = app.add_subcommand("fold", "Rewrite a model and write the result and a JSON report");
  command->add_option("input", options->input, "ONNX model to rewrite (never modified)")->required();
  command->add_option("-o,--output", options->output, "Where to write the rewritten model")->required();
  command->add_option("--report", options->report, "Write the JSON report here ('-' for stdout)");
  command->add_option("--rules", options->rules,
                      "Rules to run: default, all, none, a list (bn-fold,bias-add) or changes (+bn-decompose,-scale-fold)")
      ->capture_default_str();
  command->add_option("--keep", options->keepNodes, "Node name (glob) no rule may touch; repeatable");
  command->add_option("--keep-op", options->keepOps, "Op type no rule may touch; repeatable");
  command->add_flag("--input-defaults-are-constant", options->inputDefaultsAreConstant,
                    "Treat initializers that are also graph inputs (IR >= 4) as constants");
  command->add_flag("--freeze-train-bn", options->freezeTrainingBatchNorm,
                    "Turn training-mode BatchNormalization into inference mode (changes the function)");
  command->footer(listRules());
  return [options] { return runFold(*options); };
}

}  // namespace bnfold::cli
