// Starting work on a second thread where the kernels read two sets of layers at once. No IR types here (STYLE.md).
#pragma once

#include <cstdint>
#include <future>
#include <system_error>
#include <utility>

namespace bnfold::kernels {

/// Below this many weights on either side of a split, a thread costs more than it saves.
inline constexpr std::int64_t kElementsWorthAThread = std::int64_t{1} << 17;

/// work() started on a new thread, or an empty future when none can be started (a container's thread limit): the
/// caller then does the work itself. The future waits for the thread when destroyed, also when the caller throws.
template <typename Work>
auto onSecondThread(Work work) -> std::future<decltype(work())> {
  try {
    return std::async(std::launch::async, std::move(work));
  } catch (const std::system_error&) {
    return {};
  }
}

}  // namespace bnfold::kernels
