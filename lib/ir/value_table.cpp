#include "bnfold/ir/value_table.h"

#include <algorithm>
#include <utility>

#include "bnfold/ir/graph.h"

namespace bnfold {

namespace {
// At most 3 of 5 slots used: short probe runs for linear probing, and 1.67 slots (20 bytes) per value.
constexpr std::size_t kLoadNumerator = 3;
constexpr std::size_t kLoadDenominator = 5;
constexpr std::size_t kMinCapacity = 16;

std::size_t capacityFor(std::size_t count) {
  return std::max(kMinCapacity, (count * kLoadDenominator + kLoadNumerator - 1) / kLoadNumerator);
}
}  // namespace

std::size_t ValueTable::probe(std::string_view name, uint32_t tag) const {
  for (std::size_t i = home(tag);; i = next(i)) {
    if (tags_[i] == 0 || (tags_[i] == tag && values_[i]->name() == name)) return i;
  }
}

Value* ValueTable::find(std::string_view name) const {
  if (size_ == 0) return nullptr;
  const std::size_t slot = probe(name, tagOf(name));
  return tags_[slot] ? values_[slot] : nullptr;
}

Value* ValueTable::insert(Value* value) {
  if (capacityFor(size_ + 1) > tags_.size()) rehash(std::max(2 * size_, size_ + 1));
  const uint32_t tag = tagOf(value->name());
  const std::size_t slot = probe(value->name(), tag);
  Value* replaced = tags_[slot] ? values_[slot] : nullptr;
  if (!replaced) ++size_;
  tags_[slot] = tag;
  values_[slot] = value;
  value->tableSlot_ = static_cast<uint32_t>(slot);
  return replaced;
}

std::size_t ValueTable::slotOf(const Value* value) const {
  if (size_ == 0) return kNoSlot;
  if (value->tableSlot_ < values_.size() && values_[value->tableSlot_] == value) return value->tableSlot_;
  const std::size_t slot = probe(value->name(), tagOf(value->name()));
  return tags_[slot] && values_[slot] == value ? slot : kNoSlot;
}

bool ValueTable::swapEntries(Value* a, Value* b) {
  const std::size_t slotA = slotOf(a);
  const std::size_t slotB = slotOf(b);
  if (slotA == kNoSlot || slotB == kNoSlot) return false;
  std::swap(values_[slotA], values_[slotB]);
  a->tableSlot_ = static_cast<uint32_t>(slotB);
  b->tableSlot_ = static_cast<uint32_t>(slotA);
  return true;
}

std::size_t ValueTable::capacity() const { return tags_.size() * kLoadNumerator / kLoadDenominator; }

void ValueTable::reserve(std::size_t count) {
  if (capacityFor(count) > tags_.size()) rehash(count);
}

void ValueTable::rehash(std::size_t count) {
  std::vector<uint32_t> oldTags(capacityFor(count), 0);
  std::vector<Value*> oldValues(oldTags.size(), nullptr);
  oldTags.swap(tags_);
  oldValues.swap(values_);
  for (std::size_t i = 0; i < oldTags.size(); ++i) {
    if (!oldTags[i]) continue;
    std::size_t slot = home(oldTags[i]);
    while (tags_[slot]) slot = next(slot);
    tags_[slot] = oldTags[i];
    values_[slot] = oldValues[i];
  }
}

}  // namespace bnfold
