// The device memory the collectives use for themselves: one area per purpose, each with the rule
// that makes its reuse safe written beside it. Every area is a heap buffer allocated once, when the
// communicator is created, from a fixed budget (CommConfig::workspace_bytes), and released only
// when the communicator closes: a captured CUDA graph can never reference freed or reassigned
// memory, and no ordinary call grows anything (no hidden device synchronisation or collective).
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

#include "device/device_types.hpp"
#include "plan/plan.hpp"
#include "symmem/communicator.hpp"

namespace symmem::detail {

class Workspaces {
 public:
  // Collective (allocates heap buffers). `budget` is split evenly over the four sized areas.
  Workspaces(Communicator& comm, size_t budget);
  // The buffers belong to the communicator (released by close()); nothing to do here.

  // Barrier flags and nothing else (64-bit flags, device_types.hpp), zeroed once. Fixed size.
  Buffer* control() const { return control_; }
  // all_gather_matmul's piece flags live in the control buffer's signal pad (kSignalFlagCount
  // 32-bit words per rank, zeroed at allocation, unused otherwise). Only this rank's streams
  // write them: set after each piece's copy, reset to 0 on the caller's stream after the copies
  // joined it, before anything of the next call (src/fused/all_gather_matmul.cpp). After them,
  // matmul_reduce_scatter's tile counters: incremented by this rank's GEMM, waited on by its copy
  // streams, reset on its caller's stream after they joined (src/fused/matmul_reduce_scatter.cpp).
  Buffer* gather_flags() const { return control_; }

  // Local operands that peers must read (pull all-gather, copy-engine pull, one-/two-shot
  // reductions): this rank copies them in before the kernel; peers read between barriers.
  Buffer* staging_in() const { return staging_in_; }
  // Local outputs that peers write (push all-gather) and two-shot results that peers gather:
  // between barriers; this rank copies out after the last barrier, before its next call.
  Buffer* staging_out() const { return staging_out_; }
  // Two-shot push: every rank stores slice p of its input into rank p's slot *before* the first
  // barrier. Only two_shot_push uses it: a peer stores the next call's slices only after passing
  // this call's last barrier, which this rank reaches only after it reduced what it received.
  Buffer* push_slots() const { return push_slots_; }
  // One-shot push all-reduce and push reduce-scatter: peers store *before* the only barrier, into
  // the half of this call's parity (the communicator's call counter); a peer stores into the same
  // half again only two parity calls later, after this rank finished reading it (all_reduce.cu).
  Buffer* receive_area() const { return receive_area_; }
  // Low-latency protocol: lines {signature, data} stored before any barrier into parity halves;
  // the receiver clears each line it consumed (device/low_latency.cuh; the low-latency all-reduce,
  // all-gather and reduce-scatter share it). Fixed size.
  Buffer* low_latency() const { return low_latency_; }
  // The same area as the low-latency kernels address it.
  LowLatencyLines low_latency_lines() const;

  size_t staging_capacity() const { return area_bytes_; }  // each of staging_in / staging_out / push_slots
  size_t receive_half_bytes() const { return area_bytes_ / 2; }
  // What bounds one chunk of a call (plan_chunks).
  WorkspaceLimits limits() const { return {staging_capacity(), receive_half_bytes()}; }
  // True for the buffers above (the communicator's own; a caller may not free them).
  bool owns(const Buffer* buffer) const;

  // Bytes of each sender's low-latency slot (the largest low-latency message).
  static constexpr size_t kLowLatencySlotBytes = size_t(1) << 20;
  // The smallest budget accepted: every area must hold at least a few vectors per rank.
  static constexpr size_t kMinBudget = size_t(4) << 20;

 private:
  int world_ = 1;
  size_t area_bytes_ = 0;
  Buffer* control_ = nullptr;
  Buffer* staging_in_ = nullptr;
  Buffer* staging_out_ = nullptr;
  Buffer* push_slots_ = nullptr;
  Buffer* receive_area_ = nullptr;
  Buffer* low_latency_ = nullptr;
};

}  // namespace symmem::detail
