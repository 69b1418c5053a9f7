#pragma once
// Helpers shared by the tests: models stated in ONNX text, running rules, a one-line picture of a graph,
// temp folders, and the ONNX Runtime oracle (scripts/ort/compare.js).

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bnfold/io/model_io.h"
#include "bnfold/report/report.h"
#include "bnfold/check/fold.h"

namespace bnfold::test {

/// Parses a model in ONNX text syntax (onnx::OnnxParser); fails the test on a syntax error.
onnx::ModelProto parseModelProto(const std::string& text);
/// Parses ONNX text and builds the IR.
std::unique_ptr<Model> parseModel(const std::string& text);

/// Op types of the main graph's nodes, in order, joined by ",": "Conv,Relu".
std::string opSequence(const Graph& graph);
/// Number of nodes of an op type in every graph of the model.
int countOps(Model& model, const std::string& opType);
/// The first node of that op type in the main graph, or null.
const Node* findNode(const Graph& graph, const std::string& opType);
const Node* findNodeByName(Model& model, const std::string& name);

/// Runs the named rules (e.g. {"bn-fold"}) with --verify and returns the report. Verifies every graph afterwards,
/// and fails the test (without stopping it) for each rewrite whose --verify check did not pass.
Report applyRules(Model& model, const std::vector<std::string>& rules, const RuleOptions& options = {});

/// A fresh empty folder under the system temp folder, removed when the object goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// Result of running two models in ONNX Runtime on the same seeded random inputs.
struct OrtComparison {
  bool ok = false;           ///< every output within tolerance (and the comparison ran)
  std::string error;         ///< set when the comparison could not run
  double maxAbs = 0.0;       ///< largest absolute difference over all outputs
  double maxRel = 0.0;       ///< largest relative difference over all outputs
  nlohmann::json details;    ///< compare.js's JSON
};

/// Runs scripts/ort/compare.js on two model files.
OrtComparison compareInOrt(const std::string& modelA, const std::string& modelB, double atol, double rtol);

/// The usual rule test: saves the model as it is, applies the rules, saves the result, and compares both in
/// ONNX Runtime. `model` is left rewritten.
struct FoldOutcome {
  Report report;
  OrtComparison comparison;
};
FoldOutcome applyRulesAndCompare(Model& model, const std::vector<std::string>& rules, double atol, double rtol,
                                 const RuleOptions& options = {});

/// Runs a command through the shell; returns its exit code and fills stdout/stderr.
int runCommand(const std::string& command, std::string* out = nullptr, std::string* err = nullptr);

/// Runs scripts/validate_report.py on the report files; returns its exit code, with its stdout and stderr in *out
/// (nothing when every report is valid).
int validateReports(const std::vector<std::string>& files, std::string* out);

/// Paths known at build time.
std::string sourceDir();
std::string bnfoldExecutable();
/// The bnfold executable followed by `args`, for runCommand.
std::string cli(const std::string& args);
/// Path of a sample model in models/.
std::string sample(const std::string& name);

/// A file's bytes; empty when it is missing or not a regular file.
std::string readFile(const std::string& path);
/// Writes `bytes` to `path`, creating its folder.
void writeFile(const std::string& path, const std::string& bytes);
/// The lines of a text, without their line ends.
std::vector<std::string> lines(const std::string& text);

}  // namespace bnfold::test
