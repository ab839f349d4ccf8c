// The device API for users' kernels on the symmetric heap: peer addresses, acquire/release flags,
// signals, a barrier, put-with-signal, and waits that cannot hang. python/symmem/triton mirrors it
// by name for Triton kernels. The rules (what a signal pad may hold, ordering, epochs, one ordered
// stream per communicator) are in docs/kernels.md; examples/cuda/ has a complete kernel.
//
//   __global__ void k(symmem::Buffer::DeviceHandle in, float* out, size_t n, symmem::UserSync sync) {
//     const uint32_t epoch = symmem::dev::epoch_begin(sync);
//     if (!symmem::dev::barrier(sync, epoch, 0)) return;    // every rank's `in` is written
//     ... read symmem::dev::peer_ptr(in, local, p) ...
//     if (symmem::dev::barrier(sync, epoch, 1)) symmem::dev::epoch_commit(sync, epoch);
//   }
//   // host: const symmem::UserSync sync = symmem::begin_user_call(comm, "my_kernel(n=...)", blocks, stream);
//   //       k<<<blocks, threads, 0, stream>>>(buf->device_handle(), out, n, sync);
//   //       symmem::end_user_call(comm, stream);
//
// Every wait here has the communicator's deadline and polls its abort word. A wait that fails
// records why in this rank's failure record (timeout: the peer never came; mismatch: the peer is
// in a different call; aborted: another rank failed first), sets the abort word so that every wait
// of every rank leaves, and returns false; the kernel then returns. comm.check() raises kTimeout /
// kMismatch naming the peer and both calls, on every rank. Never __trap(): a trap kills the CUDA
// context, and the process could not even say which peer was missing.
//
// The PTX instructions (acquire/release at system scope, volatile access to host memory, fences,
// the clock) are in symmem/device_ptx.cuh.
#pragma once

#include <cstddef>
#include <cstdint>

#include "symmem/communicator.hpp"
#include "symmem/device_ptx.cuh"
#include "symmem/user_call.hpp"

