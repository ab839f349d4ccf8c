// The all-to-all's kernel family (plan/algorithms.hpp: all_to_all_pull, all_to_all_push,
// all_to_all_low_latency, and the split exchange before the first two in the variable forms): their
// by-value arguments, the per-communicator device table the split exchange fills for the move
// kernels, and the host functions that launch them. Plain C++.
//
// Two kernels per call of the variable forms (all_to_all_v, all_to_all_vdev):
//   exchange (one block): every rank stores its header (its splits, its input rows, its output
//     capacity, and for all_to_all_v its expected output splits) as low-latency lines into every
//     peer's low-latency area (device/low_latency.cuh) and collects every peer's, so every rank
//     holds the whole split matrix. From it each rank computes the same verdict
//     (plan/all_to_all_layout.hpp's layout_fault) and, when the call fits, its pieces (what it
//     sends where, what it receives from where), torch's out_splits_offsets, and whether the
//     data goes through low-latency lines. A rank's lines of call n exist only once its stream
//     reached call n, after everything before it: they are the entry guard of the move kernel.
//   move (the plan's kernel and blocks): nothing when the verdict failed (on every rank alike);
//     else the rows through low-latency lines (when the exchange found every pair small), or by
//     SM push (into the peers' outputs) or pull (from the peers' inputs), then one barrier.
// The uniform all-to-all runs the move kernel alone, its pieces from the arguments: push and pull
// with a barrier before the copies (nothing else guards the peers' buffers), low latency by lines.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "device/device_types.hpp"
#include "plan/all_to_all_layout.hpp"

namespace symmem::detail {

// Written by the exchange kernel, read by the move kernel of the same call (stream order). One per
// communicator, in local device memory allocated at creation (a graph may reference it).
struct AllToAllTable {
  uint32_t go;           // 1: the call fits; 0 until the exchange decided (and after a failure)
  uint32_t low_latency;  // 1: the move kernel takes the low-latency path
  uint32_t pieces;       // destinations: world * experts (as many pieces sent as received)
  uint32_t reserved;
  AllToAllPiece send[kMaxAllToAllSplits];     // piece j: to destination j = q * experts + e
  AllToAllPiece receive[kMaxAllToAllSplits];  // piece e * world + s: from sender s for expert e
  // The exchange kernel's own scratch: the matrix every rank received, and its prefix sums.
  uint32_t matrix[kMaxWorld * kMaxAllToAllSplits];  // [s * pieces + j]
  uint32_t input_rows[kMaxWorld];
  uint32_t output_rows[kMaxWorld];
  uint32_t declared[kMaxWorld * kMaxWorld];               // all_to_all_v: [q * world + s]
  uint64_t input_prefix[kMaxWorld * kMaxAllToAllSplits];  // input_row(s, j)
};

struct AllToAllExchangeArgs {
  const int64_t* in_splits;            // device, world * experts values; null: host_in_splits
  int64_t host_in_splits[kMaxWorld];   // all_to_all_v: this rank's splits
  int64_t host_out_splits[kMaxWorld];  // all_to_all_v: the rows this rank expects from each sender
  bool declared;                       // all_to_all_v: check host_out_splits against the senders
  int experts;
  int64_t align;
  uint64_t input_rows;   // rows this rank's input holds
  uint64_t output_rows;  // rows this rank's output holds
  uint64_t row_bytes;
  uint64_t low_latency_pair_bytes;  // the plan's threshold (0: never low latency)
  int64_t* out_splits_offsets;      // device, 2 x pieces (torch's layout), or null
  LowLatencyLines lines;            // the header travels as lines
  AllToAllTable* table;
  SyncArgs sync;
};

// all_to_all_pull, all_to_all_push, all_to_all_low_latency.
struct AllToAllMoveArgs {
  const AllToAllTable* table;       // variable forms; null: uniform, pieces from the fields below
  const void* in;                   // this rank's input (or its staged copy)
  void* out;                        // this rank's output
  const void* in_peers[kMaxWorld];  // pull: every rank's input (or staged copy) as mapped here
  void* out_peers[kMaxWorld];       // push: every rank's output as mapped here
  // Uniform: rank r's slice for rank q lies at in + q * in_stride (pair_bytes long) and lands at
  // rank q's out + r * out_stride.
  uint64_t pair_bytes;
  uint64_t in_stride;
  uint64_t out_stride;
  LowLatencyLines lines;  // low latency (uniform), or the variable forms when the table says so
  SyncArgs sync;
};

void launch_all_to_all_split_exchange(const AllToAllExchangeArgs& args, cudaStream_t stream);
// vector_bytes: 16, 8, 4, 2 or 1, dividing every piece's offsets and sizes and every base address.
void launch_all_to_all_pull(int vector_bytes, const AllToAllMoveArgs& args, int blocks, cudaStream_t stream);
void launch_all_to_all_push(int vector_bytes, const AllToAllMoveArgs& args, int blocks, cudaStream_t stream);
// Uniform only; any alignment.
void launch_all_to_all_low_latency(const AllToAllMoveArgs& args, int blocks, cudaStream_t stream);

}  // namespace symmem::detail
