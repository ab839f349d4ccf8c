// Which combine an MoE context takes (kernels/moe_combine.cu, kernels/moe_combine_reduced.cu):
// the pull, with 16-byte loads per lane into registers or bulk copies of every source row into
// shared memory (both sum in the same order with the same arithmetic, so the pull changes no bit of
// the result), or, for the expert-major layout, the reduction on the experts' side. SYMMEM_MOE_COMBINE
// forces one (an agreed setting, comm/agreed_settings.cpp). Plain C++.
#pragma once

#include <cstddef>

#include "plan/ep_layout.hpp"

namespace symmem::detail {

enum class MoeCombinePath { kAuto = 0, kBulk = 1, kRegisters = 2, kReduced = 3 };

// The pull's rows: chosen once per context from its capacity (max_tokens), not per call: a context
// sized for prefill takes bulk for its small calls too. Measured on 2 x H200 (bench/results/h200x2/moe_combine_*_2.csv):
// bulk was faster at decode-128 and prefill-4096 in both layouts; at one token (one unit on one
// block) registers won rank-major (7.2 against 7.8 us from graphs), bulk expert-major (8.7 against
// 9.9). `sources`: the rows a token sums (top-k for expert-major, the world for rank-major).
inline bool moe_combine_uses_bulk(const EpGeometry& g, int sources, MoeCombinePath forced) {
  if (forced == MoeCombinePath::kBulk || forced == MoeCombinePath::kRegisters) return forced == MoeCombinePath::kBulk;
  constexpr size_t kBulkMinBytes = size_t(1) << 20;
  return size_t(g.max_tokens) * size_t(sources) * size_t(g.hidden) * 2 >= kBulkMinBytes;
}

// The reduction on the experts' side (expert-major only): each rank sums, per token of each source,
// the rows of its own experts in float32 and pushes that one partial row (float32, 4 bytes a
// column) to the source, which adds the partials of the ranks that hold its routes. A pull moves
// 2 bytes a column for every route on another rank, so the reduction moves fewer bytes where a
// token has about two routes or more on each rank it reaches (top-k of 4 x world and more); it
// costs a second line exchange, which a call of few tokens does not win back. Auto takes it where
// top-k >= 4 x world for contexts whose largest call moves 1 MiB of rows or more (2 x H200, top-8,
// 128 tokens: bench/results/h200x2/moe_2.csv); elsewhere only when forced.
inline bool moe_combine_reduces(const EpGeometry& g, MoeCombinePath forced) {
  if (!g.expert_major) return false;
  if (forced != MoeCombinePath::kAuto) return forced == MoeCombinePath::kReduced;
  return g.topk >= 4 * g.world && moe_combine_uses_bulk(g, g.topk, MoeCombinePath::kAuto);
}

}  // namespace symmem::detail