namespace symmem::dev {

// ---- Peers --------------------------------------------------------------------------------------

// Peer `peer`'s copy of `local`, an address inside the buffer `h` on this rank (no load: the
// handle carries every peer's base).
template <typename T>
__device__ __forceinline__ T* peer_ptr(const Buffer::DeviceHandle& h, T* local, int peer) {
  const ptrdiff_t offset = reinterpret_cast<const char*>(local) - static_cast<const char*>(h.local);
  return reinterpret_cast<T*>(static_cast<char*>(h.peers[peer]) + offset);
}

// Word `word` of peer `peer`'s signal pad of buffer `h` (where this rank signals that peer).
__device__ __forceinline__ uint32_t* peer_signal(const Buffer::DeviceHandle& h, int peer, size_t word) {
  return h.peer_signal_pads[peer] + word;
}

// ---- Failure ------------------------------------------------------------------------------------
//
// A wait spins on one acquire load (the only instruction of its hot loop); every 256 spins (a
// round) it also runs keep_waiting: the clock, this rank's claim word (device memory: set once any
// wait of this rank has failed) and, in its turn, the communicator's abort word. It fails in three
// ways, each recorded in this rank's failure record by the first wait of this rank that fails:
//   - timeout:  the peer's flag did not come before the deadline;
//   - mismatch: the peer's flag came, but from a different call (its signature differs);
//   - aborted:  the abort word is set: another rank (or this rank's copy-engine watchdog) failed.
// The first two also set the abort word (after a system fence that publishes the record), so every
// wait of every rank leaves soon after, and every host can name the rank that failed first.
// The failure record and the abort word live in host memory shared by every rank (the host board):
// they are read with volatile loads (never cached), each a PCIe round trip. A low-latency kernel's
// thousands of threads each reading the abort word every round while a peer was late made its
// calls up to 1.4 ms slower than the peer's lateness (2 x H200, 128-512 KiB all-reduce,
// bench/results/h200x2/skew_ab_2.csv; with the quiet time and turns, +-55 us, as NCCL's). Hence
// the abort word is read only once a wait is older than kAbortQuietNs (a late peer, not a failure,
// is the usual reason to wait that long), and then in turns (abort_turn): one thread of a block a
// round where every thread waits, of a warp where few do. The first thread of a rank that sees it
// claims the record, and every other wait of the rank leaves on the claim word within a round.
// Polling the abort word alone is enough: every recorder of a timeout or mismatch sets it after
// its record, so a failure of this rank's own is seen there too.
//
// These functions are the library's own waits as well: `Sync` is UserSync in users' kernels, and
// the library's synchronisation arguments in its collectives (the same fields: failure,
// failure_claim, abort, timeout_ns, rank, signature; failure_op(s) names the call's kind).

// The kind of call a user kernel's failure record names.
__device__ __forceinline__ uint32_t failure_op(const UserSync&) { return kUserCallOp; }

// Records this rank's failure as block `block`'s; the first failure of this rank wins (a later one
// changes nothing). A timeout or mismatch also sets the abort word; `aborted` does not (it was set
// already). The winner is elected on a word in device memory: the record lives in host memory,
// where an atomic is atomic only on hosts with native host atomics (not x86 over PCIe;
// compute-sanitizer rejects it there). The record's code is written last, so a host that sees it
// sees the rest. (The copy-engine watchdog records host-side failures into the same record with a
// CPU atomic; both ask whether the code is still 0 first, so at worst two failures at the same
// instant mix.)
template <typename Sync>
__device__ __forceinline__ void record_failure_at(const Sync& s, uint32_t code, int peer, int32_t block, int phase,
                                                  uint32_t peer_signature) {
  // Cheap test first: after an abort every waiting thread comes here; one volatile read each
  // instead of a storm of atomics on the same word.
  if (ld_volatile_u32(&s.failure->code) != kFailureNone) return;
  if (atomicCAS(s.failure_claim, 0u, 1u) != 0u) {
    // Another wait of this rank is writing the record: return only once it is visible, or a
    // kernel of another stream could end first and its stream pass synchronize() unreported. The
    // winner stores the code straight away, waiting for nothing (or found one the watchdog
    // stored), and independent thread scheduling lets it run even when it shares this thread's
    // warp; the deadline bounds this wait all the same, as every wait is bounded.
    const uint64_t start = global_timer_ns();
    while (ld_volatile_u32(&s.failure->code) == kFailureNone && global_timer_ns() - start <= s.timeout_ns) {
    }
    return;
  }
  if (ld_volatile_u32(&s.failure->code) != kFailureNone) return;  // the watchdog's, meanwhile
  s.failure->op = failure_op(s);
  s.failure->rank = s.rank;
  s.failure->peer = peer;
  s.failure->block = block;
  s.failure->phase = phase;
  s.failure->signature = s.signature;
  s.failure->peer_signature = peer_signature;
  fence_acq_rel_sys();
  st_volatile_u32(&s.failure->code, code);
  fence_acq_rel_sys();  // publishes the record (to every host, and before the abort word below)
  if (code != kFailureAborted) {
    st_volatile_u32(s.abort, 1u);
    fence_acq_rel_sys();  // pushes the abort word out now: the other ranks' waits are polling it
  }
}

// The usual record: the block that failed is this one.
template <typename Sync>
__device__ __forceinline__ void record_failure(const Sync& s, uint32_t code, int peer, int phase,
                                               uint32_t peer_signature) {
  record_failure_at(s, code, peer, static_cast<int32_t>(blockIdx.x), phase, peer_signature);
}

// How long a wait runs before it reads the abort word at all (a quarter of the deadline when that
// is shorter): waiting for a skewed peer costs no PCIe read, a failure is seen this much later.
constexpr uint64_t kAbortQuietNs = 1000000;

// Whether this thread reads the abort word in round `round` of its wait (the round counts the
// wait's calls of keep_waiting: 0, 1, 2, ...): the threads of each aligned group of `turns` (a power
// of two) take turns, one a round. `turns` = the block size when every thread of the block waits
// (one PCIe read a block a round), 32 when a few do (a lone waiter reads every 32 rounds). A
// cheaper rule than electing a waiting lane (__activemask): that one spilled registers in the
// low-latency all-reduce.
__device__ __forceinline__ bool abort_turn(uint32_t round, uint32_t turns) {
  return ((round ^ threadIdx.x) & (turns - 1u)) == 0u;
}

// The slow half of every wait, once a round: false, after recording why, once a wait of this rank
// has failed (its claim word), the communicator is aborted (the abort word, read only in `my_turn`
// and past the quiet time) or the deadline (counted from `start`) has passed.
template <typename Sync>
__device__ __forceinline__ bool keep_waiting(const Sync& s, uint64_t start, int peer, int phase, bool my_turn) {
  const uint64_t waited = global_timer_ns() - start;
  const uint64_t quiet = s.timeout_ns / 4 < kAbortQuietNs ? s.timeout_ns / 4 : kAbortQuietNs;
  if (ld_volatile_u32(s.failure_claim) != 0u) {
    record_failure(s, kFailureAborted, peer, phase, 0);  // keeps the record of the wait that failed
    return false;
  }
  if (my_turn && waited > quiet && ld_volatile_u32(s.abort) != 0u) {
    record_failure(s, kFailureAborted, peer, phase, 0);
    // The rank's other waits leave on the claim word. The record may be the host's (a copy-engine
    // watchdog's, a refusal's), which claims nothing: claim it here, after the record exists.
    atomicExch(s.failure_claim, 1u);
    return false;
  }
  if (waited > s.timeout_ns) {
    record_failure(s, kFailureTimeout, peer, phase, 0);
    return false;
  }
  return true;
}

// keep_waiting for a wait of one thread or a few, or one that runs keep_waiting at no fixed rate:
// every call reads the abort word and the clock, nothing else (the fused GEMM's one waiting thread
// per CTA: the turns and the claim word cost its column-major kernels register spills).
template <typename Sync>
__device__ __forceinline__ bool keep_waiting(const Sync& s, uint64_t start, int peer, int phase) {
  if (ld_volatile_u32(s.abort) != 0u) {
    record_failure(s, kFailureAborted, peer, phase, 0);
    return false;
  }
  if (global_timer_ns() - start > s.timeout_ns) {
    record_failure(s, kFailureTimeout, peer, phase, 0);
    return false;
  }
  return true;
}

// ---- Signals ------------------------------------------------------------------------------------

// Sets a word of a peer's signal pad to `value`, after every write this thread observed.
__device__ __forceinline__ void signal(uint32_t* word_on_peer, uint32_t value) { st_release_sys(word_on_peer, value); }
// Adds `value` to a word of a peer's signal pad, after every write this thread observed.
__device__ __forceinline__ void signal_add(uint32_t* word_on_peer, uint32_t value) {
  red_add_release_sys(word_on_peer, value);
}

enum class Cmp {
  kEqual,     // word == value
  kAtLeast,   // word - value, as a signed 32-bit number, >= 0 (counters and epochs that wrap)
  kNotEqual,  // word != value
};

__device__ __forceinline__ bool compare(uint32_t word, uint32_t value, Cmp cmp) {
  switch (cmp) {
    case Cmp::kEqual: return word == value;
    case Cmp::kAtLeast: return static_cast<int32_t>(word - value) >= 0;
    default: return word != value;
  }
}

// One thread waits until `word` (this rank's memory, written by `peer`) compares true with
// `value`; then its later reads see what the peer wrote before signalling (acquire). `phase` is
// any number the kernel gives this wait, for the error message. False on timeout or abort.
__device__ __forceinline__ bool wait_signal(const UserSync& s, const uint32_t* word, uint32_t value, Cmp cmp, int peer,
                                            int phase) {
  const uint64_t start = global_timer_ns();
  for (uint32_t spins = 1;; ++spins) {
    if (compare(ld_acquire_sys(word), value, cmp)) return true;
    if ((spins & 255u) == 0u && !keep_waiting(s, start, peer, phase, abort_turn(spins >> 8, 32))) return false;
  }
}

// Block-wide (every thread calls it): waits until each of the `count` words from `words` on (this
// rank's memory, all written by `peer`: e.g. the piece flags of one shard) compares true with
// `value`; then the whole block sees what the peer wrote before signalling. False on timeout or
// abort (the same in every thread).
__device__ __forceinline__ bool wait_signals(const UserSync& s, const uint32_t* words, int count, uint32_t value,
                                             Cmp cmp, int peer, int phase) {
  bool mine = true;
  for (int i = threadIdx.x; i < count && mine; i += blockDim.x) mine = wait_signal(s, words + i, value, cmp, peer, phase);
  return __syncthreads_and(mine) != 0;
}

// Block-wide: copies `bytes` from `src` to `dst_on_peer` (a peer's heap memory) with every thread
// of the block, then sets `signal_on_peer` to `value` once all of it is visible to the peer.
__device__ __forceinline__ void put_signal(void* dst_on_peer, const void* src, size_t bytes, uint32_t* signal_on_peer,
                                           uint32_t value) {
  const bool vectors = ((reinterpret_cast<uintptr_t>(dst_on_peer) | reinterpret_cast<uintptr_t>(src)) & 15u) == 0;
  const size_t head = vectors ? bytes / 16 * 16 : 0;
  for (size_t i = threadIdx.x * size_t(16); i < head; i += blockDim.x * size_t(16))
    *reinterpret_cast<uint4*>(static_cast<char*>(dst_on_peer) + i) =
        *reinterpret_cast<const uint4*>(static_cast<const char*>(src) + i);
  for (size_t i = head + threadIdx.x; i < bytes; i += blockDim.x)
    static_cast<char*>(dst_on_peer)[i] = static_cast<const char*>(src)[i];
  __syncthreads();  // every thread's stores happen before thread 0's release (cumulative)
  if (threadIdx.x == 0) signal(signal_on_peer, value);
}

// ---- Epochs and the barrier ---------------------------------------------------------------------

// This block's number for the call (all threads must call it): one per block, kept on the device so
// that CUDA graph replays advance it. The block commits it with epoch_commit once it is done.
__device__ __forceinline__ uint32_t epoch_begin(const UserSync& s) {
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) epoch = s.epochs[blockIdx.x % kUserMaxBlocks] + 1;
  __syncthreads();
  return epoch;
}

