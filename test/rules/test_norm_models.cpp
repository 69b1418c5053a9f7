// The exporter-shaped normalization models of scripts/gen_norm_models.py, folded by the CLI with the default rules
// and --verify: how many norms each gets fused (and as which op), how many are left and why, and the outputs
// unchanged in ONNX Runtime. One row per model and set of extra CLI arguments: a variant (e.g. --target-opset 17)
// is one more row.

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "test_support.h"

using namespace bnfold;
using namespace bnfold::test;
using json = nlohmann::json;

namespace {

struct NormModelCase {
  const char* model;     // scripts/gen_norm_models.py's name, without .onnx
  const char* extraArgs; // more CLI arguments for `fold`
  const char* fusedOp;   // the op the fused norms become
  int fused;             // norms_fused entries
  int left;              // norms_not_fused entries, all with `leftReason`
  const char* leftReason;
  double tolerance;
};

// Every model with and without --target-opset 17 (the models above 17 are refused by the converter, which only
// goes up, so they have no such row): below the fused op's opset the chains are left with their reason.
const NormModelCase kNormModels[] = {
    {"gpt_block_opset14", "", "LayerNormalization", 0, 2, "norm-op-not-in-opset", 1e-4},
    {"gpt_block_opset14", "--target-opset 17", "LayerNormalization", 2, 0, "", 1e-4},
    {"gpt_block_opset17", "", "LayerNormalization", 2, 0, "", 1e-4},
    {"gpt_block_opset17", "--target-opset 17", "LayerNormalization", 2, 0, "", 1e-4},
    {"bert_layer_tf_opset11", "", "LayerNormalization", 0, 2, "norm-op-not-in-opset", 1e-4},
    {"bert_layer_tf_opset11", "--target-opset 17", "LayerNormalization", 2, 0, "", 1e-4},
    {"bert_layer_tf_opset17", "", "LayerNormalization", 2, 0, "", 1e-4},
    {"bert_layer_tf_opset17", "--target-opset 17", "LayerNormalization", 2, 0, "", 1e-4},
    {"llama_rmsnorm_fp16_opset14", "", "RMSNormalization", 0, 2, "norm-op-not-in-opset", 1e-2},
    {"llama_rmsnorm_fp16_opset14", "--target-opset 17", "RMSNormalization", 0, 2, "norm-op-not-in-opset", 1e-2},
    {"llama_rmsnorm_fp16_opset23", "", "RMSNormalization", 2, 0, "", 1e-2},
    {"flax_layernorm_opset13", "", "LayerNormalization", 0, 1, "norm-op-not-in-opset", 1e-4},
    {"flax_layernorm_opset13", "--target-opset 17", "LayerNormalization", 1, 0, "", 1e-4},
    {"flax_layernorm_opset17", "", "LayerNormalization", 1, 0, "", 1e-4},
    {"flax_layernorm_opset17", "--target-opset 17", "LayerNormalization", 1, 0, "", 1e-4},
    {"diffusion_groupnorm_opset14", "", "GroupNormalization", 0, 1, "norm-op-not-in-opset", 1e-4},
    {"diffusion_groupnorm_opset14", "--target-opset 17", "GroupNormalization", 0, 1, "norm-op-not-in-opset", 1e-4},
    {"diffusion_groupnorm_opset21", "", "GroupNormalization", 1, 0, "", 1e-4},
};

/// The generated models, written once per test process.
const std::string& generatedModels() {
  static TempDir dir;
  static const std::string folder = [] {
    std::string out, err;
    const std::string command = "/usr/bin/python3 " + sourceDir() + "/scripts/gen_norm_models.py " + dir.path();
    if (runCommand(command, &out, &err) != 0) FAIL(command << "\n" << out << err);
    return dir.path();
  }();
  return folder;
}

}  // namespace

TEST_CASE("norm-fuse on exporter-shaped models: fused norms counted, outputs unchanged in ONNX Runtime",
          "[norm-fuse][norm-models]") {
  const std::string models = generatedModels();
  for (const NormModelCase& row : kNormModels) {
    DYNAMIC_SECTION(row.model << " " << row.extraArgs) {
      TempDir out;
      const std::string input = models + "/" + row.model + ".onnx";
      const std::string output = out.file("folded.onnx"), reportFile = out.file("report.json");
      std::string stdoutText, stderrText;
      const std::string command = cli("fold " + input + " -o " + output + " --report " + reportFile + " --verify " +
                                      row.extraArgs);
      INFO(command);
      REQUIRE(runCommand(command, &stdoutText, &stderrText) == 0);
      const json report = json::parse(readFile(reportFile));
      INFO(report.dump(1));
      const json fused = report.value("norms_fused", json::array());
      const json left = report.value("norms_not_fused", json::array());
      CHECK(fused.size() == static_cast<std::size_t>(row.fused));
      for (const json& entry : fused) CHECK(entry["into_op"] == row.fusedOp);
      CHECK(left.size() == static_cast<std::size_t>(row.left));
      for (const json& entry : left) CHECK(entry["reason"] == row.leftReason);
      CHECK(report["verification"]["failed"] == 0);
      const OrtComparison comparison = compareInOrt(input, output, row.tolerance, row.tolerance);
      INFO(comparison.error);
      CHECK(comparison.ok);
    }
  }
}
