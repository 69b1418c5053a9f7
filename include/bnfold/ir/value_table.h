#pragma once
/// \file
/// ValueTable: a graph's values by name. Open addressing with linear probing over (hash, Value*) slots, keyed by
/// each value's own name: a lookup touches one slot and, when the hash matches, that one value. std::unordered_map
/// chased a list node per probe, which was the largest single cost of loading a graph of 50,000 nodes.

#include <cstddef>
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
  /// Removes whatever is registered under `name`. Rename a value by erasing it, renaming, inserting it again.
  void erase(std::string_view name);
  /// Room for `count` values without growing.
  void reserve(std::size_t count);
  std::size_t size() const { return size_; }

 private:
  struct Slot {
    std::size_t hash = 0;
    Value* value = nullptr;  // null: empty
  };
  static std::size_t hashOf(std::string_view name) { return std::hash<std::string_view>{}(name); }
  // The slot holding `name`, or the empty slot where it would go.
  std::size_t probe(std::string_view name, std::size_t hash) const;
  void rehash(std::size_t capacity);

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace bnfold
