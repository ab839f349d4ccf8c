// Waits with a deadline and the cross-rank barrier built on them.
//
// A wait spins on an acquire load; every 256 spins it checks the clock and the status word. At
// the deadline the first waiter records {op, rank, peer, block, phase} in the host-visible status
// word and every waiter returns false, so the kernel leaves instead of hanging; once the status
// is set, all other waits of every kernel of the communicator fail fast. Never __trap().
#pragma once

#include "device/device_types.hpp"
#include "device/ptx.cuh"

namespace symmem::device {

using detail::DeviceStatus;
using detail::SyncArgs;

__device__ __forceinline__ void record_timeout(const SyncArgs& s, int peer, int phase) {
  if (atomicCAS(&s.status->code, 0u, 1u) == 0u) {
    s.status->op = s.op;
    s.status->rank = s.rank;
    s.status->peer = peer;
    s.status->block = static_cast<int32_t>(blockIdx.x);
    s.status->phase = phase;
    fence_acq_rel_sys();
  }
}

// Waits until *flag >= target (modulo 2^32 wrap). False on timeout or an earlier failure.
__device__ __forceinline__ bool wait_flag_at_least(const uint32_t* flag, uint32_t target, const SyncArgs& s, int peer,
                                                   int phase) {
  const uint64_t start = global_timer_ns();
  for (uint32_t spins = 1;; ++spins) {
    if (static_cast<int32_t>(ld_acquire_sys(flag) - target) >= 0) return true;
    if ((spins & 255u) == 0u) {
      if (ld_volatile_u32(&s.status->code) != 0u) return false;
      if (global_timer_ns() - start > s.timeout_ns) {
        record_timeout(s, peer, phase);
        return false;
      }
    }
  }
}

// Reads this block's epoch for the kernel (one per block, kept on the device so that CUDA graph
// replays advance it). Must be called by all threads; the block commits it with epoch_commit.
__device__ __forceinline__ uint32_t epoch_begin(const SyncArgs& s) {
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) epoch = s.epochs[blockIdx.x] + 1;
  __syncthreads();
  return epoch;
}

__device__ __forceinline__ void epoch_commit(const SyncArgs& s, uint32_t epoch) {
  if (threadIdx.x == 0) s.epochs[blockIdx.x] = epoch;
}

// Barrier among the same-index blocks of every rank. Block b of each rank tells block b of every
// peer that it reached `phase` of `epoch`, then waits for the same from each of them. Writes of
// this block before the barrier are visible to the peers' block b after it (release/acquire at
// system scope, cumulative through __syncthreads). Returns false if any wait failed.
// The verdict lives in one shared word per phase: with a single word, the next barrier's reset
// raced with slow warps still reading this one's (compute-sanitizer racecheck). A kernel uses
// each phase once. (__syncthreads_and also avoids the race but cost the 16-block pull all-gather
// 10% on 2 x H200, 291 against 324-332 GB/s, measured A/B on one machine.)
__device__ __forceinline__ bool barrier(const SyncArgs& s, uint32_t epoch, int phase) {
  __shared__ int ok[detail::kBarrierPhases];
  if (threadIdx.x == 0) ok[phase] = 1;
  __syncthreads();
  const int peer = threadIdx.x;
  if (peer < s.world && peer != s.rank) {
    st_release_sys(s.peer_pads[peer] + detail::signal_slot(phase, blockIdx.x, s.rank), epoch);
    if (!wait_flag_at_least(s.pad + detail::signal_slot(phase, blockIdx.x, peer), epoch, s, peer, phase)) ok[phase] = 0;
  }
  __syncthreads();
  return ok[phase] != 0;
}

}  // namespace symmem::device
