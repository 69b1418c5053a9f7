#pragma once
/// \file
/// What the `bnfold` commands do around the rules, as functions that the CLI and the Python module both call:
/// the rule settings `fold` and `check` take, the fold of a loaded model, the whole file-to-file fold (load, rules,
/// verification, atomic save with external data, report) and the description `info --json` prints.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "bnfold/ir/model.h"
#include "bnfold/check/findings.h"
#include "bnfold/check/fold.h"
#include "bnfold/check/weight_quant.h"
#include "bnfold/report/report.h"
#include "bnfold/rewrite/driver.h"

namespace bnfold {

/// The choices that select and steer the rules (`--rules`, `--keep`, ... in the README); `fold` and `check` take
/// the same ones so that `check` predicts `fold`.
struct RuleSettings {
  std::string rules = "default";
  std::vector<std::string> keepNodes;
  std::vector<std::string> keepOps;
  bool inputDefaultsAreConstant = false;
  bool freezeTrainingBatchNorm = false;
  bool equalize = false;       ///< --equalize: adds the equalize rule (same as `+equalize` in rules)
  /// --absorb-high-bias: adds the absorb-high-bias rule (same as `+absorb-high-bias`); needs equalize
  bool absorbHighBias = false;
  /// --relu6-to-relu: adds the relu6-to-relu rule (same as `+relu6-to-relu`); needs equalize; changes the function
  bool relu6ToRelu = false;
  double maxConstantMiB = 64;  ///< --max-constant-size
  bool verify = false;
  int64_t targetOpset = 0;     ///< --target-opset: convert the model first (loadModelAtOpset); 0: keep its opset
};

/// Throws bnfold::Error on an unknown rule in `rules`, absorb-high-bias without equalize, or a negative size.
DriverOptions driverOptionsFrom(const RuleSettings& settings);

/// What a fold of a loaded model found besides its report.
struct FoldRun {
  /// Rewrites whose --verify check failed: a model with any must not be written.
  std::vector<Finding> failedVerifications;
  /// InputDefaultsHint::message(): what --input-defaults-are-constant would fold; empty when nothing.
  std::string inputDefaultsHint;
};

/// Records the graphs sorted on load in `report`, runs the rules and collects what the caller must act on.
FoldRun foldModel(Model& model, const DriverOptions& options, Report& report);

/// "3 of 53 rewrites failed verification; no model written".
std::string verificationFailureText(const FoldRun& run, const Report& report);

/// Wall time of the phases of a file-to-file fold.
struct FoldPhaseTimes {
  double load = 0, rules = 0, save = 0;
};

struct FoldFileRequest {
  std::string input;
  std::string output;      ///< where the model goes; empty: nowhere
  std::string reportPath;  ///< where the JSON report goes; empty: nowhere
  /// Run the rules and write no model. A report is then written only when verification failed.
  bool dryRun = false;
  /// `output` is `input` itself, replaced only when the model changed.
  bool inPlace = false;
  /// With `inPlace`: keep the original (and its "<model>.data") as "<model><suffix>".
  std::string backupSuffix;
  /// Create the folders of `output` and `reportPath` when missing (batch runs mirror their inputs' layout).
  bool createFolders = false;
  /// --target-opset: convert the model to this ai.onnx opset before the rules (0: keep its opset); see
  /// loadModelAtOpset.
  int64_t targetOpset = 0;
};

struct FoldFileResult {
  std::unique_ptr<Model> model;
  Report report;
  FoldRun run;
  bool written = false;    ///< the model was saved to `output`
  bool unchanged = false;  ///< in place, and neither a rule nor the load changed anything: the file was left alone
  FoldPhaseTimes times;
};

/// The newest ai.onnx opset libonnx's version converter (onnx 1.12) converts to.
inline constexpr int64_t kNewestConvertibleOpset = 17;

/// Loads `path`; with `targetOpset` > 0 converts it first to that ai.onnx opset with libonnx's version converter
/// and, when `report` is given, records the conversion there (`opset_converted`: from, to). A target equal to the
/// model's opset converts nothing. Throws bnfold::Error naming the file, before anything is written, when the
/// target is above kNewestConvertibleOpset or below the model's opset, when the converter fails, and when the
/// model holds what the converter would drop: local functions, training info, sparse initializers, tensors in
/// external data, or metadata it did not carry over.
std::unique_ptr<Model> loadModelAtOpset(const std::string& path, int64_t targetOpset, Report* report = nullptr);
/// The same for a serialized ModelProto held in memory (`sourceName` names it in errors, external data is found
/// in `baseDir`).
std::unique_ptr<Model> modelFromBytesAtOpset(std::string_view bytes, const std::string& sourceName,
                                             const std::string& baseDir, int64_t targetOpset, Report* report = nullptr);

/// `bnfold fold IN -o OUT`: refuses an output that is the input (unless in place) or cannot be written before any
/// work, loads, folds, and unless a rewrite failed verification saves atomically (external data streamed file to
/// file) and writes the report; a report that cannot be written removes the model just written (unless in place).
/// Throws bnfold::Error; a failed verification is not an error but `run.failedVerifications`.
FoldFileResult foldFile(const FoldFileRequest& request, const DriverOptions& options);

/// What `bnfold info --json` prints: opsets, an op histogram and the BatchNormalization nodes' producers.
nlohmann::json describeModel(Model& model);

/// What `bnfold info --weights --json` adds under "weights": summarizeWeightQuant's layers (each state an object of
/// channels, dead_channels, range_spread, per_tensor_sqnr_db, per_channel_sqnr_db, gap_db, or null where the layer
/// is absent; an infinite figure, or the spread of a layer without live channels, is null), the layers left off
/// with their reason, and the gap limit.
nlohmann::json weightQuantJson(const WeightQuantSummary& summary);

}  // namespace bnfold