__device__ __forceinline__ void epoch_commit(const UserSync& s, uint32_t epoch) {
  if (threadIdx.x == 0) s.epochs[blockIdx.x % kUserMaxBlocks] = epoch;
}

// Waits until the peer's barrier flag (64 bits: {epoch << 32 | signature}, stored by one
// single-copy-atomic release) carries epoch `epoch` or the next one (modulo 2^32).
//   Equal epoch: the flag is the peer's for this same barrier, so it must carry our signature;
//   another one means the peer called something else (mismatch: one compare after the flag came,
//   nothing in the loop).
//   Next epoch: the peer's block finished its call of `epoch`, which needed its first barrier to
//   pass on this rank's flag of exactly `epoch` (this rank has not passed: it stored no later one)
//   carrying the peer's own signature; so the calls matched, and the later flag's signature (of
//   the peer's next call) is not ours to check. This happens after a one-barrier kernel: the peer
//   leaves it on seeing this rank's flag and may store its next call's flag before this rank has
//   read the current one.
// False on timeout, mismatch or abort.
template <typename Sync>
__device__ __forceinline__ bool wait_barrier_flag(const Sync& s, const uint64_t* flag, uint32_t epoch, int peer,
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
      record_failure(s, kFailureMismatch, peer, phase, signature);
      return false;
    }
    if ((spins & 255u) == 0u && !keep_waiting(s, start, peer, phase, abort_turn(spins >> 8, 32))) return false;
  }
}

