// The all-to-all's kernel family (plan/algorithms.hpp: all_to_all_pull, all_to_all_push,
// all_to_all_low_latency): their by-value arguments and the host functions that launch them.
// Plain C++.
//
// The variable forms (all_to_all_v, all_to_all_vdev, all_to_all_vdev_2d) run one kernel
// (kernels/all_to_all_variable.cu), push or pull, of the plan's blocks:
//   send: block 0 stores this rank's header (its splits, its input rows, its output capacity, and
//     for all_to_all_v the rows it expects from each sender) as low-latency lines
//     (device/low_latency.cuh) into every peer's area (a rank keeps its own header from its
//     arguments); every block stores, behind it, the rows of
//     each pair that goes by lines (plan/all_to_all_layout.hpp's pair_by_lines: small pairs,
//     decided by the sender alone).
//   exchange: every block reads every peer's header (none clears it: the last block to have read
//     them does), so every block of every rank holds the whole split matrix and computes from it the
//     same verdict (layout_fault), the same choice of lines or SM per pair, and its rank's pieces.
//     A rank's header exists only once its stream reached the call, after everything before it:
//     the entry guard of the data movement.
//   move: nothing when the verdict failed (on every rank alike; lines are still taken and
//     dropped); else the rows that came as lines into the output, and the SM pieces, cut into
//     equal spans of vectors, one per block (plan/all_to_all_cut.hpp); then one barrier when any
//     rows crossed between ranks by SM.
// The uniform all-to-all runs kernels/all_to_all_move.cu, its pieces from the arguments: push and
// pull with a barrier before the copies (nothing else guards the peers' buffers), low latency by
// lines.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "device/device_types.hpp"
#include "plan/all_to_all_layout.hpp"

namespace symmem::detail {

// all_to_all_v, all_to_all_vdev(_2d): all_to_all_pull and all_to_all_push of the variable forms.
struct AllToAllVariableArgs {
  const int64_t* in_splits;            // device, world * experts values; null: host_in_splits
  int64_t host_in_splits[kMaxWorld];   // all_to_all_v: this rank's splits
  int64_t host_out_splits[kMaxWorld];  // all_to_all_v: the rows this rank expects from each sender
  bool declared;                       // all_to_all_v: check host_out_splits against the senders
  int experts;
  int64_t align;
  uint64_t input_rows;   // rows this rank's input holds
  uint64_t output_rows;  // rows this rank's output holds
  uint64_t row_bytes;
  uint64_t low_latency_pair_bytes;  // the plan's threshold per pair (0: every pair by SM)
  int64_t* out_splits_offsets;      // device, 2 x pieces (torch's layout), or null
  const void* in;                   // this rank's input (or its staged copy)
  void* out;                        // this rank's output
  const void* in_peers[kMaxWorld];  // pull: every rank's input (or staged copy) as mapped here
  void* out_peers[kMaxWorld];       // push: every rank's output as mapped here
  LowLatencyLines lines;            // headers, and the rows of the pairs that go by lines
  SyncArgs sync;
};

// all_to_all_pull, all_to_all_push, all_to_all_low_latency of the uniform form.
struct AllToAllMoveArgs {
  const void* in;                   // this rank's input (or its staged copy)
  void* out;                        // this rank's output
  const void* in_peers[kMaxWorld];  // pull: every rank's input (or staged copy) as mapped here
  void* out_peers[kMaxWorld];       // push: every rank's output as mapped here
  // Uniform: rank r's slice for rank q lies at in + q * in_stride (pair_bytes long) and lands at
  // rank q's out + r * out_stride.
  uint64_t pair_bytes;
  uint64_t in_stride;
  uint64_t out_stride;
  LowLatencyLines lines;  // low latency
  SyncArgs sync;
};

// Dynamic shared memory of the variable forms' kernel for `destinations` = world x experts: the
// per-destination prefix sums and expert starts (8 bytes each), the split matrix (4 bytes per
// sender and destination) and each piece's first input and output row (4 bytes each).
SYMMEM_HOST_DEVICE constexpr size_t all_to_all_variable_shared_bytes(int world, int destinations) {
  return 8 * size_t(destinations + 1) + 8 * size_t(destinations) + 4 * size_t(world) * destinations +
         8 * size_t(destinations);
}

// Uniform. vector_bytes: 16, 8, 4, 2 or 1, dividing every piece's offsets and sizes and every base address.
void launch_all_to_all_pull(int vector_bytes, const AllToAllMoveArgs& args, int blocks, cudaStream_t stream);
void launch_all_to_all_push(int vector_bytes, const AllToAllMoveArgs& args, int blocks, cudaStream_t stream);
// Any alignment.
void launch_all_to_all_low_latency(const AllToAllMoveArgs& args, int blocks, cudaStream_t stream);

// The variable forms; vector_bytes as above (the lines take any alignment).
void launch_all_to_all_variable_pull(int vector_bytes, const AllToAllVariableArgs& args, int blocks,
                                     cudaStream_t stream);
void launch_all_to_all_variable_push(int vector_bytes, const AllToAllVariableArgs& args, int blocks,
                                     cudaStream_t stream);

}  // namespace symmem::detail
