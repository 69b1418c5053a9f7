#include "bnfold/rewrite/pre_activation_statistics.h"

namespace bnfold {

const ChannelStatistics* PreActivationStatistics::find(const Node& layer) const {
  auto it = entries_.find(&layer);
  return it == entries_.end() ? nullptr : &it->second;
}

void PreActivationStatistics::record(const Node& layer, ChannelStatistics statistics) {
  if (!recording_) return;
  entries_[&layer] = std::move(statistics);
  if (inRewrite_) confirmed_.insert(&layer);
}

void PreActivationStatistics::scaleChannels(const Node& layer, const std::vector<double>& factor) {
  auto it = entries_.find(&layer);
  if (it == entries_.end() || it->second.gamma.size() != factor.size()) return;
  for (std::size_t c = 0; c < factor.size(); ++c) {
    it->second.gamma[c] *= factor[c];
    it->second.beta[c] *= factor[c];
  }
  if (inRewrite_) confirmed_.insert(&layer);
}

void PreActivationStatistics::divideChannels(const Node& layer, const std::vector<double>& divisor) {
  std::vector<double> factor(divisor.size());
  for (std::size_t c = 0; c < divisor.size(); ++c) factor[c] = 1.0 / divisor[c];
  scaleChannels(layer, factor);
}

void PreActivationStatistics::shiftChannels(const Node& layer, const std::vector<double>& shift) {
  auto it = entries_.find(&layer);
  if (it == entries_.end() || it->second.beta.size() != shift.size()) return;
  for (std::size_t c = 0; c < shift.size(); ++c) it->second.beta[c] += shift[c];
  if (inRewrite_) confirmed_.insert(&layer);
}

void PreActivationStatistics::outputUnchanged(const Node& layer) {
  if (inRewrite_ && entries_.count(&layer)) confirmed_.insert(&layer);
}

void PreActivationStatistics::beginRewrite() {
  inRewrite_ = true;
  changed_.clear();
  confirmed_.clear();
}

void PreActivationStatistics::endRewrite() {
  for (const Node* node : changed_)
    if (!confirmed_.count(node)) entries_.erase(node);
  inRewrite_ = false;
  changed_.clear();
  confirmed_.clear();
}

void PreActivationStatistics::nodeWillChange(const Node& node) {
  if (entries_.empty() || !entries_.count(&node)) return;
  if (inRewrite_)
    changed_.insert(&node);
  else
    entries_.erase(&node);
}

void PreActivationStatistics::nodeErased(const Node& node) {
  if (entries_.empty()) return;
  entries_.erase(&node);
  changed_.erase(&node);
  confirmed_.erase(&node);
}

}  // namespace bnfold