__device__ __forceinline__ size_t flag_slot(int phase, int block, int peer) {
  return (size_t(phase) * kUserMaxBlocks + block) * kMaxWorld + peer;
}

// Barrier among the same-index blocks of every rank (all threads call it; blockDim.x >= world).
// Block b of each rank tells block b of every peer that it reached `phase` (0 to kUserPhases - 1,
// each used once per call) of call `epoch`, then waits for the same from each of them. The block's
// writes before it are visible to the peers' block b after it. False if a wait failed.
__device__ __forceinline__ bool barrier(const UserSync& s, uint32_t epoch, int phase) {
  __shared__ int ok;
  if (threadIdx.x == 0) ok = blockIdx.x < kUserMaxBlocks && phase >= 0 && phase < kUserPhases;
  __syncthreads();
  if (!ok) return false;  // outside the flags (begin_user_call checked the grid it was given)
  const uint64_t flag = (uint64_t(epoch) << 32) | s.signature;
  const int peer = threadIdx.x;
  bool mine = true;
  if (peer < s.world && peer != s.rank) {
    st_release_sys_u64(s.peer_flags[peer] + flag_slot(phase, blockIdx.x, s.rank), flag);
    mine = wait_barrier_flag(s, s.flags + flag_slot(phase, blockIdx.x, peer), epoch, peer, phase);
  }
  return __syncthreads_and(mine) != 0;
}

}  // namespace symmem::dev
