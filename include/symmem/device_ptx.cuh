// The PTX instructions behind symmem's flags, one per function, named by semantics and scope: the
// ones include/symmem/device.cuh's helpers are made of, shared with the library's own kernels
// (src/device/ptx.cuh re-exports them) and mirrored by python/symmem/triton/ptx.py (a CPU test
// compares the instructions).
//
// Scope: every flag another GPU (or the host) reads or writes is accessed at system scope (.sys)
// with acquire or release semantics. A release store publishes this thread's earlier writes and,
// after a __syncthreads(), the whole block's (cumulativity); an acquire load makes the writer's
// data visible to this thread and, after a __syncthreads(), to the whole block.
#pragma once

#include <cstdint>

namespace symmem::dev {

// Load that synchronises-with a release store of another GPU (or the CPU) to the same flag.
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// Store that publishes every write this thread has observed (cumulativity) before the flag.
__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// The same for 64-bit flags {epoch << 32 | signature}: single-copy atomic, so the signature a
// waiter reads is the one stored with the epoch it reads.
__device__ __forceinline__ uint64_t ld_acquire_sys_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// Atomic add with release semantics: many senders counting into one word of a receiver.
__device__ __forceinline__ void red_add_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("red.release.sys.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Volatile access to host-mapped memory (the abort word, the failure record), never cached.
// Volatile orders nothing by itself: fence_acq_rel_sys around it does.
__device__ __forceinline__ uint32_t ld_volatile_u32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_volatile_u32(uint32_t* p, uint32_t v) {
  asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// Orders this thread's earlier accesses against later ones at system scope.
__device__ __forceinline__ void fence_acq_rel_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
// Orders this thread's accesses between the generic proxy and the async proxy (TMA, bulk copies):
// after acquiring a flag, before TMA loads the data behind it (without it a cp.async.bulk may read
// stale data); after bulk stores completed, before the release that tells peers their data arrived.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }
// Nanoseconds since an arbitrary origin, shared by all SMs of the GPU (coarse: ~1 us ticks).
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace symmem::dev
