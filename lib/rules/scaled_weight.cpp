#include "scaled_weight.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace bnfold::rules {
namespace {

class ScaledChannelBytes final : public DeferredBytes {
 public:
  ScaledChannelBytes(std::shared_ptr<const DeferredBytes> source, DataType type, kernels::ChannelIndexing indexing,
                     std::vector<double> scale)
      : source_(std::move(source)),
        type_(type),
        elementBytes_(static_cast<int64_t>(elementSize(type))),
        indexing_(indexing),
        scale_(std::move(scale)) {}

  int64_t size() const override { return source_->size(); }

  void read(int64_t offset, int64_t length, char* out) const override {
    if (offset % elementBytes_ != 0 || length % elementBytes_ != 0)
      throw std::invalid_argument("scaled weight: read of bytes " + std::to_string(offset) + "+" +
                                  std::to_string(length) + " does not fall on element boundaries");
    source_->read(offset, length, out);
    const int64_t first = offset / elementBytes_;
    const int64_t count = length / elementBytes_;
    if (indexing_.inner == 1) {
      // Channels change every element (columns): take a row's worth of consecutive channels at a time.
      for (int64_t i = first; i < first + count;) {
        const int64_t run = std::min(indexing_.perGroup - i % indexing_.perGroup, first + count - i);
        scaleElementsInPlace(type_, out + (i - first) * elementBytes_, run,
                             scale_.data() + indexing_.channel(i));
        i += run;
      }
      return;
    }
    kernels::forEachChannelRun(indexing_, first, count,
                               [&](int64_t first, int64_t count, int64_t channel) {
                                 scaleElementsInPlace(type_, out + first * elementBytes_, count,
                                                      scale_[static_cast<std::size_t>(channel)]);
                               });
  }

 private:
  std::shared_ptr<const DeferredBytes> source_;
  DataType type_;
  int64_t elementBytes_;
  kernels::ChannelIndexing indexing_;
  std::vector<double> scale_;
};

}  // namespace

std::shared_ptr<const DeferredBytes> scaledChannelBytes(std::shared_ptr<const DeferredBytes> source, DataType type,
                                                        kernels::ChannelIndexing indexing,
                                                        std::vector<double> scale) {
  return std::make_shared<ScaledChannelBytes>(std::move(source), type, indexing, std::move(scale));
}

}  // namespace bnfold::rules
