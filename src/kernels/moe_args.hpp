// MoE dispatch / combine kernels (include/symmem/ep.hpp): their by-value arguments and the host
// functions that launch them. Plain C++.
//
// Dispatch, two kernels:
//   count (one block of kEpCountWarps warps): this rank's pairs counted per bin and per tile
//     (plan/ep_layout.hpp's slot formula), its header (per-expert counts, per-rank row counts,
//     token count, first bad expert id) exchanged with every rank as low-latency lines, so every
//     rank holds the whole count matrix; from it the same verdict on every rank (kStatusCapacity
//     when a receiver is full, a token count is too large or an id is out of range), this rank's
//     send bases, its received counts, and `go`. A rank's lines exist only once its stream reached
//     the dispatch, after the expert computation and combine of the previous step: the entry guard
//     of the push into its receive area.
//   push (max_blocks blocks): a warp per pair computes the pair's slot, stores the token's row
//     (and scales, and for kRankMajor its ids and weights) into the receiving rank's area, and
//     keeps the route for combine; one barrier at the end (every row arrived when it finishes).
// Combine, one kernel, plus a copy of the expert outputs into the combine area when they are
// elsewhere (an expert-major context may instead reduce on the experts' side:
// kernels/moe_combine_reduced.cu): each block exchanges one low-latency line with the same block
// of every peer (the entry barrier: every peer's expert outputs are written, and a peer in another
// call shows a foreign signature), then the block pulls the token's rows from the peers' combine areas (per token
// and 256 columns into registers, or per token and chunk into shared memory with bulk copies:
// moe_combine.cu), accumulates them in float32 in top-k (kRankMajor: rank) order, and writes the
// token's output row once, locally; an exit line per block, posted once its loads of the peers have
// returned and awaited from every peer at the block's end (the exit guard): when the kernel has
// finished on a rank, no peer reads its combine area any more, so the next combine's staging copy,
// or the caller's next expert outputs, may overwrite it at once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "device/device_types.hpp"
#include "plan/ep_layout.hpp"

namespace symmem::detail {

// Local device memory of a context (plan/ep_geometry.hpp's EpScratchOffsets).
struct EpScratch {
  int32_t* tile_base;
  int32_t* warp_base;
  int32_t* send_base;
  int32_t* route_rank;
  int32_t* route_row;
  float* weights;
  int32_t* expert_num_tokens;
  int32_t* num_rows;
  int32_t* num_tokens;
  uint32_t* go;
  uint32_t* counts;
};

// The context's symmetric buffers: this rank's and every rank's as mapped here.
struct EpBuffers {
  char* dispatch;
  char* dispatch_peers[kMaxWorld];
  char* combine;
  char* combine_peers[kMaxWorld];
};

struct MoeDispatchArgs {
  EpGeometry g;
  const void* x;
  const float* x_scales;
  const void* topk_idx;
  bool topk_idx_int64;
  const float* topk_weights;
  int num_tokens;                    // when num_tokens_device is null
  const int32_t* num_tokens_device;  // the count on the device, or null
  EpScratch scratch;
  EpBuffers buffers;
  LowLatencyLines lines;  // the count header travels as lines
  SyncArgs sync;
};

struct MoeCombineArgs {
  EpGeometry g;
  EpScratch scratch;
  EpBuffers buffers;
  void* out;
  const float* weights;  // kExpertMajor: null -> the dispatch's (scratch.weights)
  bool weights_applied;
  LowLatencyLines lines;  // one line per block: the entry barrier
  SyncArgs sync;
};

// Copies the valid rows of expert outputs laid out like the combine area into it (local).
struct MoeStageArgs {
  EpGeometry g;
  EpScratch scratch;
  const void* expert_out;
  char* combine;
};

void launch_moe_dispatch_count(const MoeDispatchArgs& args, cudaStream_t stream);
void launch_moe_dispatch_push(const MoeDispatchArgs& args, int blocks, cudaStream_t stream);
void launch_moe_combine_stage(const MoeStageArgs& args, int blocks, cudaStream_t stream);
// bulk: the shared-memory pull (plan/moe_combine_path.hpp), else the register pull.
void launch_moe_combine(const MoeCombineArgs& args, int blocks, bool bulk, cudaStream_t stream);
// kExpertMajor reduced on the experts' side (g.combine_reduced): kernels/moe_combine_reduced.cu.
void launch_moe_combine_reduced(const MoeCombineArgs& args, int blocks, cudaStream_t stream);

}  // namespace symmem::detail
