// Which pull an MoE combine takes (kernels/moe_combine.cu): 16-byte loads per lane into registers,
// or bulk copies of every source row into shared memory. Both sum in the same order with the same
// arithmetic, so the path changes no bit of the result; SYMMEM_MOE_COMBINE forces one (an agreed
// setting, comm/agreed_settings.cpp). Plain C++.
#pragma once

#include <cstddef>

#include "plan/ep_layout.hpp"

namespace symmem::detail {

enum class MoeCombinePath { kAuto = 0, kBulk = 1, kRegisters = 2 };

// Chosen once per context from its capacity (max_tokens), not per call: a context sized for
// prefill takes bulk for its small calls too. Measured on 2 x H200 (bench/results/h200x2/moe_combine_*_2.csv):
// bulk was faster at decode-128 and prefill-4096 in both layouts; at one token (one unit on one
// block) registers won rank-major (7.2 against 7.8 us from graphs), bulk expert-major (8.7 against
// 9.9). `sources`: the rows a token sums (top-k for expert-major, the world for rank-major).
inline bool moe_combine_uses_bulk(const EpGeometry& g, int sources, MoeCombinePath forced) {
  if (forced != MoeCombinePath::kAuto) return forced == MoeCombinePath::kBulk;
  constexpr size_t kBulkMinBytes = size_t(1) << 20;
  return size_t(g.max_tokens) * size_t(sources) * size_t(g.hidden) * 2 >= kBulkMinBytes;
}

}  // namespace symmem::detail
