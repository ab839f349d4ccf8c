// Every inline PTX instruction symmem uses, one per function, named by semantics and scope. Those
// behind the flags (acquire/release at system scope, volatile access to host memory, fences, the
// clock) are the public device API's (include/symmem/device_ptx.cuh), re-exported here: users'
// kernels and the library's use the same instructions.
#pragma once

#include <cstdint>

#include "symmem/device_ptx.cuh"

namespace symmem::device {

using dev::fence_acq_rel_sys;
using dev::fence_proxy_async_global;
using dev::global_timer_ns;
using dev::ld_acquire_sys;
using dev::ld_acquire_sys_u64;
using dev::ld_volatile_u32;
using dev::st_release_sys;
using dev::st_release_sys_u64;
using dev::st_volatile_u32;

// Programmatic dependent launch (device/dependent_launch.cuh): waits until the grids this one
// depends on have completed and their memory operations are visible; a no-op without PDL.
__device__ __forceinline__ void wait_for_prerequisite_grids() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// Lets the dependent grid (the next kernel on the stream, launched with PDL) be scheduled now.
__device__ __forceinline__ void allow_dependent_grids() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// Relaxed 8-byte store/load visible across GPUs, single-copy atomic: the low-latency protocol
// packs {tag << 32 | data} in one word, so a reader that sees the tag also sees its data.
__device__ __forceinline__ void st_relaxed_sys_u64(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t ld_relaxed_sys_u64(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// Atomic add at GPU scope with release semantics, returning the old value: a block counting itself
// after its reads (what it read before is ordered before the count), without a separate fence.
__device__ __forceinline__ uint32_t atomic_add_release_gpu(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.release.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// --- Hopper bulk copies (TMA engine) and the mbarrier that tracks them -------------------------

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(bar)), "r"(count) : "memory");
}

// Makes initialised mbarriers visible to the async proxy that completes them.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
               : "=r"(done)
               : "r"(shared_address(bar)), "r"(parity)
               : "memory");
  return done != 0;
}

// One arrival on `bar` (release at CTA scope: this thread's accesses before it are ordered before
// the phase's completion, which a try_wait acquires).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(bar)) : "memory");
}

// Global -> shared bulk load; completes `bytes` of transaction count on `bar`.
__device__ __forceinline__ void bulk_load_shared(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(smem)),
               "l"(gmem), "r"(bytes), "r"(shared_address(bar))
               : "memory");
}

// Shared -> global bulk store (the destination may be a peer GPU's memory), in a bulk group.
__device__ __forceinline__ void bulk_store_global(void* gmem, const void* smem, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(gmem), "r"(shared_address(smem)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Waits until at most N bulk groups still read their shared-memory source.
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

// Waits until every bulk group has completed (writes performed).
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

}  // namespace symmem::device
