#include "nccl/windows.hpp"

#include <iterator>

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
  const char* c = static_cast<const char*>(p);
  auto it = by_begin_.upper_bound(c);  // the first window starting after p
  if (it == by_begin_.begin()) return nullptr;
  const char* nearest = std::prev(it)->first;
  while (it != by_begin_.begin() && std::prev(it)->first == nearest) {
    const Window& w = (--it)->second;
    if (w.buffer && bytes <= w.bytes && size_t(c - w.begin) <= w.bytes - bytes) return &w;
  }
  return nullptr;
}

}  // namespace symmem::nccl
