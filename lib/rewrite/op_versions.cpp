#include "op_versions.h"

#include <algorithm>

namespace bnfold {

const std::vector<OpVersions>& knownOpVersions() {
  // Opsets 26 and 27 changed none of these ops.
  static const std::vector<OpVersions> table = {
      {"Add", {1, 6, 7, 13, 14}},
      {"AveragePool", {1, 7, 10, 11, 19, 22}},
      {"BatchNormalization", {1, 6, 7, 9, 14, 15}},
      {"Cast", {1, 6, 9, 13, 19, 21, 23, 24, 25}},
      {"Clip", {1, 6, 11, 12, 13}},
      {"Concat", {1, 4, 11, 13}},
      {"Constant", {1, 9, 11, 12, 13, 19, 21, 23, 24, 25}},
      {"ConstantOfShape", {9, 20, 21, 23, 24, 25}},
      {"Conv", {1, 11, 22}},
      {"ConvTranspose", {1, 11, 22}},
      {"Div", {1, 6, 7, 13, 14}},
      {"Expand", {8, 13}},
      {"Flatten", {1, 9, 11, 13, 21, 23, 24, 25}},
      {"Gather", {1, 11, 13}},
      {"Gemm", {1, 6, 7, 9, 11, 13}},
      {"GlobalAveragePool", {1, 22}},
      {"GlobalMaxPool", {1, 22}},
      {"GroupNormalization", {18, 21}},
      {"Identity", {1, 13, 14, 16, 19, 21, 23, 24, 25}},
      {"InstanceNormalization", {1, 6, 22}},
      {"LayerNormalization", {17}},
      {"LeakyRelu", {1, 6, 16}},
      {"MatMul", {1, 9, 13}},
      {"Max", {1, 6, 8, 12, 13}},
      {"MaxPool", {1, 8, 10, 11, 12, 22}},
      {"Min", {1, 6, 8, 12, 13}},
      {"Mul", {1, 6, 7, 13, 14}},
      {"Neg", {1, 6, 13}},
      {"PRelu", {1, 6, 7, 9, 16}},
      {"Pow", {1, 7, 12, 13, 15}},
      {"RMSNormalization", {23}},
      {"Reciprocal", {1, 6, 13}},
      {"ReduceMean", {1, 11, 13, 18}},
      {"ReduceSum", {1, 11, 13}},
      {"Relu", {1, 6, 13, 14}},
      {"Reshape", {1, 5, 13, 14, 19, 21, 23, 24, 25}},
      {"Slice", {1, 10, 11, 13}},
      {"Sqrt", {1, 6, 13}},
      {"Squeeze", {1, 11, 13, 21, 23, 24, 25}},
      {"Sub", {1, 6, 7, 13, 14}},
      {"Transpose", {1, 13, 21, 23, 24, 25}},
      {"Unsqueeze", {1, 11, 13, 21, 23, 24, 25}},
  };
  return table;
}

std::optional<int64_t> opVersionAt(const std::string& op, int64_t opset) {
  if (opset > kNewestKnownOpset) return std::nullopt;
  const auto& table = knownOpVersions();
  auto entry = std::find_if(table.begin(), table.end(), [&](const OpVersions& known) { return known.op == op; });
  if (entry == table.end()) return std::nullopt;
  std::optional<int64_t> inEffect;
  for (int64_t since : entry->versions)
    if (since <= opset) inEffect = since;
  return inEffect;
}

namespace {
std::string versionList(const std::vector<int64_t>& versions) {
  std::string text;
  for (int64_t v : versions) text += (text.empty() ? "" : ", ") + std::to_string(v);
  return text;
}
}  // namespace

std::optional<std::string> opsetProblem(const std::vector<OpVersions>& understood, int64_t opset,
                                        const std::string& who) {
  if (opset > kNewestKnownOpset)
    return "the model's ai.onnx opset " + std::to_string(opset) + " is newer than the newest bnfold knows (" +
           std::to_string(kNewestKnownOpset) + "): " + who + " does not guess what its ops mean there";
  for (const OpVersions& op : understood) {
    const std::optional<int64_t> version = opVersionAt(op.op, opset);
    if (!version) continue;  // the op does not exist yet at this opset: nothing to misread
    if (std::find(op.versions.begin(), op.versions.end(), *version) == op.versions.end())
      return who + " understands " + op.op + " versions " + versionList(op.versions) + ", and opset " +
             std::to_string(opset) + " has " + op.op + "-" + std::to_string(*version);
  }
  return std::nullopt;
}

}  // namespace bnfold
