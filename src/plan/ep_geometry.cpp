// A context's geometry and memory from its config: validation with the values in the message,
// and the sizes stated before anything is allocated.
#include "plan/ep_geometry.hpp"

#include <string>

#include "symmem/error.hpp"

namespace symmem::detail {
namespace {

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::kInvalidArgument, "EpConfig: " + what); }

}  // namespace

EpGeometry ep_geometry(const EpConfig& c, int world, MoeCombinePath combine) {
  if (world < 1 || world > kMaxWorld)
    bad("world " + std::to_string(world) + " is outside 1.." + std::to_string(kMaxWorld));
  if (c.num_experts < 1 || c.num_experts > kEpMaxExperts)
    bad("num_experts " + std::to_string(c.num_experts) + " is outside 1.." + std::to_string(kEpMaxExperts));
  if (c.num_experts % world != 0)
    bad("num_experts " + std::to_string(c.num_experts) + " is not a multiple of the world size " +
        std::to_string(world));
  if (c.topk < 1 || c.topk > kEpMaxTopk)
    bad("topk " + std::to_string(c.topk) + " is outside 1.." + std::to_string(kEpMaxTopk));
  if (c.hidden < kEpScaleColumns || c.hidden % kEpScaleColumns != 0)
    bad("hidden " + std::to_string(c.hidden) + " is not a positive multiple of " + std::to_string(kEpScaleColumns));
  if (c.max_tokens_per_rank < 1)
    bad("max_tokens_per_rank " + std::to_string(c.max_tokens_per_rank) + " is not positive");
  if (c.max_tokens_per_expert < 0) bad("max_tokens_per_expert is negative");
  if (c.max_received_rows < 0) bad("max_received_rows is negative");
  if (c.max_blocks != -1 && (c.max_blocks < 1 || c.max_blocks > kMaxBlocks))
    bad("max_blocks " + std::to_string(c.max_blocks) + " is neither -1 (the library's choice) nor in 1.." +
        std::to_string(kMaxBlocks));
  if (c.payload != EpPayload::kBFloat16 && c.payload != EpPayload::kFloat8E4M3) bad("unknown payload");
  if (c.layout != EpLayout::kExpertMajor && c.layout != EpLayout::kRankMajor) bad("unknown layout");

  EpGeometry g;
  g.world = world;
  g.experts = c.num_experts;
  g.local_experts = c.num_experts / world;
  g.topk = c.topk;
  g.hidden = c.hidden;
  g.max_tokens = c.max_tokens_per_rank;
  g.expert_major = c.layout == EpLayout::kExpertMajor;
  g.fp8 = c.payload == EpPayload::kFloat8E4M3;
  const int64_t every_token = int64_t(world) * c.max_tokens_per_rank;
  g.rows_per_expert = g.expert_major ? (c.max_tokens_per_expert ? c.max_tokens_per_expert : every_token) : 0;
  g.rows =
      g.expert_major ? g.rows_per_expert * g.local_experts : (c.max_received_rows ? c.max_received_rows : every_token);
  if (g.rows >= (int64_t(1) << 31))
    bad("the receive area would hold " + std::to_string(g.rows) + " rows (2^31 at most)");
  g.payload_bytes = size_t(c.hidden) * (g.fp8 ? 1 : 2);
  g.scale_bytes = g.fp8 ? size_t(c.hidden / kEpScaleColumns) * sizeof(float) : 0;
  g.tiles = (c.max_tokens_per_rank + kEpTileTokens - 1) / kEpTileTokens;
  g.tiles_per_warp = (g.tiles + kEpCountWarps - 1) / kEpCountWarps;
  g.bins = g.expert_major ? g.experts : world;
  g.header_words = g.header_bad_id_word() + 1;

  const size_t rows = static_cast<size_t>(g.rows);
  g.x_offset = 0;
  g.scales_offset = ep_align256(rows * g.payload_bytes);
  g.topk_idx_offset = g.scales_offset + ep_align256(rows * g.scale_bytes);
  const size_t meta = g.expert_major ? 0 : ep_align256(rows * size_t(c.topk) * 4);
  g.topk_weights_offset = g.topk_idx_offset + meta;
  g.dispatch_bytes = g.topk_weights_offset + meta;
  g.combine_bytes = rows * size_t(c.hidden) * 2;
  // The library's choice of blocks follows the combine. Whether the combine reduces is judged at the
  // most blocks that choice takes (its route lines fit there, so on fewer too).
  g.max_blocks = c.max_blocks > 0 ? c.max_blocks : kEpReducedBlocks;
  g.combine_reduced = moe_combine_reduces(g, combine);
  if (c.max_blocks < 0 && !g.combine_reduced) g.max_blocks = kEpPullBlocks;
  g.combine_heap_bytes = g.combine_bytes;
  if (g.combine_reduced) {  // two halves, by the call's parity (kernels/moe_combine_reduced.cu)
    g.partials_offset = ep_align256(g.combine_bytes);
    g.combine_heap_bytes = g.partials_offset + 2 * size_t(world) * size_t(c.max_tokens_per_rank) * size_t(c.hidden) * 2;
  }

  g.local_bytes = ep_scratch_offsets(g).total;
  return g;
}

EpScratchOffsets ep_scratch_offsets(const EpGeometry& g) {
  const size_t T = static_cast<size_t>(g.max_tokens), K = static_cast<size_t>(g.topk);
  EpScratchOffsets o{};
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t offset = at;
    at += ep_align256(bytes);
    return offset;
  };
  o.tile_base = take(size_t(g.tiles) * g.bins * 4);
  o.warp_base = take(size_t(kEpCountWarps) * g.bins * 4);
  o.send_base = take(size_t(g.bins) * 4);
  o.route_rank = take(T * K * 4);
  o.route_row = take(T * (g.expert_major ? K : size_t(g.world)) * 4);
  o.weights = take(T * K * 4);
  o.expert_num_tokens = take(size_t(g.local_experts) * 4);
  o.num_rows = take(4);
  o.num_tokens = take(4);
  o.go = take(4);
  o.counts = take(size_t(g.world) * g.header_words * 4);
  o.total = at;
  return o;
}

EpMemory ep_memory_of(const EpGeometry& g) {
  EpMemory m;
  m.heap_bytes = g.dispatch_bytes + g.combine_heap_bytes;
  m.local_bytes = g.local_bytes;
  return m;
}

}  // namespace symmem::detail
