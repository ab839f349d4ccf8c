// A context's geometry (plan/ep_layout.hpp's EpGeometry) from its config, and its memory.
// Pure C++; throws kInvalidArgument naming the field out of range.
#pragma once

#include <cstddef>

#include "plan/ep_layout.hpp"
#include "plan/moe_combine_path.hpp"
#include "symmem/ep.hpp"

namespace symmem::detail {

// `combine`: SYMMEM_MOE_COMBINE as agreed (it decides whether the combine reduces on the experts'
// side, which takes heap memory).
EpGeometry ep_geometry(const EpConfig& config, int world, MoeCombinePath combine = MoeCombinePath::kAuto);
EpMemory ep_memory_of(const EpGeometry& geometry);

// The routing scratch in local device memory: one allocation, each array at its offset.
struct EpScratchOffsets {
  size_t tile_base;          // int32 [tiles][bins]
  size_t warp_base;          // int32 [kEpCountWarps][bins]
  size_t send_base;          // int32 [bins]
  size_t route_rank;         // int32 [T][K]: kExpertMajor destination rank of (t, k), -1: none
  size_t route_row;          // int32 [T][K] (kExpertMajor) or [T][world] (kRankMajor): row there, -1: none
  size_t weights;            // float [T][K]: the dispatch's weights
  size_t expert_num_tokens;  // int32 [E_local]
  size_t num_rows;           // int32
  size_t num_tokens;         // int32: the dispatch's token count
  size_t go;                 // uint32: 1 once the dispatch's verdict let its rows move
  size_t counts;             // uint32 [world][header_words]: the exchanged counts
  size_t total;
};
EpScratchOffsets ep_scratch_offsets(const EpGeometry& geometry);

}  // namespace symmem::detail
