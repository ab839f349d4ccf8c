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

// Chosen once per context from its layout and capacity (max_tokens), not per call: a rank-major
// context sized for prefill takes bulk for its small calls too. Measured on 2 x H200 at 24, 32 and
// 48 blocks, two runs (bench/results/h200x2/moe_combine_registers_2.csv against moe_combine_bulk_2.csv,
// 408f8e3), from graphs: rank-major, bulk was faster at decode-128 (13.6-13.8 against 15.4-15.8 us
// at 32 blocks) and prefill-4096 (184 against 246 at 32, 217 against 310 at 24; at 48 registers
// led, 188 against 199), registers at one token (7.6-7.9 against 8.1-8.2 at 32); expert-major,
// registers at decode-128 (31.4-31.7 against 37.4 at 32 blocks, 35.7 against 48.2 at 24, level at
// 48) and level at one token. Expert-major was measured up to decode-128 of DeepSeek-V3 (14 MiB of
// rows); larger expert-major contexts keep the bulk pull, which the rank-major prefill favours.
// `sources`: the rows a token sums (top-k for expert-major, the world for rank-major).
inline bool moe_combine_uses_bulk(const EpGeometry& g, int sources, MoeCombinePath forced) {
  if (forced == MoeCombinePath::kBulk || forced == MoeCombinePath::kRegisters) return forced == MoeCombinePath::kBulk;
  constexpr size_t kBulkMinBytes = size_t(1) << 20;
  constexpr size_t kExpertMajorRegistersMaxBytes = size_t(16) << 20;
  const size_t bytes = size_t(g.max_tokens) * size_t(sources) * size_t(g.hidden) * 2;
  return g.expert_major ? bytes > kExpertMajorRegistersMaxBytes : bytes >= kBulkMinBytes;
}

// The reduced combine sends each unit's routes as 2 x top-k low-latency lines, after the 2 x
// kMaxBlocks words of the blocks' lines, in the sender's slot of a receiver's area (Workspaces::
// kLowLatencySlotBytes / 4 words, checked where the context is created); a rank's units are at
// most max(T, the grid's warps) (kernels/moe_combine_reduced.cu, units_of).
constexpr size_t kEpLinesSlotWords = (size_t(1) << 20) / 4;
inline bool moe_reduced_routes_fit(const EpGeometry& g) {
  const size_t warps = size_t(g.max_blocks) * (kThreadsPerBlock / 32);
  const size_t units = size_t(g.max_tokens) > warps ? size_t(g.max_tokens) : warps;
  return 2 * size_t(kMaxBlocks) + units * 2 * size_t(g.topk) <= kEpLinesSlotWords;
}

// The reduction on the experts' side (expert-major only): each rank sums, per token of each source,
// the rows of its own experts in float32 and pushes that one partial row (bfloat16) to the
// source, which adds the partials of the ranks that hold its routes. A pull moves a row for every
// route on another rank, so the reduction moves fewer bytes where a token has two routes or more
// on the ranks it reaches (top-k of 2 x world and more: about K / W each), at one bfloat16
// rounding per partial. Auto takes it where top-k >= 4 x world (measured: top-8 of 2 ranks) for
// contexts whose largest call moves 1 MiB of rows or more; elsewhere only when forced, and never
// where its route lines would not fit, nor on one rank. Measured on 2 x H200, decode-128 of
// DeepSeek-V3 from graphs (bench/results/h200x2/moe_sm_budget_2.csv): 26.5 us at 32 blocks, 20.2
// at 64, 19.5 at 132; the register pull took 30.5-31.9 at 32-132 blocks in that bench as of 038a44d
// (another build and run; 64 not measured). A call of one token pays the route lines and the line
// for little: 11.2 us forced on a one-token context (moe_combine_reduced_2.csv) against the
// register pull's 8.7-8.9 (moe_2.csv).
inline bool moe_combine_reduces(const EpGeometry& g, MoeCombinePath forced) {
  if (!g.expert_major || g.world < 2 || !moe_reduced_routes_fit(g)) return false;
  if (forced != MoeCombinePath::kAuto) return forced == MoeCombinePath::kReduced;
  constexpr size_t kReducedMinBytes = size_t(1) << 20;
  return g.topk >= 4 * g.world && size_t(g.max_tokens) * size_t(g.topk) * size_t(g.hidden) * 2 >= kReducedMinBytes;
}

}  // namespace symmem::detail
