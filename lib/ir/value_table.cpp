#include "bnfold/ir/value_table.h"

#include "bnfold/ir/graph.h"

namespace bnfold {

std::size_t ValueTable::probe(std::string_view name, std::size_t hash) const {
  const std::size_t mask = slots_.size() - 1;
  for (std::size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& slot = slots_[i];
    if (!slot.value || (slot.hash == hash && slot.value->name() == name)) return i;
  }
}

Value* ValueTable::find(std::string_view name) const {
  if (size_ == 0) return nullptr;
  return slots_[probe(name, hashOf(name))].value;
}

Value* ValueTable::insert(Value* value) {
  if (2 * (size_ + 1) > slots_.size()) rehash(slots_.empty() ? 16 : 2 * slots_.size());
  const std::size_t hash = hashOf(value->name());
  Slot& slot = slots_[probe(value->name(), hash)];
  Value* replaced = slot.value;
  if (!replaced) ++size_;
  slot = {hash, value};
  return replaced;
}

void ValueTable::erase(std::string_view name) {
  if (size_ == 0) return;
  const std::size_t mask = slots_.size() - 1;
  std::size_t hole = probe(name, hashOf(name));
  if (!slots_[hole].value) return;
  slots_[hole] = {};
  --size_;
  // Backward-shift deletion: move later entries of the probe run into the hole when their home slot allows it,
  // so that no lookup stops early at the hole (no tombstones).
  for (std::size_t next = (hole + 1) & mask; slots_[next].value; next = (next + 1) & mask) {
    const std::size_t home = slots_[next].hash & mask;
    const bool homeAfterHole = hole <= next ? (hole < home && home <= next) : (hole < home || home <= next);
    if (homeAfterHole) continue;
    slots_[hole] = slots_[next];
    slots_[next] = {};
    hole = next;
  }
}

void ValueTable::reserve(std::size_t count) {
  std::size_t capacity = slots_.empty() ? 16 : slots_.size();
  while (capacity < 2 * count) capacity *= 2;
  if (capacity > slots_.size()) rehash(capacity);
}

void ValueTable::rehash(std::size_t capacity) {
  std::vector<Slot> old(capacity);
  old.swap(slots_);
  const std::size_t mask = capacity - 1;
  for (const Slot& slot : old) {
    if (!slot.value) continue;
    std::size_t i = slot.hash & mask;
    while (slots_[i].value) i = (i + 1) & mask;
    slots_[i] = slot;
  }
}

}  // namespace bnfold
