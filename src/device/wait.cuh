// Waits with a deadline, the failure record they write, and the cross-rank barrier built on them.
//
// A wait spins on one acquire load (the only instruction of its hot loop); every 256 spins it also
// reads the communicator's abort word and the clock. It fails in three ways, each recorded in this
// rank's DeviceStatus by the first wait of this rank that fails (record_failure below):
//   - timeout:  the peer's flag did not come before the deadline;
//   - mismatch: the peer's flag came, but from a different call (its signature differs);
//   - aborted:  the abort word is set, another rank (or this rank's copy-engine watchdog) failed.
// The first two also set the abort word (after a system fence that publishes the record), so
// every wait of every rank leaves within 256 spins and every host can name the rank that failed
// first. A failed wait returns false and its kernel leaves; never __trap(), never a hang.
//
// Barrier flags are 64-bit words {epoch << 32 | signature}, stored by one single-copy-atomic
// release: the waiter that sees the epoch also sees the signature of the same call, so detecting a
// peer that called something else costs one compare after the flag came, nothing in the loop.
//
// Host memory: the failure record and the abort word live in the host board (mapped pinned host
// memory shared by every rank); they are read with volatile loads (never cached) and only every
// 256 spins, since one read is a PCIe round trip. Polling the abort word alone is enough: every
// recorder of a timeout or mismatch (these waits and the copy-engine watchdog) sets it after its
// record, so a failure of this rank's own is seen there too.
#pragma once

#include "device/device_types.hpp"
#include "device/ptx.cuh"

namespace symmem::device {

using detail::DeviceStatus;
using detail::SyncArgs;

// Records this rank's failure; the first failure of this rank wins (a later one changes nothing).
// A timeout or a mismatch also sets the abort word; `aborted` does not (it was set already).
// The winner is elected on a word in device memory: the record lives in host memory, where an
// atomic is atomic only on hosts with native host atomics (not x86 over PCIe; compute-sanitizer
// rejects it there). The record's code is written last, so a host that sees it sees the rest.
// (The copy-engine watchdog records host-side failures into the same record with a CPU atomic;
// both ask whether the code is still 0 first, so at worst two failures at the same instant mix.)
__device__ __forceinline__ void record_failure_at(const SyncArgs& s, uint32_t code, int peer, int32_t block, int phase,
                                                  uint32_t peer_signature) {
  // Cheap test first: after an abort every waiting thread comes here; one volatile read each
  // instead of a storm of atomics on the same word.
  if (ld_volatile_u32(&s.status->code) != detail::kStatusOk) return;
  if (atomicCAS(s.failure_claim, 0u, 1u) != 0u) {
    // Another wait of this rank is writing the record: return only once it is visible, or a
    // kernel of another stream could end first and its stream pass synchronize() unreported.
    // Bounded: the winner stores the code straight away (or found one the watchdog stored).
    while (ld_volatile_u32(&s.status->code) == detail::kStatusOk) {
    }
    return;
  }
  if (ld_volatile_u32(&s.status->code) != detail::kStatusOk) return;  // the watchdog's, meanwhile
  s.status->op = s.op;
  s.status->rank = s.rank;
  s.status->peer = peer;
  s.status->block = block;
  s.status->phase = phase;
  s.status->signature = s.signature;
  s.status->peer_signature = peer_signature;
  fence_acq_rel_sys();
  st_volatile_u32(&s.status->code, code);
  // Publishes the record (to every host, and before the abort word below).
  fence_acq_rel_sys();
  if (code != detail::kStatusAborted) {
    st_volatile_u32(s.abort, 1u);
    // Pushes the abort word out now: the other ranks' waits are polling it.
    fence_acq_rel_sys();
  }
}

// The usual record: `block` is the block that failed.
__device__ __forceinline__ void record_failure(const SyncArgs& s, uint32_t code, int peer, int phase,
                                               uint32_t peer_signature) {
  record_failure_at(s, code, peer, static_cast<int32_t>(blockIdx.x), phase, peer_signature);
}

// The slow half of every wait, run every 256 spins: false, after recording why, once the
// communicator is aborted or the deadline has passed.
__device__ __forceinline__ bool keep_waiting(const SyncArgs& s, uint64_t start, int peer, int phase) {
  if (ld_volatile_u32(s.abort) != 0u) {
    record_failure(s, detail::kStatusAborted, peer, phase, 0);
    return false;
  }
  if (global_timer_ns() - start > s.timeout_ns) {
    record_failure(s, detail::kStatusTimeout, peer, phase, 0);
    return false;
  }
  return true;
}

// Waits until the peer's barrier flag carries epoch `epoch` or the next one (modulo 2^32).
//   Equal epoch: the flag is the peer's for this same barrier, so it must carry our signature;
//   another one means the peer called something else (mismatch).
//   Next epoch: the peer's block finished its call of `epoch`, which needed its first barrier to
//   pass on this rank's flag of exactly `epoch` (this rank has not passed: it stored no later one)
//   carrying the peer's own signature; so the calls matched, and the later flag's signature (of
//   the peer's next call) is not ours to check. This happens after a one-barrier kernel (one-shot
//   push, the barrier kernel): the peer leaves it on seeing this rank's flag and may store its
//   next call's flag before this rank has read the current one.
// False on timeout, mismatch or abort.
__device__ __forceinline__ bool wait_barrier_flag(const uint64_t* flag, uint32_t epoch, const SyncArgs& s, int peer,
                                                  int phase) {
  const uint64_t start = global_timer_ns();
  for (uint32_t spins = 1;; ++spins) {
    const uint64_t f = ld_acquire_sys_u64(flag);
    // A peer is at most one call ahead (it needs this rank's flag of `epoch` to go further), so
    // only 0 and 1 count as arrived: a stale flag of a phase unused for 2^31 calls must not pass.
    const uint32_t ahead = static_cast<uint32_t>(f >> 32) - epoch;
    if (ahead <= 1u) {
      const uint32_t signature = static_cast<uint32_t>(f);
      if (ahead == 1u || signature == s.signature) return true;
      record_failure(s, detail::kStatusMismatch, peer, phase, signature);
      return false;
    }
    if ((spins & 255u) == 0u && !keep_waiting(s, start, peer, phase)) return false;
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
    if (!wait_barrier_flag(s.pad + detail::signal_slot(phase, blockIdx.x, peer), epoch, s, peer, phase)) ok[phase] = 0;
  }
  __syncthreads();
  return ok[phase] != 0;
}

}  // namespace symmem::device
