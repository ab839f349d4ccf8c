// MoE dispatch / combine: where every row goes, and how much memory a context takes. Pure
// arithmetic, host and device; the CPU tests check the tiled slot formula the kernels use against
// the plain definition (plan/ep_reference.hpp), over many worlds, skews and capacities.
//
// Slots. A rank's (token, k) pairs (kExpertMajor) or (token, destination rank) pairs (kRankMajor)
// are numbered per bin (a global expert, or a destination rank) in token order, then k order:
// that is the order rows of one sender arrive in at its receiver, after the rows of every
// lower-ranked sender. The kernels compute a pair's slot without a global scan:
//   slot = send_base[bin]               rows of lower-ranked senders (from the exchanged counts)
//        + warp_base[warp(tile)][bin]   rows of this rank's earlier count warps
//        + tile_base[tile][bin]         rows of the warp's earlier tiles
//        + in_tile_rank                 rows of the pair's tile before it (pairs_before, summed
//                                       over the tile's tokens by the warp)
// where a tile is kEpTileTokens consecutive tokens and count warp w takes tiles
// [w * tiles_per_warp, (w + 1) * tiles_per_warp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "device/device_types.hpp"
#include "plan/all_to_all_layout.hpp"

// Loop unrolling for the device compiler only (the host compiler does not know the pragma).
#ifdef __CUDACC__
#define SYMMEM_EP_UNROLL _Pragma("unroll")
#else
#define SYMMEM_EP_UNROLL
#endif

namespace symmem::detail {

constexpr int kEpTileTokens = 32;  // a warp's lanes: token of a tile = lane
constexpr int kEpCountWarps = 16;  // warps of the count kernel (512 threads)
constexpr int kEpMaxExperts = 512;
constexpr int kEpMaxTopk = 16;
constexpr int kEpScaleColumns = 128;  // float8 payloads: one float32 scale per 128 columns
// The blocks of a context whose EpConfig::max_blocks is -1 (the library's choice). A combine reduced
// on the experts' side takes as long as the rounds of loads of a warp's unit: at DeepSeek-V3
// decode-128 on 2 ranks a unit takes one round on 64 blocks and two on 32 (26.5 -> 20.2 us from
// graphs, against vLLM's path at 24.8; dispatch 45.8 -> 45.3; bench/results/h200x2/
// moe_sm_budget_2.csv, docs/moe.md). The pulls keep 32 to leave SMs to the experts' GEMMs (DeepEP's
// default and vLLM's DeepEP managers take 20), not for speed: in that run, from graphs, rank-major
// decode-128 stayed within 10% from 24 to 132 blocks, and prefill-4096 bf16 took 224.2-226.6 us to
// dispatch on 64 to 132 blocks against 249.5 on 32, 185.1-191.4 to combine against 184.0.
constexpr int kEpPullBlocks = 32;
constexpr int kEpReducedBlocks = 64;

// Everything the kernels and the host derive from a context's config and world.
struct EpGeometry {
  int world = 1;
  int experts = 0;  // E
  int local_experts = 0;
  int topk = 0;
  int hidden = 0;
  int max_tokens = 0;  // T
  bool expert_major = true;
  bool fp8 = false;
  int64_t rows_per_expert = 0;  // kExpertMajor: each local expert's rows
  int64_t rows = 0;             // rows of the receive area in all
  size_t payload_bytes = 0;     // of one row
  size_t scale_bytes = 0;       // of one row (float8), else 0
  int tiles = 0;                // ceil(T / kEpTileTokens)
  int tiles_per_warp = 0;       // ceil(tiles / kEpCountWarps)
  int bins = 0;                 // slots are counted per bin: E (kExpertMajor) or world (kRankMajor)
  int header_words = 0;         // per rank in the count exchange: E counts, [world rank counts], tokens, bad id
  int max_blocks = 1;

