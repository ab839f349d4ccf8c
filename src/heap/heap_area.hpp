// A range of the symmetric heap that the library allocated for itself (a workspace): the same
// offset on every rank, addressed here and at every local peer. Unlike a Buffer it has no signal
// pad and no peer table, and no user can reach it.
#pragma once

#include <cstddef>

#include "heap/heap.hpp"

namespace symmem::detail {

class HeapArea {
 public:
  HeapArea() = default;
  HeapArea(const Heap& heap, int rank, size_t offset, size_t bytes)
      : heap_(&heap), offset_(offset), bytes_(bytes), local_(heap.base(rank) + offset) {}

  void* ptr() const { return local_; }
  void* peer_ptr(int rank) const { return heap_->base(rank) + offset_; }  // a local rank
  size_t size() const { return bytes_; }

 private:
  const Heap* heap_ = nullptr;
  size_t offset_ = 0;
  size_t bytes_ = 0;
  char* local_ = nullptr;
};

}  // namespace symmem::detail
