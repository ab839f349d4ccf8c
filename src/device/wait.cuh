// The library's kernels' waits: the bounded wait loop, the failure record and the barrier-flag
// wait are the public device API's (include/symmem/device.cuh, where their contract is written),
// run here on the library's SyncArgs; this file adds the library's per-block epochs and its
// barrier. A failed wait returns false and its kernel leaves; never __trap(), never a hang.
//
// Barrier flags are 64-bit words {epoch << 32 | signature}, stored by one single-copy-atomic
// release: the waiter that sees the epoch also sees the signature of the same call, so detecting a
// peer that called something else costs one compare after the flag came, nothing in the loop.
#pragma once

#include "device/device_types.hpp"
#include "device/ptx.cuh"
#include "symmem/device.cuh"

namespace symmem::detail {

// The kind of call a collective's failure record names (dev::record_failure_at).
__device__ __forceinline__ uint32_t failure_op(const SyncArgs& s) { return s.op; }

}  // namespace symmem::detail

namespace symmem::device {

using detail::DeviceStatus;
using detail::SyncArgs;
using dev::keep_waiting;
using dev::abort_turn;
using dev::record_failure;
using dev::record_failure_at;
using dev::wait_barrier_flag;

// Reads this block's epoch for the kernel (one per block, kept on the device so that CUDA graph
// replays advance it). Must be called by all threads; the block commits it with epoch_commit.
// epoch_after: the same read by one thread, for a kernel that shares it through its own barrier.
__device__ __forceinline__ uint32_t epoch_after(const SyncArgs& s) { return s.epochs[blockIdx.x] + 1; }
__device__ __forceinline__ uint32_t epoch_begin(const SyncArgs& s) {
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) epoch = epoch_after(s);
  __syncthreads();
  return epoch;
}

__device__ __forceinline__ void epoch_commit(const SyncArgs& s, uint32_t epoch) {
  if (threadIdx.x == 0) s.epochs[blockIdx.x] = epoch;
}

// Barrier among the same-index blocks of every rank. Block b of each rank tells block b of every
// peer that it reached `phase` of `epoch` in the call `s.signature`, then waits for the same from
// each of them. Writes of this block before the barrier are visible to the peers' block b after it
// (release/acquire at system scope, cumulative through __syncthreads). Returns false if any wait
// failed (timeout, a peer in a different call, or an abort).
// The verdict lives in one shared word per phase: with a single word, the next barrier's reset
// raced with slow warps still reading this one's (compute-sanitizer racecheck). A kernel uses
// each phase once. (__syncthreads_and also avoids the race but cost the 16-block pull all-gather
// 10% on 2 x H200, 291 against 324-332 GB/s, measured A/B on one machine.)
// The flag, barrier_flag(epoch, signature), is assembled in shared memory from its two 32-bit
// halves (little-endian: the epoch is the upper one) and read back as one 64-bit word. Built from
// `epoch` in registers, the 64-bit value changed ptxas's allocation across the whole kernel: the
// one-shot 16-bit reduction loop got two more spills per iteration (6 STL/LDL instead of 4; SASS
// of nvcc 13.0, sm_90). Through shared memory, every kernel's loops compile as with 32-bit flags.
// One word serves every phase: it is read before the barrier's second __syncthreads, and the next
// barrier writes it only after that.
__device__ __forceinline__ bool barrier(const SyncArgs& s, uint32_t epoch, int phase) {
  __shared__ int ok[detail::kBarrierPhases];
  __shared__ uint64_t flag;
  if (threadIdx.x == 0) {
    ok[phase] = 1;
    reinterpret_cast<uint32_t*>(&flag)[0] = s.signature;
    reinterpret_cast<uint32_t*>(&flag)[1] = epoch;
  }
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer < s.world && peer != s.rank) {
    st_release_sys_u64(s.peer_pads[peer] + detail::signal_slot(phase, blockIdx.x, s.rank), flag);
    if (!wait_barrier_flag(s, s.pad + detail::signal_slot(phase, blockIdx.x, peer), epoch, peer, phase)) ok[phase] = 0;
  }
  __syncthreads();
  return ok[phase] != 0;
}

// The two halves of a barrier, for kernels that meet their peers' same-index blocks many times
// per call with work in between (reduce_pipelined): a block signals once its stores for `phase` of
// `epoch` are done (its threads' writes before it are visible to the peers' block after their
// wait, as in barrier), and later waits for every peer's signal of the same (or the next epoch, as
// barrier's wait). Unlike barrier's, the verdict is a __syncthreads_and, not a shared word: a phase
// is waited on once per step here, and a word reused step after step would race with slow warps
// still reading the last verdict.
__device__ __forceinline__ void signal_peers(const SyncArgs& s, uint32_t epoch, int phase) {
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer < s.world && peer != s.rank)
    st_release_sys_u64(s.peer_pads[peer] + detail::signal_slot(phase, blockIdx.x, s.rank),
                       detail::barrier_flag(epoch, s.signature));
}

__device__ __forceinline__ bool wait_for_peers(const SyncArgs& s, uint32_t epoch, int phase) {
  const int peer = threadIdx.x;
  bool ok = true;
  if (peer < s.world && peer != s.rank)
    ok = wait_barrier_flag(s, s.pad + detail::signal_slot(phase, blockIdx.x, peer), epoch, peer, phase);
  return __syncthreads_and(ok) != 0;
}

}  // namespace symmem::device
