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
#include <optional>
#include <set>
#include <vector>

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
  // Collective: maps memory the caller allocated into the heap, zero copy: every rank's cuMem
  // allocation holding [ptr, ptr + bytes) (cuMemRetainAllocationHandle), at one offset on every
  // rank, this rank's own allocation mapped there a second time. The allocation must be exportable
  // as a POSIX file descriptor (cuMemCreate with that handle type, as ncclMemAlloc makes it; not
  // cudaMalloc memory) and hold the whole range, with the same size and the range at the same offset
  // from its start on every rank. Throws on every rank alike (kUnsupported naming the rank and the
  // cause) when any rank's cannot. Returns the heap offset of the allocation's start; *delta is the
  // range's offset from it. Released like an allocation (release), which drops this rank's
  // reference to the memory and never frees the caller's.
  size_t import(const void* ptr, size_t bytes, Bootstrap& bootstrap, FdExchange& exchange, size_t* delta);
  // Local: unmaps the allocation holding heap offset `offset` from this process (peers must be done
  // with it), and returns its range to the free list. Only at a point every rank shares (a
  // collective free): the ranks' free lists must stay alike.
  void release(size_t offset) noexcept;
  // Local, at any point (an imported allocation, released when the program says, on each rank at
  // its own time): unmaps it here; its range returns to the free list once every rank released it,
  // agreed at the next allocate or import.
  void release_local(size_t offset) noexcept;

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
  // Unmaps the allocation holding heap offset `offset` (its mapping forgotten); its start, or
  // nothing when no allocation holds it. The range stays taken: the caller returns it.
  std::optional<size_t> unmap_holding(size_t offset) noexcept;
  // Collective, first in allocate and import: the ranges every rank has released locally return to
  // the free list, alike on every rank.
  void return_released_ranges(Bootstrap& bootstrap);
  // Maps rank `r`'s memory (m.handles[r]) at `offset` of its range here, readable and writable by
  // this device.
  void map_rank(int r, size_t offset, Mapping& m);
  // Passes this rank's descriptor (closed here) to every peer and maps every peer's memory at
  // `offset`. Throws; the caller agrees on the outcome with the peers.
  void map_peers(size_t offset, Mapping& m, int* my_fd, std::vector<int>* peer_fds, FdExchange& exchange);

  int device_;
  int rank_;
  int world_;
  size_t reserve_;
  size_t granularity_ = 0;
  CUdeviceptr base_ = 0;
  RangeAllocator ranges_;
  std::map<size_t, Mapping> mappings_;
  std::set<size_t> released_;  // ranges released here (release_local), not yet by every rank
};

}  // namespace symmem::detail
