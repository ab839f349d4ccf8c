// Block-count rules every planner shares (all-gather, reductions, all-to-all, MoE). Pure C++.
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

}  // namespace symmem::detail
