#pragma once
// Software prefetch for the rules phase of a large model (see lib/rewrite/root_scan.cpp).

#include <cstdint>

namespace bnfold {

constexpr int kCacheLineBytes = 64;

/// Asks the CPU for `lines` cache lines from `start` on, without waiting for them. Prefetching never faults, so the
/// lines may run past the object at `start`.
inline void prefetchLines(const void* start, int lines = 1) {
  // Addresses as integers: a pointer past the end of its object would be undefined behaviour, an address is not.
  const auto address = reinterpret_cast<std::uintptr_t>(start);
  for (int line = 0; line < lines; ++line)
    __builtin_prefetch(reinterpret_cast<const void*>(address + static_cast<std::uintptr_t>(line) * kCacheLineBytes));
  // GCC takes a function that only prefetches for one that does nothing, and drops the calls to it (the prefetches
  // with them): this empty asm is an effect it has to keep.
  asm volatile("" : : "r"(address));
}

}  // namespace bnfold
