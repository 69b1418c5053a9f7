#pragma once
/// \file
/// The closed list of reason codes: why a rule left a node alone, as a report's `skipped[].reason` and
/// `skipped[].details[].reason` say it. Rules name a code only through the constants below (ReasonCode has no
/// implicit conversion from a string), so adding a code means adding it here, to the README's table and to
/// schema/report.schema.json; a test compares the three and fails when a rule emits anything else.

#include <optional>
#include <ostream>
#include <string_view>
#include <vector>

namespace bnfold {

class ReasonCode {
 public:
  constexpr ReasonCode() = default;
  constexpr explicit ReasonCode(const char* code) : code_(code) {}
  /// The kebab-case spelling written into reports.
  constexpr const char* str() const { return code_; }
  bool empty() const { return *code_ == '\0'; }
  friend bool operator==(ReasonCode a, ReasonCode b) { return std::string_view(a.code_) == b.code_; }
  friend bool operator!=(ReasonCode a, ReasonCode b) { return !(a == b); }

 private:
  const char* code_ = "";
};

inline std::ostream& operator<<(std::ostream& out, ReasonCode code) { return out << code.str(); }

namespace reason {
inline constexpr ReasonCode kActivationNotRelu{"activation-not-relu"};
inline constexpr ReasonCode kAffineVariesOffAxis{"affine-varies-off-axis"};
inline constexpr ReasonCode kAxesDiffer{"axes-differ"};
inline constexpr ReasonCode kAxesNotTrailing{"axes-not-trailing"};
inline constexpr ReasonCode kBnHasOtherConsumers{"bn-has-other-consumers"};
inline constexpr ReasonCode kChannelAxisMismatch{"channel-axis-mismatch"};
inline constexpr ReasonCode kConstantTooLarge{"constant-too-large"};
inline constexpr ReasonCode kEmptyStatistics{"empty-statistics"};
inline constexpr ReasonCode kEpsilonNotScalar{"epsilon-not-scalar"};
inline constexpr ReasonCode kExponentNotTwo{"exponent-not-two"};
inline constexpr ReasonCode kFreezeNotRequested{"freeze-not-requested"};
inline constexpr ReasonCode kIdentityAffine{"identity-affine"};
inline constexpr ReasonCode kIntermediateHasOtherReaders{"intermediate-has-other-readers"};
inline constexpr ReasonCode kInvalidVariance{"invalid-variance"};
inline constexpr ReasonCode kKeptByUser{"kept-by-user"};
inline constexpr ReasonCode kLayerHasNoBias{"layer-has-no-bias"};
inline constexpr ReasonCode kLayerHasOtherConsumers{"layer-has-other-consumers"};
inline constexpr ReasonCode kLayerInOtherGraph{"layer-in-other-graph"};
inline constexpr ReasonCode kLayerKeptByUser{"layer-kept-by-user"};
inline constexpr ReasonCode kLayerPadsInput{"layer-pads-input"};
inline constexpr ReasonCode kMeanCountMismatch{"mean-count-mismatch"};
inline constexpr ReasonCode kMissingInput{"missing-input"};
inline constexpr ReasonCode kMissingOutput{"missing-output"};
inline constexpr ReasonCode kMulMayBroadcastInput{"mul-may-broadcast-input"};
inline constexpr ReasonCode kNoFoldableConsumer{"no-foldable-consumer"};
inline constexpr ReasonCode kNoFoldableLayer{"no-foldable-layer"};
inline constexpr ReasonCode kNoBnStatistics{"no-bn-statistics"};
inline constexpr ReasonCode kNoFoldableProducer{"no-foldable-producer"};
inline constexpr ReasonCode kNoHighBias{"no-high-bias"};
inline constexpr ReasonCode kNoRuleEnabled{"no-rule-enabled"};
inline constexpr ReasonCode kNonFiniteParams{"non-finite-params"};
inline constexpr ReasonCode kNonHomogeneousActivation{"non-homogeneous-activation"};
inline constexpr ReasonCode kNonSpatialTraining{"non-spatial-training"};
inline constexpr ReasonCode kNormOpNotInOpset{"norm-op-not-in-opset"};
inline constexpr ReasonCode kNotANormChain{"not-a-norm-chain"};
inline constexpr ReasonCode kNotImproving{"not-improving"};
inline constexpr ReasonCode kNotPerChannel{"not-per-channel"};
inline constexpr ReasonCode kNotTrainingMode{"not-training-mode"};
inline constexpr ReasonCode kOperandNotConstant{"operand-not-constant"};
inline constexpr ReasonCode kOptionalOutputsUsed{"optional-outputs-used"};
inline constexpr ReasonCode kParamKeptByUser{"param-kept-by-user"};
inline constexpr ReasonCode kParamShapeMismatch{"param-shape-mismatch"};
inline constexpr ReasonCode kParamsNotConstant{"params-not-constant"};
inline constexpr ReasonCode kParamsOverridable{"params-overridable"};
inline constexpr ReasonCode kQuantizedWeights{"quantized-weights"};
inline constexpr ReasonCode kRankTooLow{"rank-too-low"};
inline constexpr ReasonCode kRankUnknown{"rank-unknown"};
inline constexpr ReasonCode kReaderContractsOtherAxis{"reader-contracts-other-axis"};
inline constexpr ReasonCode kReaderNotLayer{"reader-not-layer"};
inline constexpr ReasonCode kResidualAdd{"residual-add"};
inline constexpr ReasonCode kRunningStatsUndefined{"running-stats-undefined"};
inline constexpr ReasonCode kSavedStatisticsRead{"saved-statistics-read"};
inline constexpr ReasonCode kSharedWeights{"shared-weights"};
inline constexpr ReasonCode kSpatialParamsVary{"spatial-params-vary"};
inline constexpr ReasonCode kTrainingMode{"training-mode"};
inline constexpr ReasonCode kTypeUnknown{"type-unknown"};
inline constexpr ReasonCode kUnexpectedOutput{"unexpected-output"};
inline constexpr ReasonCode kUnsupportedBiasShape{"unsupported-bias-shape"};
inline constexpr ReasonCode kUnsupportedOpset{"unsupported-opset"};
inline constexpr ReasonCode kUnsupportedType{"unsupported-type"};
inline constexpr ReasonCode kUnsupportedWeightShape{"unsupported-weight-shape"};
inline constexpr ReasonCode kWeightsNotConstant{"weights-not-constant"};
}  // namespace reason

struct ReasonCodeInfo {
  ReasonCode code;
  const char* meaning;  ///< one line, as in the README's table
};

/// Every reason code a report may contain, sorted by spelling.
const std::vector<ReasonCodeInfo>& reasonCodes();

/// A spelling of an older report format and the code it became.
struct RetiredReasonCode {
  const char* spelling;
  ReasonCode current;
  int lastFormatVersion;  ///< the last report format_version that wrote `spelling`
};

/// Spellings earlier report formats used for a code that has since been renamed.
const std::vector<RetiredReasonCode>& retiredReasonCodes();

/// The current code for `spelling`, which may be a current code or a retired one (so reports of any format
/// read the same); nullopt when bnfold never wrote it.
std::optional<ReasonCode> findReasonCode(std::string_view spelling);

}  // namespace bnfold
