// The symmetric heap: the only code that calls cuMem*.
//
// One virtual range of world * reserve bytes is reserved per process; rank r's memory is mapped
// at base + r * reserve, so a buffer at heap offset o is at base + r * reserve + o for every
// rank r, in every process. An allocation creates a physical chunk on this GPU, exports it as a
// POSIX file descriptor, passes it to every local peer (FdExchange), imports and maps theirs, and
// grants this device read/write access to all of them. Failure at any step releases what this
// rank made and is reported on every rank.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <map>

#include "bootstrap/fd_exchange.hpp"
#include "device/device_types.hpp"
#include "heap/range_allocator.hpp"
#include "symmem/bootstrap.hpp"

namespace symmem::detail {

class Heap {
 public:
  Heap(int device, int rank, int world, size_t reserve_per_rank);
  ~Heap();  // unmaps and releases every mapping of this process; never throws
  Heap(const Heap&) = delete;
  Heap& operator=(const Heap&) = delete;

  // Collective: the same size on every rank (checked by the caller). Returns the heap offset;
  // the range holds round_up(bytes, granularity) bytes.
  size_t allocate(size_t bytes, Bootstrap& bootstrap, FdExchange& exchange);
  // Local: unmaps the allocation at offset from this process (peers must be done with it).
  void release(size_t offset) noexcept;

  char* base(int rank) const { return reinterpret_cast<char*>(base_) + size_t(rank) * reserve_; }
  // Bytes between two consecutive ranks' copies of any heap address (the per-rank reserve).
  size_t stride() const { return reserve_; }
  size_t granularity() const { return granularity_; }
  size_t mapped_bytes() const;

 private:
  struct Mapping {
    size_t size = 0;
    CUmemGenericAllocationHandle handles[kMaxWorld] = {};
    bool mapped[kMaxWorld] = {};
  };
  void unmap(size_t offset, Mapping& m) noexcept;

  int device_;
  int rank_;
  int world_;
  size_t reserve_;
  size_t granularity_ = 0;
  CUdeviceptr base_ = 0;
  RangeAllocator ranges_;
  std::map<size_t, Mapping> mappings_;
};

}  // namespace symmem::detail
