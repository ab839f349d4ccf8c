// The by-value argument structs of every SM kernel, and the host functions that launch them.
// Plain C++: collectives fill these; the .cu files hold the kernels and nothing else.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "device/device_types.hpp"
#include "symmem/types.hpp"

namespace symmem::detail {

constexpr int kThreadsPerBlock = 512;

struct AllGatherKernelArgs {
  const void* in_peers[kMaxWorld];  // pull: every rank's input as mapped here
  void* out_peers[kMaxWorld];       // push: every rank's output base as mapped here
  const void* in;                   // this rank's input
  void* out;                        // this rank's output base (rank r's slot at r * slot_stride)
  size_t bytes;                     // per rank
  size_t slot_stride;               // bytes from rank r's slot to rank r+1's in out and out_peers
                                    // (== bytes, except when a staged call runs in chunks)
  bool copy_own;                    // out-of-place: this rank's own slot is written too
  int local_warps;                  // pull with copy_own: warps of each block that copy the own slot
  uint64_t* ll_peers[kMaxWorld];    // low latency: every rank's receive area
  size_t ll_slot_words;             // low latency: capacity of one sender's slot, in 4-byte words
  SyncArgs sync;
};

enum class AllGatherKernel { kPull, kPush };

// vector_bytes: 16, 8, 4, 2 or 1; it divides bytes and every pointer's address.
void launch_all_gather(AllGatherKernel kernel, int vector_bytes, const AllGatherKernelArgs& args, int blocks,
                       cudaStream_t stream);
// Push with Hopper bulk copies (sm_90): 16-byte aligned pointers and bytes.
void launch_all_gather_push_bulk(const AllGatherKernelArgs& args, int blocks, cudaStream_t stream);
// Low latency (device/low_latency.cuh): bytes <= 4 * ll_slot_words; any alignment.
void launch_all_gather_low_latency(const AllGatherKernelArgs& args, int blocks, cudaStream_t stream);

struct ReduceKernelArgs {
  const void* in_peers[kMaxWorld];  // every rank's input as mapped here (index = rank)
  void* out;                        // this rank's output
  void* out_peers[kMaxWorld];       // two-shot with results_to_peers: every rank's output
  bool results_to_peers;            // two-shot: store each reduced slice into every rank's output
                                    // (symmetric output), else into scratch for the ranks to gather
  void* scratch_peers[kMaxWorld];   // two-shot gather: every rank's result area
  uint64_t* ll_peers[kMaxWorld];    // low latency: every rank's receive area
  void* receive_peers[kMaxWorld];   // one-shot push: every rank's receive area (two parity halves)
  size_t count;                     // all-reduce: elements; reduce-scatter: elements per rank
  size_t peer_stride;               // elements between ranks' chunks of an input (all-reduce: 0,
                                    // reduce-scatter: count); rank r reduces from r * peer_stride
  size_t ll_slot_words;             // low latency: capacity of one sender's slot, in 4-byte words
  size_t receive_half;              // one-shot push: elements in each parity half of a receive area
  size_t receive_slot;              // one-shot push: elements of one sender's slot (16-byte multiple)
  SyncArgs sync;
};

// kOneShotPush serves all-reduce one_shot_push and reduce-scatter two_shot_push (its first half).
enum class AllReduceKernel { kOneShot, kOneShotPush, kTwoShot, kTwoShotPush };

// vector: every input/output address (and every reduce-scatter slice) is 16-byte aligned.
void launch_all_reduce(AllReduceKernel kernel, DataType type, ReduceOp op, bool vector, const ReduceKernelArgs& args,
                       int blocks, cudaStream_t stream);
// Needs a 4-byte aligned input; one-shot: count * size <= 4 * ll_slot_words; two-shot: each
// slice's bytes <= 2 * ll_slot_words (half a slot).
void launch_all_reduce_low_latency(bool two_shot, DataType type, ReduceOp op, const ReduceKernelArgs& args, int blocks,
                                   cudaStream_t stream);
// Low-latency reduce-scatter: count * size <= 4 * ll_slot_words; input slices at any alignment,
// output aligned to its element size.
void launch_reduce_scatter_low_latency(DataType type, ReduceOp op, const ReduceKernelArgs& args, int blocks,
                                       cudaStream_t stream);

// A device barrier among all ranks (one block); used by Communicator::barrier.
void launch_barrier(const SyncArgs& sync, cudaStream_t stream);

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

// Two-shot slicing: rank r reduces elements [r * slice, min((r + 1) * slice, count)); slices are
// whole 16-byte vectors so that every slice start stays aligned.
SYMMEM_HOST_DEVICE inline size_t two_shot_slice(size_t count, int world, size_t elem_bytes) {
  const size_t elems_per_vector = 16 / elem_bytes;
  const size_t vectors = (count + elems_per_vector - 1) / elems_per_vector;
  return (vectors + world - 1) / world * elems_per_vector;
}

}  // namespace symmem::detail
