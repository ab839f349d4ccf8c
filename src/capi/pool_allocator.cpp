// Allocation functions for torch.cuda.memory.CUDAPluggableAllocator, so that a torch MemPool can
// hand out symmetric heap memory. A pluggable allocator is a pair of named C functions with no
// context argument, hence a fixed number of slots, each bound to one communicator.
//
// Lifetime: allocation is collective (Communicator::allocate); a free from the caching allocator
// retires the segment instead of unmapping it, because freeing is collective too and the caching
// allocator frees on its own schedule (empty_cache, out-of-memory retries) that differs across
// ranks. Retired segments return to the heap when the communicator closes; the slot counts the
// segments its pool still holds, so that the binding knows when nothing of the pool is in use.
#include <atomic>
#include <string>

#include "capi/c_api_comm.hpp"
#include "capi/c_api_guard.hpp"
#include "symmem/symmem_c.h"

namespace symmem::detail {
namespace {

std::atomic<symmem_comm*> pool_slots[SYMMEM_POOL_SLOTS];
// Segments a slot handed out that its pool has not freed yet: while any lives, tensors of the pool
// may use the communicator's memory (the binding releases it only then).
std::atomic<long> live_segments[SYMMEM_POOL_SLOTS];

void* pool_alloc(int slot, ssize_t size, int device) {
  void* ptr = nullptr;
  c_api_guard([&] {
    symmem_comm* comm = pool_slots[slot].load(std::memory_order_acquire);
    if (!comm || !comm->comm)
      throw Error(ErrorCode::kInvalidArgument, "symmem pool slot " + std::to_string(slot) + " has no communicator");
    if (device != comm->comm->device())
      throw Error(ErrorCode::kInvalidArgument, "symmem pool: allocation on device " + std::to_string(device) +
                                                   " for a communicator of device " +
                                                   std::to_string(comm->comm->device()));
    if (size <= 0) throw Error(ErrorCode::kInvalidArgument, "symmem pool: allocation of " + std::to_string(size) + " bytes");
    ptr = comm->comm->allocate(static_cast<size_t>(size))->ptr();
    live_segments[slot].fetch_add(1, std::memory_order_acq_rel);
  });
  return ptr;
}

void pool_free(int slot, void* ptr) {
  if (ptr) live_segments[slot].fetch_sub(1, std::memory_order_acq_rel);
}

}  // namespace

void release_pool_slots_of(const symmem_comm* comm) noexcept {
  for (auto& slot : pool_slots) {
    symmem_comm* expected = const_cast<symmem_comm*>(comm);
    slot.compare_exchange_strong(expected, nullptr);
  }
}

}  // namespace symmem::detail

extern "C" {

int symmem_pool_bind(int slot, symmem_comm* comm) {
  return symmem::detail::c_api_guard([&] {
    if (slot < 0 || slot >= SYMMEM_POOL_SLOTS)
      throw symmem::Error(symmem::ErrorCode::kInvalidArgument,
                          "symmem_pool_bind: slot " + std::to_string(slot) + " of " + std::to_string(SYMMEM_POOL_SLOTS));
    symmem::detail::pool_slots[slot].store(comm, std::memory_order_release);
  });
}

long symmem_pool_live_segments(int slot) {
  if (slot < 0 || slot >= SYMMEM_POOL_SLOTS) return -1;
  return symmem::detail::live_segments[slot].load(std::memory_order_acquire);
}

#define SYMMEM_DEFINE_POOL_SLOT(k)                                                                   \
  void* symmem_pool_alloc_##k(ssize_t size, int device, void*) {                                    \
    return symmem::detail::pool_alloc(k, size, device);                                               \
  }                                                                                                  \
  void symmem_pool_free_##k(void* ptr, ssize_t, int, void*) { /* retired until close (see the top) */ \
    symmem::detail::pool_free(k, ptr);                                                               \
  }
SYMMEM_DEFINE_POOL_SLOT(0)
SYMMEM_DEFINE_POOL_SLOT(1)
SYMMEM_DEFINE_POOL_SLOT(2)
SYMMEM_DEFINE_POOL_SLOT(3)
SYMMEM_DEFINE_POOL_SLOT(4)
SYMMEM_DEFINE_POOL_SLOT(5)
SYMMEM_DEFINE_POOL_SLOT(6)
SYMMEM_DEFINE_POOL_SLOT(7)
#undef SYMMEM_DEFINE_POOL_SLOT

}  // extern "C"
