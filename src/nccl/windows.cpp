#include "nccl/windows.hpp"


namespace symmem::nccl {

std::optional<Window> Windows::remove(ncclWindow_t handle) {
  for (auto it = by_begin_.begin(); it != by_begin_.end(); ++it) {
    if (it->second.handle != handle) continue;
    Window w = it->second;
    by_begin_.erase(it);
    return w;
  }
  return std::nullopt;
}

const Window* Windows::find(const void* p, size_t bytes) const {
  // The largest window holding the range (the lowest-addressed, then the first registered, of
  // equal ones), not the nearest: windows nest (a pool and a part of it), an operand's rank-dependent
  // offset (an in-place reduce-scatter's output) may fall in the inner one on some ranks only, and
  // every rank must find the same window for its operands, as the outermost one is on every rank.
  const char* c = static_cast<const char*>(p);
  const Window* best = nullptr;
  for (auto it = by_begin_.begin(); it != by_begin_.end() && it->first <= c; ++it) {
    const Window& w = it->second;
    if (!w.buffer || bytes > w.bytes || size_t(c - w.begin) > w.bytes - bytes) continue;
    if (!best || w.bytes > best->bytes) best = &w;
  }
  return best;
}

}  // namespace symmem::nccl
