#pragma once
/// \file
/// ValueTable: a graph's values by name. Open addressing with linear probing, keyed by each value's own name. A probe
/// reads a 32-bit tag (the name's hash) and, only when the tag matches, the value's name: std::unordered_map chased a
/// list node per probe, which was the largest single cost of loading a graph of 50,000 nodes. Tags and values are
/// kept in two arrays sized to the count (not to a power of two), so that the table of a 100,000-value graph takes
/// 2 MB rather than 4.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

namespace bnfold {

class Value;

class ValueTable {
 public:
  /// The value registered under `name`, or null.
  Value* find(std::string_view name) const;
  /// Registers `value` under its current name, replacing any value registered under that name: returns that
  /// value, or null.
  Value* insert(Value* value);
  /// Gives `a`'s entry to `b` and `b`'s to `a`, for a caller that swaps their names next; false (and nothing
  /// changed) unless each is registered under its name.
  bool swapEntries(Value* a, Value* b);
  /// Room for `count` values without growing.
  void reserve(std::size_t count);
  std::size_t size() const { return size_; }
  /// How many values the table takes before it grows.
  std::size_t capacity() const;

 private:
  // Never 0, which marks an empty slot.
  static uint32_t tagOf(std::string_view name) {
    const auto hash = static_cast<uint32_t>(std::hash<std::string_view>{}(name));
    return hash == 0 ? 1 : hash;
  }
  // The slot a tag's probe starts at: the tag scaled to the capacity (a multiply, not a modulo).
  std::size_t home(uint32_t tag) const { return static_cast<std::size_t>((uint64_t{tag} * tags_.size()) >> 32); }
  std::size_t next(std::size_t slot) const { return slot + 1 == tags_.size() ? 0 : slot + 1; }
  // The slot holding `name`, or the empty slot where it would go.
  std::size_t probe(std::string_view name, uint32_t tag) const;
  /// The slot holding `value`, or kNoSlot. Tried first: the slot the value was given (Value::tableSlot_), which
  /// saves hashing its name and reading a tag (a rehash or another table may have made it stale, hence the check).
  std::size_t slotOf(const Value* value) const;
  static constexpr std::size_t kNoSlot = SIZE_MAX;
  // Rebuilt with room for `count` values at the highest load allowed.
  void rehash(std::size_t count);

  std::vector<uint32_t> tags_;  // 0: empty
  std::vector<Value*> values_;
  std::size_t size_ = 0;
};

}  // namespace bnfold
