// The windows registered on one communicator (ncclCommWindowRegister) and the symmem buffers that
// map them: an operand inside a window whose buffer exists is symmetric (zero copy), at its offset
// in the window, which NCCL's symmetric windows keep equal on every rank. Pure C++: lookups only.
#pragma once

#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>

#include "symmem/communicator.hpp"

namespace symmem::nccl {

struct Window {
  ncclWindow_t handle = nullptr;
  const char* begin = nullptr;  // the user's address of the window
  size_t bytes = 0;
  Buffer* buffer = nullptr;  // its symmem buffer; nullptr: calls on it are staged
};

class Windows {
 public:
  // A window registered twice at one address (NCCL allows it) is kept twice: each handle releases its own.
  void add(const Window& window) {
    by_begin_.emplace(window.begin, window);
    largest_ = std::max(largest_, window.bytes);
  }
  std::optional<Window> remove(ncclWindow_t handle);
  // The largest window that holds [p, p + bytes) when it has a buffer, else nullptr (staged). The
  // same window on every rank for windows that nest or are apart; partly overlapping windows may
  // resolve differently by rank.
  const Window* find(const void* p, size_t bytes) const;
  bool empty() const { return by_begin_.empty(); }
  void clear() {
    by_begin_.clear();
    largest_ = 0;
  }

 private:
  std::multimap<const char*, Window> by_begin_;
  size_t largest_ = 0;  // bytes of the largest window (bounds find's scan)
};

}  // namespace symmem::nccl