  // The dispatch heap buffer, per rank: rows of payload, then their scales, then (kRankMajor) the
  // rows' top-k ids (int32) and weights (float32). Offsets 256-byte aligned.
  size_t x_offset = 0, scales_offset = 0, topk_idx_offset = 0, topk_weights_offset = 0, dispatch_bytes = 0;
  size_t combine_bytes = 0;  // the combine heap buffer's rows of bfloat16 expert outputs
  // kExpertMajor reduced on the experts' side (plan/moe_combine_path.hpp): the combine heap buffer
  // also holds, after the rows, the partial rows the peers push to this rank (bfloat16
  // [2][world][T][H]: a half per call parity, then the rank that summed them).
  bool combine_reduced = false;
  size_t partials_offset = 0;
  size_t combine_heap_bytes = 0;  // the whole combine heap buffer
  // Local device memory: the routing scratch (EpScratch, kernels/moe_args.hpp).
  size_t local_bytes = 0;

  SYMMEM_HOST_DEVICE int header_tokens_word() const { return experts + (expert_major ? 0 : world); }
  SYMMEM_HOST_DEVICE int header_bad_id_word() const { return header_tokens_word() + 1; }
};

// The tokens a call moves: its request clamped to [0, T] (a request beyond T is a capacity
// fault, reported by the count exchange). The count kernel and the push's launch agree on it.
SYMMEM_HOST_DEVICE inline int ep_call_tokens(int requested, int max_tokens) {
  return requested < 0 ? 0 : requested > max_tokens ? max_tokens : requested;
}

// A pair's bin: the global expert (kExpertMajor) or the rank holding it (kRankMajor).
SYMMEM_HOST_DEVICE inline int ep_rank_of(int expert, int local_experts) { return expert / local_experts; }

// True for an expert id that routes somewhere; negative ids mean "no expert" (vLLM's masked
// entries), ids >= E are errors (the count exchange reports them).
SYMMEM_HOST_DEVICE inline bool ep_routed(int64_t expert, int experts) { return expert >= 0 && expert < experts; }

// An id as the kernels keep it (int32): out-of-range ids (reported by the count exchange) route nowhere.
SYMMEM_HOST_DEVICE inline int32_t ep_kept_id(int64_t expert, int experts) {
  return ep_routed(expert, experts) ? static_cast<int32_t>(expert) : -1;
}

// Of token `lane`'s kept ids (its K entries), how many come before pair (t, k) in slot order and
// name `expert`: all of them for an earlier token, those before k for token t itself. kExpertMajor.
template <int N>
SYMMEM_HOST_DEVICE inline int ep_pairs_before_expert(const int32_t (&experts_of_lane)[N], int topk, int lane, int t,
                                                     int k, int32_t expert) {
  if (lane > t) return 0;
  int n = 0;
  SYMMEM_EP_UNROLL
  for (int k2 = 0; k2 < N; ++k2) n += k2 < topk && (lane < t || k2 < k) && experts_of_lane[k2] == expert;
  return n;
}

// Whether a token with these kept ids sends a row to rank q (kRankMajor: one row per distinct rank).
template <int N>
SYMMEM_HOST_DEVICE inline bool ep_token_goes_to(const int32_t (&experts_of_lane)[N], int topk, int local_experts,
                                                int q) {
  bool goes = false;
  SYMMEM_EP_UNROLL
  for (int k = 0; k < N; ++k)
    goes |= k < topk && experts_of_lane[k] >= 0 && ep_rank_of(experts_of_lane[k], local_experts) == q;
  return goes;
}

// The count warp of a tile.
SYMMEM_HOST_DEVICE inline int ep_warp_of_tile(int tile, int tiles_per_warp) { return tile / tiles_per_warp; }

// The extent a 16-byte aligned region takes (offsets in the heap buffers are 256-byte aligned).
SYMMEM_HOST_DEVICE inline size_t ep_align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace symmem::detail
