#include "bnfold/api/api.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <stdexcept>

#include "bnfold/error.h"
#include "bnfold/io/atomic_file.h"
#include "bnfold/io/model_io.h"

#include <climits>
#include <fstream>

#include <onnx/version_converter/convert.h>

namespace bnfold {
namespace fs = std::filesystem;

DriverOptions driverOptionsFrom(const RuleSettings& settings) {
  DriverOptions options;
  std::string selection = settings.rules;
  if (settings.equalize) selection += ",+equalize";
  if (settings.absorbHighBias) selection += ",+absorb-high-bias";
  if (settings.relu6ToRelu) selection += ",+relu6-to-relu";
  try {
    options.rules = parseRuleSelection(selection);
  } catch (const std::invalid_argument& e) {
    throw Error("", std::string("--rules: ") + e.what());
  }
  // High-bias absorption reads the BN statistics as equalization left them; alone it is not what users ask for.
  auto selected = [&](const char* rule) {
    return std::find(options.rules.begin(), options.rules.end(), rule) != options.rules.end();
  };
  if (selected("absorb-high-bias") && !selected("equalize"))
    throw Error("", settings.absorbHighBias ? "--absorb-high-bias needs --equalize"
                                            : "--rules: absorb-high-bias needs equalize (+equalize or --equalize)");
  // Relu6 -> Relu changes the function; it is worth that only to let equalize reach the link.
  if (selected("relu6-to-relu") && !selected("equalize"))
    throw Error("", settings.relu6ToRelu ? "--relu6-to-relu needs --equalize"
                                         : "--rules: relu6-to-relu needs equalize (+equalize or --equalize)");
  if (!(settings.maxConstantMiB >= 0)) throw Error("", "--max-constant-size: must be a number of MiB, 0 or more");
  options.ruleOptions.keepNodes = settings.keepNodes;
  options.ruleOptions.keepOps = settings.keepOps;
  options.ruleOptions.inputDefaultsAreConstant = settings.inputDefaultsAreConstant;
  options.ruleOptions.freezeTrainingBatchNorm = settings.freezeTrainingBatchNorm;
  options.ruleOptions.maxConstantBytes = static_cast<int64_t>(settings.maxConstantMiB * 1024 * 1024);
  options.verify = settings.verify;
  return options;
}

FoldRun foldModel(Model& model, const DriverOptions& options, Report& report) {
  report.setReorderedGraphs(model.reorderedGraphs());
  runRules(model, options, report);
  FoldRun run;
  run.failedVerifications = failedVerifications(report);
  run.inputDefaultsHint = inputDefaultsHint(model, report).message();
  return run;
}

std::string verificationFailureText(const FoldRun& run, const Report& report) {
  return std::to_string(run.failedVerifications.size()) + " of " + std::to_string(report.rewriteCount()) +
         " rewrites failed verification; no model written";
}

namespace {

bool sameFile(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec);
}

void createFolderOf(const std::string& path) {
  const fs::path folder = fs::path(path).parent_path();
  if (!folder.empty()) fs::create_directories(folder);
}

/// Ends the current phase and adds its time to `seconds`.
class PhaseClock {
 public:
  void lap(double& seconds) {
    const auto now = std::chrono::steady_clock::now();
    seconds += std::chrono::duration<double>(now - last_).count();
    last_ = now;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace

namespace {

int64_t defaultDomainOpset(const onnx::ModelProto& proto) {
  for (const auto& import : proto.opset_import())
    if (import.domain().empty() || import.domain() == "ai.onnx") return import.version();
  return 0;
}

bool holdsExternalData(const onnx::GraphProto& graph) {
  for (const auto& tensor : graph.initializer())
    if (tensor.data_location() == onnx::TensorProto::EXTERNAL) return true;
  for (const auto& node : graph.node())
    for (const auto& attribute : node.attribute()) {
      if (attribute.has_t() && attribute.t().data_location() == onnx::TensorProto::EXTERNAL) return true;
      if (attribute.has_g() && holdsExternalData(attribute.g())) return true;
      for (const auto& subgraph : attribute.graphs())
        if (holdsExternalData(subgraph)) return true;
    }
  return false;
}

// What libonnx 1.12's converter (its IR round trip) loses; checked because a fold must keep it.
std::string whatConversionWouldDrop(const onnx::ModelProto& proto) {
  if (proto.functions_size() > 0) return std::to_string(proto.functions_size()) + " local function(s)";
  if (proto.training_info_size() > 0) return "training info";
  if (proto.graph().sparse_initializer_size() > 0) return "sparse initializers";
  if (holdsExternalData(proto.graph())) return "tensors in external data";
  return "";
}

bool sameMetadata(const onnx::ModelProto& a, const onnx::ModelProto& b) {
  if (a.metadata_props_size() != b.metadata_props_size()) return false;
  for (int i = 0; i < a.metadata_props_size(); ++i)
    if (a.metadata_props(i).key() != b.metadata_props(i).key() ||
        a.metadata_props(i).value() != b.metadata_props(i).value())
      return false;
  return true;
}

}  // namespace

namespace {

std::string refusal(int64_t targetOpset) { return "cannot convert to opset " + std::to_string(targetOpset) + ": "; }

void checkTargetOpset(const std::string& name, int64_t targetOpset) {
  if (targetOpset > kNewestConvertibleOpset)
    throw Error(name, refusal(targetOpset) + "libonnx's version converter knows ai.onnx opsets up to " +
                          std::to_string(kNewestConvertibleOpset));
}

// The model of `original` converted to `targetOpset`, or null when it is at that opset already.
std::unique_ptr<Model> convertedModel(const onnx::ModelProto& original, const std::string& name,
                                      const std::string& baseDir, int64_t targetOpset, Report* report) {
  const std::string refused = refusal(targetOpset);
  const int64_t from = defaultDomainOpset(original);
  if (targetOpset < from)
    throw Error(name, refused + "the model is at opset " + std::to_string(from) + " already (--target-opset only raises it)");
  if (targetOpset == from) return nullptr;
  const std::string dropped = whatConversionWouldDrop(original);
  if (!dropped.empty()) throw Error(name, refused + "the model has " + dropped + ", which libonnx's version converter drops");
  onnx::ModelProto converted;
  try {
    converted = onnx::version_conversion::ConvertVersion(original, static_cast<int>(targetOpset));
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    throw Error(name, refused + "libonnx's version converter failed: " + what);
  }
  if (!sameMetadata(original, converted))
    throw Error(name, refused + "libonnx's version converter did not keep the model's metadata");
  std::unique_ptr<Model> model = modelFromProto(std::move(converted), name, baseDir);
  if (report) report->setOpsetConversion(from, targetOpset);
  return model;
}

}  // namespace

std::unique_ptr<Model> loadModelAtOpset(const std::string& path, int64_t targetOpset, Report* report) {
  checkTargetOpset(path, targetOpset);
  onnx::ModelProto original;
  {
    std::ifstream file(path, std::ios::binary);
    if (!file || !original.ParseFromIstream(&file))
      throw Error(path, refusal(targetOpset) + "the file cannot be read as a model");
  }
  const fs::path folder = fs::path(path).parent_path();
  std::unique_ptr<Model> model =
      convertedModel(original, path, folder.empty() ? "." : folder.string(), targetOpset, report);
  return model ? std::move(model) : loadModel(path);
}

std::unique_ptr<Model> modelFromBytesAtOpset(std::string_view bytes, const std::string& sourceName,
                                             const std::string& baseDir, int64_t targetOpset, Report* report) {
  checkTargetOpset(sourceName, targetOpset);
  onnx::ModelProto original;
  if (bytes.size() > static_cast<std::size_t>(INT_MAX) || !original.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    throw Error(sourceName, refusal(targetOpset) + "the bytes cannot be read as a model");
  std::unique_ptr<Model> model = convertedModel(original, sourceName, baseDir, targetOpset, report);
  return model ? std::move(model) : modelFromBytes(bytes, sourceName, baseDir);
}

FoldFileResult foldFile(const FoldFileRequest& request, const DriverOptions& options) {
  const std::string& input = request.input;
  const bool writesModel = !request.dryRun && !request.output.empty();
  if (request.inPlace) {
    if (writesModel) {
      std::error_code ec;
      const fs::file_status status = fs::status(input, ec);  // through links: their target is what is replaced
      if (fs::exists(status) && !fs::is_regular_file(status) && !fs::is_directory(status))
        throw Error(input, "--in-place replaces regular files only, and this is a device, FIFO or socket");
    }
  } else if (writesModel && sameFile(input, request.output)) {
    throw Error(request.output, "the output would overwrite the input model; choose another -o path (or --in-place)");
  }
  // Bad destinations (a folder, a socket, a dangling link) fail before any work.
  if (writesModel && !request.createFolders) destinationOf(request.output);
  if (!request.reportPath.empty() && !request.createFolders) destinationOf(request.reportPath);

  FoldFileResult result;
  PhaseClock clock;
  result.model = request.targetOpset > 0 ? loadModelAtOpset(input, request.targetOpset, &result.report) : loadModel(input);
  clock.lap(result.times.load);
  result.report.setInput(input);
  if (!request.output.empty()) result.report.setOutput(request.output);
  result.run = foldModel(*result.model, options, result.report);
  clock.lap(result.times.rules);
  if (!result.run.failedVerifications.empty()) {
    // A rewrite that does not compute what the original did is not written; the report shows all of them.
    if (!request.reportPath.empty()) {
      if (request.createFolders) createFolderOf(request.reportPath);
      result.report.write(request.reportPath);
    }
    return result;
  }
  if (request.dryRun) return result;
  // A model sorted on load is written back sorted, even when no rule changed it.
  result.unchanged =
      request.inPlace && result.report.rewriteCount() == 0 && result.model->reorderedGraphs().empty();
  if (!request.output.empty() && !result.unchanged) {
    if (request.inPlace && !request.backupSuffix.empty()) {
      copyFileAtomically(input, input + request.backupSuffix);
      // saveModel replaces "<model>.data" when the model keeps tensors outside: back that up too.
      const std::string dataFile = input + ".data";
      std::error_code ec;
      if (fs::is_regular_file(dataFile, ec)) copyFileAtomically(dataFile, dataFile + request.backupSuffix);
    }
    if (request.createFolders) createFolderOf(request.output);
    saveModel(*result.model, request.output);
    result.written = true;
  }
  clock.lap(result.times.save);
  if (!request.reportPath.empty()) {
    try {
      if (request.createFolders) createFolderOf(request.reportPath);
      result.report.write(request.reportPath);
    } catch (...) {
      // A run is complete with its report or not at all (in place, the new model stays: the original is gone
      // already, and only the backup, if any, still has it).
      if (result.written && !request.inPlace) removeWrittenFile(request.output);
      throw;
    }
  }
  return result;
}

namespace {

std::string producerLabel(const Value* value) {
  if (!value) return "(omitted)";
  if (value->producer()) return value->producer()->opType();
  if (value->initializer()) return "(initializer)";
  if (value->isGraphInput()) return "(graph input)";
  return "(outer scope)";
}

}  // namespace

nlohmann::json describeModel(Model& model) {
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

namespace {

nlohmann::json finiteOrNull(double value) { return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(); }

nlohmann::json stateJson(const std::optional<LayerWeightQuant>& layer) {
  if (!layer) return nullptr;
  return {{"channels", layer->channels},
          {"dead_channels", layer->deadChannels},
          {"range_spread", layer->rangeSpread > 0 ? finiteOrNull(layer->rangeSpread) : nlohmann::json()},
          {"per_tensor_sqnr_db", finiteOrNull(layer->perTensorSqnrDb)},
          {"per_channel_sqnr_db", finiteOrNull(layer->perChannelSqnrDb)},
          {"gap_db", finiteOrNull(layer->gapDb)}};
}

}  // namespace

nlohmann::json weightQuantJson(const WeightQuantSummary& summary) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerWeightQuantStates& row : summary.layers)
    layers.push_back({{"node", row.node},
                      {"op", row.op},
                      {"graph", row.graph},
                      {"loaded", stateJson(row.loaded)},
                      {"folded", stateJson(row.folded)},
                      {"equalized", stateJson(row.equalized)}});
  nlohmann::json leftOff = nlohmann::json::array();
  for (const LayerLeftOff& layer : summary.leftOff)
    leftOff.push_back({{"node", layer.node},
                       {"op", layer.op},
                       {"graph", layer.graph},
                       {"gap_db", finiteOrNull(layer.gapDb)},
                       {"reason", layer.reason},
                       {"message", layer.message}});
  return {{"gap_limit_db", kWeightQuantGapLimitDb}, {"layers", std::move(layers)}, {"left_off", std::move(leftOff)}};
}

}  // namespace bnfold
