#pragma once
/// \file
/// What the rules know about the distribution of a layer's output channels, per layer node: a folded
/// BatchNormalization's output is scale * x_hat + bias with x_hat normalized, so its channel c has mean bias[c] and
/// standard deviation |scale[c]| on the data the BN was trained on. bn-fold records them for the layer it folds
/// into; a rule that rescales or shifts a layer's output channels updates them; high-bias absorption reads them.
///
/// An entry follows its node: it goes when the node is erased, and when a rewrite changes the node without
/// updating (or confirming) the entry, since the layer's output may then mean something else. It listens to the
/// Rewriter for that; Rewriter::apply brackets each rewrite with beginRewrite / endRewrite.

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "bnfold/rewrite/rewriter.h"

namespace bnfold {

/// Per output channel of one layer: the pre-activation's mean (`beta`) and scale (`gamma`, |gamma| its standard
/// deviation), as the BatchNormalization `batchNorm` folded into the layer stated them, times any rescaling since.
struct ChannelStatistics {
  std::vector<double> gamma;
  std::vector<double> beta;
  std::string batchNorm;
};

class PreActivationStatistics final : public RewriteListener {
 public:
  /// Not `recording`: nothing is kept, find() answers null and the other calls do nothing (no enabled rule reads
  /// the statistics, and keeping them costs a plain fold of a large model a few percent).
  explicit PreActivationStatistics(bool recording = true) : recording_(recording) {}
  bool recording() const { return recording_; }

  /// The statistics of `layer`'s output channels, or null when none are known (or they went stale).
  const ChannelStatistics* find(const Node& layer) const;

  /// Sets the statistics of `layer`'s output channels (a rewrite made its output `statistics`' distribution).
  void record(const Node& layer, ChannelStatistics statistics);
  /// The rewrite multiplied `layer`'s output channel c by factor[c]. Ignored when no entry is known or the sizes
  /// differ (the entry is then dropped at the end of the rewrite).
  void scaleChannels(const Node& layer, const std::vector<double>& factor);
  /// The rewrite divided `layer`'s output channel c by divisor[c] (equalization). Same conditions as scaleChannels.
  void divideChannels(const Node& layer, const std::vector<double>& divisor);
  /// The rewrite added shift[c] to `layer`'s output channel c. Same conditions as scaleChannels.
  void shiftChannels(const Node& layer, const std::vector<double>& shift);
  /// The rewrite changed `layer` but not its output (e.g. only how it reads its input channels).
  void outputUnchanged(const Node& layer);

  /// Brackets one rule's rewrite: entries of nodes it changed and did not update are dropped at its end. A change
  /// outside a bracket drops the entry at once.
  void beginRewrite();
  void endRewrite();

  void nodeWillChange(const Node& node) override;
  void nodeErased(const Node& node) override;

 private:
  std::unordered_map<const Node*, ChannelStatistics> entries_;
  bool recording_;
  bool inRewrite_ = false;
  std::unordered_set<const Node*> changed_;    // in this rewrite, with an entry
  std::unordered_set<const Node*> confirmed_;  // recorded or updated in this rewrite
};

}  // namespace bnfold
