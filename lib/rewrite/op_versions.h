#pragma once
// The versions ONNX has of every op bnfold reads or emits (the since_version of each of the op's schemas in the
// default domain), complete through kNewestKnownOpset. Rules declare which of these versions they were written
// for (Rule::opVersions); the driver compares that with the versions in effect at the model's opset, so a model
// from a newer opset than bnfold knows is left alone rather than guessed at. Source: ONNX's operator_sets.h and
// Changelog.md; a test checks the table against libonnx's schema registry for the opsets libonnx knows.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/op_forms.h"
#include "bnfold/rewrite/rule.h"

namespace bnfold {

/// The newest ai.onnx opset whose op versions the table lists.
inline constexpr int64_t kNewestKnownOpset = 27;

/// Every op in the table with its versions (ascending).
const std::vector<OpVersions>& knownOpVersions();

/// The version of `op` in effect at ai.onnx `opset`: the newest since_version not above it. Nullopt when the op
/// is not in the table, does not exist yet at `opset`, or `opset` is newer than kNewestKnownOpset.
std::optional<int64_t> opVersionAt(const std::string& op, int64_t opset);

/// Why a component that understands `understood` cannot work on a model of ai.onnx `opset` (naming the opset or
/// the op version it does not know), or nullopt when it can. `who` names the component in the message.
std::optional<std::string> opsetProblem(const std::vector<OpVersions>& understood, int64_t opset,
                                        const std::string& who);

}  // namespace bnfold
