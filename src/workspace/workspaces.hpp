// The device memory the collectives use for themselves: one area per purpose, each with the rule
// that makes its reuse safe written beside it. Every area is a range of the symmetric heap
// (heap/heap_area.hpp) allocated once, straight from the heap while the communicator is created,
// from a fixed budget (CommConfig::workspace_bytes), and released only when the heap is: a
// captured CUDA graph can never reference freed or reassigned memory, and no ordinary call grows
// anything (no hidden device synchronisation or collective).
//
// Two kinds of access decide the rules:
//   between barriers: peers read or write the area only after the call's first barrier and before
//     its last one. Any later call may reuse it: this rank finished the previous kernel only after
//     every block of every peer reached its last barrier, i.e. after their last access; and a peer
//     touches it in the next call only after that call's first barrier, which this rank reaches
//     only after its own local work of the previous call (stream order).
//   before the first barrier: peers store into the area as soon as their kernel starts. Only one
//     algorithm family may use such an area, with its own proof that the owner finished reading.
#pragma once

#include <cstddef>

#include "bootstrap/fd_exchange.hpp"
#include "device/device_types.hpp"
#include "heap/heap_area.hpp"
#include "plan/plan.hpp"
#include "symmem/bootstrap.hpp"

namespace symmem::detail {

class Workspaces {
 public:
  // Collective over the node's ranks (allocates from the heap, whose ranges are zeroed). `budget`,
  // equal on every rank, is split evenly over the four sized areas.
  Workspaces(Heap& heap, Bootstrap& bootstrap, FdExchange& exchange, int rank, int world, size_t budget);
  // The areas live as long as the heap (they are never released on their own).

  // Barrier flags (64-bit, device_types.hpp: kSignalFlagCount per rank), zeroed once. Fixed size.
  const HeapArea* control() const { return &control_; }
  // The fused ops' flags (kFusedFlagWords 32-bit words, zeroed once, after the barrier flags):
  // all_gather_matmul's piece flags, then matmul_reduce_scatter's tile counters. Only this rank's
  // streams touch them: set after each piece's copy (incremented by this rank's GEMM), waited on
  // by its streams, reset to 0 on the caller's stream after the copies joined it, before anything
  // of the next call (src/fused/all_gather_matmul.cpp, src/fused/matmul_reduce_scatter.cpp).
  uint32_t* fused_flags() const;
  static constexpr size_t kFusedFlagWords = 1024;
  // The user-call area (user_call_area.hpp: users' barrier flags and epochs), in the control
  // area's heap range after the fused ops' flags. No library kernel touches it, and users' kernels
  // touch nothing else of the control area. Fixed size.
  const HeapArea* user_calls() const { return &user_calls_; }

  // Local operands that peers must read (pull all-gather, copy-engine pull, one-/two-shot
  // reductions): this rank copies them in before the kernel; peers read between barriers.
  const HeapArea* staging_in() const { return &staging_in_; }
  // Local outputs that peers write (push all-gather) and two-shot results that peers gather:
  // between barriers; this rank copies out after the last barrier, before its next call. The
  // pipelined reductions' result slots too: a peer stores into them only after this rank's signal
  // of the same call (kernels/reduce_pipelined.cu).
  const HeapArea* staging_out() const { return &staging_out_; }
  // Two-shot push: every rank stores slice p of its input into rank p's slot *before* the first
  // barrier. Only two_shot_push and the pipelined reductions (their send slots) use it: a peer
  // stores the next call's slices only after its kernel ended, so after this call's last barrier
  // or signal of each block, which this rank reaches only after it reduced what it received.
  const HeapArea* push_slots() const { return &push_slots_; }
  // One-shot push all-reduce and push reduce-scatter: peers store *before* the only barrier, into
  // the half of this call's parity (the communicator's call counter); a peer stores into the same
  // half again only two parity calls later, after this rank finished reading it (all_reduce.cu).
  const HeapArea* receive_area() const { return &receive_area_; }
  // Low-latency protocol: lines {signature, data} stored before any barrier into parity halves;
  // the receiver clears each line it consumed (device/low_latency.cuh; the low-latency all-reduce,
  // all-gather and reduce-scatter share it). Fixed size.
  const HeapArea* low_latency() const { return &low_latency_; }
  // The same area as the low-latency kernels address it.
  LowLatencyLines low_latency_lines() const;

  size_t staging_capacity() const { return area_bytes_; }  // each of staging_in / staging_out / push_slots
  size_t receive_half_bytes() const { return area_bytes_ / 2; }
  // What bounds one chunk of a call (plan_chunks).
  WorkspaceLimits limits() const { return {staging_capacity(), receive_half_bytes()}; }

  // Bytes of each sender's low-latency slot (the largest low-latency message).
  static constexpr size_t kLowLatencySlotBytes = size_t(1) << 20;
  // The smallest budget accepted: every area must hold at least a few vectors per rank.
  static constexpr size_t kMinBudget = size_t(4) << 20;

 private:
  int world_ = 1;
  size_t area_bytes_ = 0;
  HeapArea control_;
  HeapArea user_calls_;
  HeapArea staging_in_;
  HeapArea staging_out_;
  HeapArea push_slots_;
  HeapArea receive_area_;
  HeapArea low_latency_;
};

}  // namespace symmem::detail
