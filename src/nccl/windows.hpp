// The windows registered on one communicator (ncclCommWindowRegister) and the symmem buffers that
// map them: an operand inside a window whose buffer exists is symmetric (zero copy), at its offset
// in the window, which NCCL's symmetric windows keep equal on every rank. Pure C++: lookups only.
#pragma once

#include <nccl.h>

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
  void add(const Window& window) { by_begin_.emplace(window.begin, window); }
  std::optional<Window> remove(ncclWindow_t handle);
  // The largest window with a buffer that holds [p, p + bytes), or nullptr.
  const Window* find(const void* p, size_t bytes) const;
  bool empty() const { return by_begin_.empty(); }
  void clear() { by_begin_.clear(); }

 private:
  std::multimap<const char*, Window> by_begin_;
};

}  // namespace symmem::nccl
