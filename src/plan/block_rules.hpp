// Block-count and low-latency rules every planner shares (all-gather, reductions, all-to-all, MoE).
// Pure C++.
#pragma once

#include <algorithm>
#include <cstddef>

#include "device/device_types.hpp"

namespace symmem::detail {

// `blocks` within [1, min(kMaxBlocks, sm_count, max_blocks if > 0)].
inline int clamp_blocks(int blocks, int sm_count, int max_blocks) {
  int limit = std::min(kMaxBlocks, sm_count);
  if (max_blocks > 0) limit = std::min(limit, max_blocks);
  return std::max(1, std::min(blocks, limit));
}

// Blocks that keep each one busy with at least `bytes_per_block` of traffic, within [lo, hi].
inline int blocks_for(size_t traffic_bytes, size_t bytes_per_block, int lo, int hi) {
  const size_t want = (traffic_bytes + bytes_per_block - 1) / bytes_per_block;
  return static_cast<int>(std::clamp<size_t>(want, lo, hi));
}

// The uniform SM all-to-all: a block per 64 KiB unit of what a rank moves, its own slice included
// (kernels/all_to_all_move.cu cuts every slice into units of kUnroll x 512 vectors: a block beyond
// the units would idle), 8 to 128. On 2 x H200 (bench/results/h200x2/all_to_all_blocks_2.csv,
// push, 1 MiB per rank: 9.5 us on 16 blocks, 13.7 on 4; 64 blocks at 4 MiB, 128 from 8 MiB);
// past two ranks not measured.
inline int uniform_all_to_all_blocks(size_t bytes_moved) { return blocks_for(bytes_moved, size_t(64) << 10, 8, 128); }

// Low latency is latency-bound: each thread waits for its words in turn, so every 4-byte word gets
// its own thread, within 4 to 128 blocks, as the H200 sweeps favour.
inline int low_latency_blocks(size_t words) { return blocks_for(words, kThreadsPerBlock, 4, 128); }

// Low latency gives every word its own thread: an SM budget below that slows it in proportion
// (2 x H200, 256 KiB per rank: 42 us on 4 blocks, 5.7 on 128), so a chosen (not asked-for) low
// latency yields to the SM algorithms when the budget binds.
inline bool low_latency_budget_binds(int max_blocks, int blocks, size_t words) {
  return max_blocks > 0 && max_blocks < (blocks > 0 ? blocks : low_latency_blocks(words));
}

// Built-in rule for the low-latency all-gather, reduce-scatter and all-to-all, for GPUs without a
// table row: while what each rank stores to its peers, (world - 1) x bytes per peer, stays within
// 256 KiB. On 2 x H200 it won from 1 to 256 KiB per rank, eager and replayed, against every SM
// algorithm and NCCL (bench/results/h200x2/all_gather_2.csv); past two ranks the bound is scaled, not
// measured.
constexpr size_t kLowLatencyAutoPeerBytes = size_t(256) << 10;
inline bool low_latency_by_rule(size_t bytes_per_peer, int world, bool fits) {
  return fits && bytes_per_peer * static_cast<size_t>(std::max(1, world - 1)) <= kLowLatencyAutoPeerBytes;
}
// The largest bytes per pair of ranks the rule takes low latency for.
inline size_t low_latency_rule_pair_bytes(int world) {
  return kLowLatencyAutoPeerBytes / static_cast<size_t>(std::max(1, world - 1));
}

}  // namespace symmem::detail
