#include "nccl/windows.hpp"

#include <algorithm>

namespace symmem::nccl {

std::optional<Window> Windows::remove(ncclWindow_t handle) {
  for (auto it = by_begin_.begin(); it != by_begin_.end(); ++it) {
    if (it->second.handle != handle) continue;
    Window w = it->second;
    by_begin_.erase(it);
    largest_ = 0;
    for (const auto& [begin, other] : by_begin_) largest_ = std::max(largest_, other.bytes);
    return w;
  }
  return std::nullopt;
}

const Window* Windows::find(const void* p, size_t bytes) const {
  // The largest window holding the range (of equal ones, the lowest-addressed, then the first
  // registered), not the nearest below: windows nest (a pool and a part of it), an operand's
  // rank-dependent offset (an in-place reduce-scatter's output) may fall in the inner one on some
  // ranks only, and every rank must find the same window for its operands, as the outermost one is
  // on every rank. Chosen among all windows, those without a buffer too: an outer window that
  // stayed staged keeps its operands staged on every rank, whatever inner window holds them.
  const char* c = static_cast<const char*>(p);
  const Window* best = nullptr;
  // Backwards from the last window starting at or below p, while one starting that far below could
  // still hold p (no window is larger than largest_).
  for (auto it = by_begin_.upper_bound(c); it != by_begin_.begin();) {
    --it;
    const Window& w = it->second;
    if (size_t(c - w.begin) > largest_) break;
    if (bytes > w.bytes || size_t(c - w.begin) > w.bytes - bytes) continue;
    if (!best || w.bytes >= best->bytes) best = &w;  // >=: backwards, so the lower (earlier) one wins ties
  }
  return best && best->buffer ? best : nullptr;
}

}  // namespace symmem::nccl
