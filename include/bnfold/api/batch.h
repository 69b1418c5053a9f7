#pragma once
/// \file
/// What `bnfold fold IN... --out-dir DIR | --in-place` decides before folding, for the CLI and the Python module
/// alike: which model files the inputs name, and where each model and its report are written.

#include <string>
#include <vector>

namespace bnfold {

/// One model to process: its path as the user would write it, and its path below the folder it was found in
/// (just the file name for a file given directly), which an output folder mirrors.
struct ModelFile {
  std::string path;
  std::string relative;
};

/// Files are taken as given (even when missing: loading them then fails with a clear message); folders are
/// searched recursively for *.onnx, sorted by relative path, skipping the folders in `excludedDirs` (the output
/// folders, so a second run does not pick up the first run's results). A model reached twice is listed once.
/// Throws bnfold::Error when a folder holds no *.onnx file or cannot be read.
std::vector<ModelFile> collectModelFiles(const std::vector<std::string>& inputs,
                                         const std::vector<std::string>& excludedDirs = {});

/// Where a batch fold writes: under `outDir` mirroring the inputs' layout, or over each input (`inPlace`), or
/// nowhere (neither: a dry run); each model's report beside the written model, or under `reportDir`.
struct BatchDestinations {
  std::string outDir;
  std::string reportDir;
  bool inPlace = false;
};

/// A model of a batch and where its results go.
struct PlannedFold {
  ModelFile model;
  std::string output;  ///< empty: no model is written
  std::string report;  ///< empty: no report
};

/// "m.onnx" -> "m.report.json" (another name gets ".report.json" appended).
std::string reportPathFor(const std::string& modelPath);

/// The models of `inputs` (collectModelFiles, skipping the destination folders) with their destinations. Throws
/// bnfold::Error when two models would be written to the same file.
std::vector<PlannedFold> planBatchFold(const std::vector<std::string>& inputs, const BatchDestinations& destinations);

}  // namespace bnfold
