// The by-value argument struct of each kernel family, and the host function that launches each
// kernel (one per plan/algorithms.hpp KernelId, named alike). Plain C++: collectives fill these;
// the .cu files hold the kernels and nothing else. Every field has one meaning.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "device/device_types.hpp"
#include "symmem/types.hpp"

namespace symmem::detail {

// ---- All-gather: rank r's slot of an output starts at r * slot_stride; `bytes` fill one slot.

// all_gather_pull, all_gather_push, all_gather_push_bulk.
struct AllGatherArgs {
  const void* in_peers[kMaxWorld];  // pull: every rank's input as mapped here
  void* out_peers[kMaxWorld];       // push: every rank's output base as mapped here
  const void* in;                   // this rank's input
  void* out;                        // this rank's output base
  size_t bytes;                     // per rank
  size_t slot_stride;               // == bytes, except when a staged call runs in chunks
  bool copy_own;                    // out of place: this rank's own slot is written too
  int local_warps;                  // pull with copy_own: warps of each block that copy the own slot
  SyncArgs sync;
};

// all_gather_low_latency: any alignment; bytes <= 4 * lines.slot_words.
struct LowLatencyGatherArgs {
  const void* in;
  void* out;
  size_t bytes;
  size_t slot_stride;
  bool copy_own;
  LowLatencyLines lines;
  SyncArgs sync;
};

// vector_bytes: 16, 8, 4, 2 or 1; it divides bytes, slot_stride and every address.
void launch_all_gather_pull(int vector_bytes, const AllGatherArgs& args, int blocks, cudaStream_t stream);
void launch_all_gather_push(int vector_bytes, const AllGatherArgs& args, int blocks, cudaStream_t stream);
// Hopper bulk copies (sm_90): 16-byte aligned addresses, bytes and slot_stride.
void launch_all_gather_push_bulk(const AllGatherArgs& args, int blocks, cudaStream_t stream);
void launch_all_gather_low_latency(const LowLatencyGatherArgs& args, int blocks, cudaStream_t stream);

// ---- Reductions. `count`: all-reduce, elements; reduce-scatter, elements per rank. Rank r's
// range of an input starts `peer_stride` elements after rank r - 1's (all-reduce: 0, every rank
// reduces the whole input; reduce-scatter: the slice count, or the staged chunk's).
// vector: every address (and every reduce-scatter range) is 16-byte aligned.

// reduce_from_every_rank: one-shot all-reduce, pull reduce-scatter.
struct ReduceFromEveryRankArgs {
  const void* in_peers[kMaxWorld];  // every rank's input as mapped here
  void* out;
  size_t count;
  size_t peer_stride;
  SyncArgs sync;
};

// reduce_pushed: one-shot push all-reduce, push reduce-scatter. Rank p's receive area holds two
// parity halves of `receive_half` elements, a slot of `receive_slot` elements per sender in each.
struct ReducePushedArgs {
  const void* in;  // this rank's input
  void* out;
  size_t count;
  size_t peer_stride;
  void* receive_peers[kMaxWorld];  // every rank's receive area
  size_t receive_half;
  size_t receive_slot;  // a 16-byte multiple
  SyncArgs sync;
};

// all_reduce_two_shot: slice r of every input is reduced by rank r, then stored into every rank's
// output (a symmetric output) or into rank r's gather area, which every rank then reads.
struct AllReduceTwoShotArgs {
  const void* in_peers[kMaxWorld];
  void* out;
  size_t count;
  bool results_to_peers;          // store the reduced slice into out_peers, else gather_peers
  void* out_peers[kMaxWorld];     // every rank's output (results_to_peers)
  void* gather_peers[kMaxWorld];  // every rank's gather area (staging_out), as mapped here
  SyncArgs sync;
};

// all_reduce_two_shot_push: slice p of this rank's input is stored into rank p's push slots
// (slot `rank`), and every reduced slice into every rank's output.
struct AllReduceTwoShotPushArgs {
  const void* in;
  size_t count;
  void* out_peers[kMaxWorld];   // every rank's output (symmetric)
  void* slot_peers[kMaxWorld];  // every rank's push slots, world slices each
  SyncArgs sync;
};

// reduce_pipelined (kernels/reduce_pipelined.cu): rank o's slice of this rank's input goes to
// rank o in pieces of `piece` elements through the send slots; the reduced pieces of an
// all-reduce come back through the result slots. Each of the four slot areas holds, per rank,
// [block][sender] slots of `piece` elements, a whole number of 16-byte vectors.
struct ReducePipelinedArgs {
  const void* in;  // this rank's input (reduce-scatter: world slices of count elements)
  void* out;
  size_t count;  // all-reduce: elements; reduce-scatter: per rank
  bool gather;   // all-reduce (reduced pieces to every rank); else reduce-scatter
  size_t piece;
  void* send_slots[2][kMaxWorld];    // by parity, every rank's: push_slots, receive area
  void* result_slots[2][kMaxWorld];  // by parity, every rank's: staging_out, staging_in
  SyncArgs sync;
};

// The low-latency reductions: a 4-byte aligned input for the all-reduces (the reduce-scatter reads
// slices at any alignment). one-shot: count * size <= 4 * slot_words; two-shot: each slice's bytes
// <= 2 * slot_words; reduce-scatter: count * size <= 4 * slot_words.
struct LowLatencyReduceArgs {
  const void* in;
  void* out;
  size_t count;
  size_t peer_stride;  // reduce-scatter only
  LowLatencyLines lines;
  SyncArgs sync;
};

void launch_reduce_from_every_rank(DataType type, ReduceOp op, bool vector, const ReduceFromEveryRankArgs& args,
                                   int blocks, cudaStream_t stream);
void launch_reduce_pushed(DataType type, ReduceOp op, bool vector, const ReducePushedArgs& args, int blocks,
                          cudaStream_t stream);
void launch_all_reduce_two_shot(DataType type, ReduceOp op, bool vector, const AllReduceTwoShotArgs& args, int blocks,
                                cudaStream_t stream);
void launch_all_reduce_two_shot_push(DataType type, ReduceOp op, bool vector, const AllReduceTwoShotPushArgs& args,
                                     int blocks, cudaStream_t stream);
void launch_reduce_pipelined(DataType type, ReduceOp op, bool vector, const ReducePipelinedArgs& args, int blocks,
                             cudaStream_t stream);
void launch_all_reduce_low_latency(DataType type, ReduceOp op, const LowLatencyReduceArgs& args, int blocks,
                                   cudaStream_t stream);
void launch_all_reduce_low_latency_two_shot(DataType type, ReduceOp op, const LowLatencyReduceArgs& args, int blocks,
                                            cudaStream_t stream);
void launch_reduce_scatter_low_latency(DataType type, ReduceOp op, const LowLatencyReduceArgs& args, int blocks,
                                       cudaStream_t stream);

// ---- Others.

// A device barrier among all ranks (one block); used by Communicator::barrier.
void launch_barrier(const SyncArgs& sync, cudaStream_t stream);

// A call this rank refused (comm/refusal.hpp), in stream order: records kStatusRefused with
// `error_code` (a symmem::ErrorCode) in this rank's failure record and sets the abort word. One
// thread; sync.op and sync.signature go into the record.
void launch_refusal(const SyncArgs& sync, int32_t error_code, cudaStream_t stream);

// matmul_reduce_scatter's last step, local: out[i] = sources[0][i] + ... + sources[world-1][i] in
// float32, added in rank order (so the result does not depend on which rank computes it), rounded
// once to `type` (float16 or bfloat16). count is a multiple of 8; every pointer 16-byte aligned.
struct PartialSumsArgs {
  const float* sources[kMaxWorld];
  void* out;
  size_t count;
  int world;
};
void launch_partial_sums(DataType type, const PartialSumsArgs& args, int sm_count, cudaStream_t stream);

}  // namespace symmem::detail
