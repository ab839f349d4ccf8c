// MoE dispatch layout: the tiled slot formula the kernels use (plan/ep_layout.hpp), simulated on
// the host step by step as the count and push kernels compute it, against the definition
// (tests/harness/ep_reference.hpp), over worlds, expert counts, top-k, batch sizes, skews and
// capacities; the geometry and its errors.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ep_reference.hpp"
#include "plan/ep_geometry.hpp"
#include "plan/moe_combine_path.hpp"
#include "symmem/error.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::detail;
using namespace symmem::test;

namespace {

// What the count kernel leaves for one rank (tile_base, warp_base, totals), computed as it does.
struct Counts {
  std::vector<int32_t> tile_base, warp_base, total_expert, total_rank;
};

int32_t kept(const EpRouting& r, int t, int k, const EpGeometry& g) {
  return ep_kept_id(r.ids[size_t(t) * g.topk + k], g.experts);
}

Counts count_like_the_kernel(const EpGeometry& g, const EpRouting& r) {
  Counts c;
  c.tile_base.assign(size_t(g.tiles) * g.bins, -7);
  c.warp_base.assign(size_t(kEpCountWarps) * g.bins, -7);
  std::vector<std::vector<int32_t>> expert_count(kEpCountWarps, std::vector<int32_t>(g.experts, 0));
  std::vector<std::vector<int32_t>> rank_count(kEpCountWarps, std::vector<int32_t>(g.world, 0));
  const int tokens = std::min(r.tokens, g.max_tokens);
  const int tiles = (tokens + kEpTileTokens - 1) / kEpTileTokens;
  for (int w = 0; w < kEpCountWarps; ++w) {
    for (int tile = w * g.tiles_per_warp; tile < std::min(tiles, (w + 1) * g.tiles_per_warp); ++tile) {
      for (int b = 0; b < g.bins; ++b)
        c.tile_base[size_t(tile) * g.bins + b] = g.expert_major ? expert_count[w][b] : rank_count[w][b];
      for (int t = tile * kEpTileTokens; t < std::min(tokens, (tile + 1) * kEpTileTokens); ++t) {
        uint32_t ranks = 0;
        for (int k = 0; k < g.topk; ++k) {
          const int32_t e = kept(r, t, k, g);
          if (e < 0) continue;
          ++expert_count[w][e];
          ranks |= 1u << ep_rank_of(e, g.local_experts);
        }
        for (int q = 0; q < g.world; ++q)
          if (ranks >> q & 1u) ++rank_count[w][q];
      }
    }
  }
  c.total_expert.assign(g.experts, 0);
  c.total_rank.assign(g.world, 0);
  for (int b = 0; b < g.experts + g.world; ++b) {
    const bool is_expert = b < g.experts;
    const int bin = is_expert ? b : b - g.experts;
    int32_t run = 0;
    for (int w = 0; w < kEpCountWarps; ++w) {
      if (is_expert == g.expert_major) c.warp_base[size_t(w) * g.bins + bin] = run;
      run += is_expert ? expert_count[w][bin] : rank_count[w][bin];
    }
    (is_expert ? c.total_expert[bin] : c.total_rank[bin]) = run;
  }
  return c;
}

// The push kernel's slot of every pair of rank `me`, from the counts of every rank.
std::vector<EpPlace> places_like_the_kernel(const EpGeometry& g, const std::vector<EpRouting>& routing,
                                            const std::vector<Counts>& counts, int me) {
  const EpRouting& r = routing[me];
  const int tokens = std::min(r.tokens, g.max_tokens);
  const int columns = g.expert_major ? g.topk : g.world;
  std::vector<EpPlace> route(size_t(g.max_tokens) * columns);
  for (int t = 0; t < tokens; ++t) {
    const int tile = t / kEpTileTokens, t_lane = t % kEpTileTokens;
    int32_t lanes[kEpTileTokens][kEpMaxTopk];
    for (int lane = 0; lane < kEpTileTokens; ++lane)
      for (int k = 0; k < kEpMaxTopk; ++k) {
        const int lt = tile * kEpTileTokens + lane;
        lanes[lane][k] = k < g.topk && lt < tokens ? kept(r, lt, k, g) : -1;
      }
    const size_t bases = size_t(ep_warp_of_tile(tile, g.tiles_per_warp)) * g.bins;
    for (int d = 0; d < columns; ++d) {
      int bin = -1, in_tile = 0;
      int q = -1;
      if (g.expert_major) {
        const int32_t e = lanes[t_lane][d];
        if (e < 0) continue;
        for (int lane = 0; lane < kEpTileTokens; ++lane)
          in_tile += ep_pairs_before_expert(lanes[lane], g.topk, lane, t_lane, d, e);
        bin = e;
        q = ep_rank_of(e, g.local_experts);
      } else {
        if (!ep_token_goes_to(lanes[t_lane], g.topk, g.local_experts, d)) continue;
        for (int lane = 0; lane < t_lane; ++lane) in_tile += ep_token_goes_to(lanes[lane], g.topk, g.local_experts, d);
        bin = d;
        q = d;
      }
      int64_t send_base = 0;
      for (int s = 0; s < me; ++s)
        send_base += g.expert_major ? counts[s].total_expert[bin] : counts[s].total_rank[bin];
      const int64_t slot =
          send_base + counts[me].warp_base[bases + bin] + counts[me].tile_base[size_t(tile) * g.bins + bin] + in_tile;
      const int64_t row = g.expert_major ? int64_t(bin % g.local_experts) * g.rows_per_expert + slot : slot;
      route[size_t(t) * columns + d] = {q, row};
    }
  }
  return route;
}

enum class Skew { kRandom, kZipf, kOneHot, kEmptyRanks, kMasked, kDuplicates };

std::vector<EpRouting> draw(std::mt19937_64& rng, const EpGeometry& g, Skew skew) {
  std::vector<EpRouting> routing(g.world);
  for (int s = 0; s < g.world; ++s) {
    EpRouting& r = routing[s];
    r.tokens = skew == Skew::kEmptyRanks && s % 2 == 1 ? 0 : int(rng() % (g.max_tokens + 1));
    r.ids.assign(size_t(g.max_tokens) * g.topk, -1);
    for (int t = 0; t < g.max_tokens; ++t) {
      std::vector<int64_t> chosen;
      for (int k = 0; k < g.topk; ++k) {
        int64_t e = 0;
        switch (skew) {
          case Skew::kZipf: {
            const double u = std::uniform_real_distribution<double>(0, 1)(rng);
            e = std::min<int64_t>(g.experts - 1, int64_t(std::pow(double(g.experts), u * u)) - 1 + (rng() % 2));
            break;
          }
          case Skew::kOneHot: e = k == 0 ? 0 : -1; break;
          case Skew::kMasked: e = rng() % 3 == 0 ? -1 : int64_t(rng() % g.experts); break;
          case Skew::kDuplicates: e = int64_t(rng() % std::min(3, g.experts)); break;
          default: e = int64_t(rng() % g.experts); break;
        }
        // Distinct ids per token except where duplicates are the point.
        if (skew != Skew::kDuplicates && e >= 0 && std::find(chosen.begin(), chosen.end(), e) != chosen.end()) e = -1;
        if (e >= 0) chosen.push_back(e);
        r.ids[size_t(t) * g.topk + k] = e;
      }
    }
  }
  return routing;
}

EpConfig config_of(int experts, int topk, int tokens, EpLayout layout, int capacity) {
  EpConfig c;
  c.num_experts = experts;
  c.topk = topk;
  c.hidden = 256;
  c.max_tokens_per_rank = tokens;
  c.layout = layout;
  if (layout == EpLayout::kExpertMajor)
    c.max_tokens_per_expert = capacity;
  else
    c.max_received_rows = capacity;
  return c;
}

}  // namespace

TEST(ep_tiled_slots_match_the_definition) {
  std::mt19937_64 rng(2024);
  int checked = 0;
  for (int world : {1, 2, 3, 4, 8})
    for (int experts : {8, 64, 256, 512}) {
      if (experts % world) continue;
      for (int topk : {1, 2, 8, 16})
        for (int tokens : {1, 31, 33, 100, 700})
          for (EpLayout layout : {EpLayout::kExpertMajor, EpLayout::kRankMajor})
            for (Skew skew :
                 {Skew::kRandom, Skew::kZipf, Skew::kOneHot, Skew::kEmptyRanks, Skew::kMasked, Skew::kDuplicates}) {
              if ((experts >= 256 && tokens > 100 && topk > 2) || (topk == 16 && experts < 64)) continue;
              // A token naming an expert twice sends it two rows: room for K per token then.
              const int capacity =
                  skew == Skew::kDuplicates && layout == EpLayout::kExpertMajor ? world * tokens * topk : 0;
              const EpGeometry g = ep_geometry(config_of(experts, topk, tokens, layout, capacity), world);
              const std::vector<EpRouting> routing = draw(rng, g, skew);
              const EpExpected x = ep_expected(g, routing);
              if (x.fault.kind != kFaultNone) throw Failure("worst-case capacity overflowed");
              std::vector<Counts> counts;
              for (int s = 0; s < world; ++s) counts.push_back(count_like_the_kernel(g, routing[s]));
              for (int s = 0; s < world; ++s) {
                const std::vector<EpPlace> got = places_like_the_kernel(g, routing, counts, s);
                for (size_t i = 0; i < got.size(); ++i)
                  if (got[i].rank != x.route[s][i].rank || got[i].row != x.route[s][i].row)
                    throw Failure("world " + std::to_string(world) + " experts " + std::to_string(experts) + " topk " +
                                  std::to_string(topk) + " tokens " + std::to_string(tokens) + " " +
                                  ep_layout_name(layout) + " skew " + std::to_string(int(skew)) + ": rank " +
                                  std::to_string(s) + " pair " + std::to_string(i) + " goes to (" +
                                  std::to_string(got[i].rank) + ", " + std::to_string(got[i].row) + "), expected (" +
                                  std::to_string(x.route[s][i].rank) + ", " + std::to_string(x.route[s][i].row) + ")");
              }
              // The received counts every rank derives from the exchanged totals.
              for (int q = 0; q < world; ++q)
                for (int e = 0; e < g.local_experts; ++e) {
                  int32_t n = 0;
                  for (int s = 0; s < world; ++s) n += counts[s].total_expert[q * g.local_experts + e];
                  EXPECT_EQ(n, x.expert_num_tokens[q][e]);
                }
              ++checked;
            }
    }
  EXPECT(checked > 500);
}

TEST(ep_verdict_names_the_full_expert_or_rank) {
  std::mt19937_64 rng(5);
  for (int world : {2, 4, 8}) {
    // Every token of every rank to expert 0 (one-hot): expert 0 of rank 0 receives world * T rows.
    for (EpLayout layout : {EpLayout::kExpertMajor, EpLayout::kRankMajor}) {
      const int tokens = 40;
      EpGeometry fits = ep_geometry(config_of(16, 2, tokens, layout, world * tokens), world);
      std::vector<EpRouting> routing = draw(rng, fits, Skew::kOneHot);
      for (auto& r : routing) r.tokens = tokens;
      EXPECT_EQ(ep_expected(fits, routing).fault.kind, uint32_t(kFaultNone));  // exactly at capacity
      const EpGeometry tight = ep_geometry(config_of(16, 2, tokens, layout, world * tokens - 1), world);
      const LayoutFault f = ep_expected(tight, routing).fault;
      EXPECT_EQ(f.kind, uint32_t(layout == EpLayout::kExpertMajor ? kFaultExpertFull : kFaultOutputTooSmall));
      EXPECT_EQ(f.rank, 0);
      EXPECT_EQ(f.needed, uint64_t(world * tokens));
      // Too many tokens on the last rank comes first; an id past E too.
      routing[world - 1].tokens = tokens + 1;
      EXPECT_EQ(ep_expected(tight, routing).fault.kind, uint32_t(kFaultTokens));
      EXPECT_EQ(ep_expected(tight, routing).fault.rank, world - 1);
      routing[world - 1].tokens = tokens;
      routing[1].ids[3] = 16;
      EXPECT_EQ(ep_expected(tight, routing).fault.kind, uint32_t(kFaultExpertId));
      EXPECT_EQ(ep_expected(tight, routing).fault.rank, 1);
    }
  }
}

namespace {

// DeepSeek-V3 decode: 256 experts, top-8, hidden 7168, 128 tokens a rank, expert-major, bf16.
EpConfig deepseek_v3_decode() {
  EpConfig c;
  c.num_experts = 256;
  c.topk = 8;
  c.hidden = 7168;
  c.max_tokens_per_rank = 128;
  c.layout = EpLayout::kExpertMajor;
  return c;
}

}  // namespace

TEST(ep_geometry_states_memory_and_rejects_bad_configs) {
  // DeepSeek-V3 decode at EP8, fp8 dispatch.
  EpConfig c = deepseek_v3_decode();
  c.payload = EpPayload::kFloat8E4M3;
  const EpGeometry g = ep_geometry(c, 8);
  EXPECT_EQ(g.local_experts, 32);
  EXPECT_EQ(g.rows_per_expert, int64_t(8 * 128));
  EXPECT_EQ(g.payload_bytes, size_t(7168));
  EXPECT_EQ(g.scale_bytes, size_t(56 * 4));
  const size_t rows = size_t(32) * 1024;
  EXPECT_EQ(g.dispatch_bytes, rows * 7168 + rows * 224);
  EXPECT_EQ(g.combine_bytes, rows * 7168 * 2);
  const EpMemory m = ep_memory(c, 8);
  EXPECT_EQ(m.heap_bytes, g.dispatch_bytes + g.combine_heap_bytes);
  EXPECT(m.local_bytes >= size_t(128) * 8 * 12);
  // Offsets are 256-byte aligned and regions do not overlap.
  EXPECT_EQ(g.scales_offset % 256, size_t(0));
  EXPECT(g.scales_offset >= rows * g.payload_bytes);
  // Rank-major prefill: one row per (token, rank), ids and weights with each row.
  c.layout = EpLayout::kRankMajor;
  c.max_tokens_per_rank = 4096;
  c.payload = EpPayload::kBFloat16;
  const EpGeometry r = ep_geometry(c, 8);
  EXPECT_EQ(r.rows, int64_t(8 * 4096));
  EXPECT_EQ(r.dispatch_bytes, size_t(r.rows) * 7168 * 2 + 2 * ep_align256(size_t(r.rows) * 8 * 4));
  // Errors name the field.
  EpConfig bad = c;
  bad.num_experts = 255;
  EXPECT_ERROR(ep_geometry(bad, 8), ErrorCode::kInvalidArgument, "num_experts 255 is not a multiple");
  bad = c;
  bad.hidden = 7000;
  EXPECT_ERROR(ep_geometry(bad, 8), ErrorCode::kInvalidArgument, "hidden 7000");
  bad = c;
  bad.topk = 17;
  EXPECT_ERROR(ep_geometry(bad, 8), ErrorCode::kInvalidArgument, "topk 17");
  bad = c;
  bad.num_experts = 1024;
  EXPECT_ERROR(ep_geometry(bad, 8), ErrorCode::kInvalidArgument, "num_experts 1024");
  bad = c;
  bad.max_tokens_per_rank = 0;
  EXPECT_ERROR(ep_geometry(bad, 8), ErrorCode::kInvalidArgument, "max_tokens_per_rank");
}

// The combine's pull (plan/moe_combine_path.hpp): forced either way, or for rank-major by the
// context's largest call at the 1 MiB line (decode-1 of DeepSeek-V3 on registers, decode-128 and
// prefill in bulk); expert-major on registers up to 16 MiB of rows (decode-128), bulk beyond.
TEST(moe_combine_path_follows_the_contexts_largest_call) {
  EpGeometry g;
  g.hidden = 7168;
  g.expert_major = false;
  auto bulk = [&](int tokens, int sources, MoeCombinePath forced) {
    g.max_tokens = tokens;
    return moe_combine_uses_bulk(g, sources, forced);
  };
  EXPECT(!bulk(1, 2, MoeCombinePath::kAuto));    // 28 KiB
  EXPECT(!bulk(1, 8, MoeCombinePath::kAuto));    // 112 KiB
  EXPECT(bulk(128, 2, MoeCombinePath::kAuto));   // 3.5 MiB
  EXPECT(bulk(4096, 2, MoeCombinePath::kAuto));
  g.hidden = 128;  // the line itself: 4096 x 1 x 128 x 2 bytes = 1 MiB
  EXPECT(bulk(4096, 1, MoeCombinePath::kAuto));
  EXPECT(!bulk(4095, 1, MoeCombinePath::kAuto));
  EXPECT(bulk(1, 2, MoeCombinePath::kBulk));
  EXPECT(!bulk(4096, 8, MoeCombinePath::kRegisters));
  g.expert_major = true;
  g.hidden = 7168;
  EXPECT(!bulk(1, 8, MoeCombinePath::kAuto));
  EXPECT(!bulk(128, 8, MoeCombinePath::kAuto));  // 14 MiB of rows: still registers
  EXPECT(!bulk(146, 8, MoeCombinePath::kAuto));  // 15.97 MiB
  EXPECT(bulk(147, 8, MoeCombinePath::kAuto));   // 16.08 MiB: not measured, bulk as before
  EXPECT(bulk(4096, 8, MoeCombinePath::kAuto));
  EXPECT(bulk(128, 8, MoeCombinePath::kBulk));
}

// The reduction on the experts' side: expert-major only; auto where top-k >= 4 x world and the
// context moves 1 MiB of rows or more; never where its route lines would not fit one sender's
// low-latency slot; its partials after the rows, aligned, in the heap.
TEST(moe_combine_reduction_is_chosen_by_shape_and_laid_out_after_the_rows) {
  EpConfig c = deepseek_v3_decode();
  auto reduced = [&](int world, MoeCombinePath forced) { return ep_geometry(c, world, forced).combine_reduced; };
  EXPECT(reduced(2, MoeCombinePath::kAuto));          // top-8 of 2 ranks, 14 MiB of rows
  EXPECT(!reduced(4, MoeCombinePath::kAuto));         // top-8 of 4 ranks: 2 routes a rank
  EXPECT(reduced(4, MoeCombinePath::kReduced));       // forced
  EXPECT(!reduced(2, MoeCombinePath::kBulk));         // a pull forced
  EXPECT(!reduced(2, MoeCombinePath::kRegisters));
  c.max_tokens_per_rank = 16384;                      // 2 x 8 route lines a token: past the slot
  EXPECT(!reduced(2, MoeCombinePath::kReduced));
  c.max_tokens_per_rank = 16000;
  EXPECT(reduced(2, MoeCombinePath::kReduced));
  c.max_tokens_per_rank = 1;                          // 112 KiB of rows
  EXPECT(!reduced(2, MoeCombinePath::kAuto));
  EXPECT(reduced(2, MoeCombinePath::kReduced));
  c.layout = EpLayout::kRankMajor;                    // rank-major rows are reduced by the experts
  EXPECT(!reduced(2, MoeCombinePath::kReduced));
  EXPECT_EQ(ep_geometry(c, 2, MoeCombinePath::kReduced).combine_heap_bytes,
            ep_geometry(c, 2, MoeCombinePath::kReduced).combine_bytes);

  c.layout = EpLayout::kExpertMajor;
  c.max_tokens_per_rank = 100;
  c.topk = 5;
  c.num_experts = 8;
  EXPECT(!ep_geometry(c, 1, MoeCombinePath::kReduced).combine_reduced);  // one rank: nothing to save
  for (int world : {2, 3, 8}) {
    c.num_experts = 8 * world;
    const EpGeometry g = ep_geometry(c, world, MoeCombinePath::kReduced);
    const size_t T = 100;
    EXPECT(g.combine_reduced);
    EXPECT(g.partials_offset >= g.combine_bytes);
    EXPECT_EQ(g.partials_offset % 256, size_t(0));
    EXPECT_EQ(g.combine_heap_bytes, g.partials_offset + 2 * size_t(world) * T * 7168 * 2);  // two halves
    EXPECT_EQ(ep_memory_of(g).heap_bytes, g.dispatch_bytes + g.combine_heap_bytes);
    // Not reduced: nothing beyond the rows.
    const EpGeometry pull = ep_geometry(c, world, MoeCombinePath::kBulk);
    EXPECT_EQ(pull.combine_heap_bytes, pull.combine_bytes);
  }
}

// EpConfig::max_blocks -1 (the default): 64 blocks where the combine is reduced (auto or forced), 32
// elsewhere; a budget the caller sets is kept, whatever the combine; 0 and past kMaxBlocks refused.
TEST(ep_blocks_follow_the_combine_unless_the_caller_sets_a_budget) {
  EpConfig c = deepseek_v3_decode();
  EXPECT_EQ(c.max_blocks, -1);
  EXPECT_EQ(ep_geometry(c, 2).max_blocks, kEpReducedBlocks);  // reduced: top-8 of 2 ranks
  EXPECT_EQ(ep_geometry(c, 4).max_blocks, kEpPullBlocks);     // the register pull
  EXPECT_EQ(ep_geometry(c, 4, MoeCombinePath::kReduced).max_blocks, kEpReducedBlocks);
  EXPECT_EQ(ep_geometry(c, 2, MoeCombinePath::kRegisters).max_blocks, kEpPullBlocks);
  c.max_tokens_per_rank = 1;  // one token: the pull
  EXPECT_EQ(ep_geometry(c, 2).max_blocks, kEpPullBlocks);
  c.max_tokens_per_rank = 128;
  c.layout = EpLayout::kRankMajor;
  EXPECT_EQ(ep_geometry(c, 2).max_blocks, kEpPullBlocks);
  c.layout = EpLayout::kExpertMajor;
  for (int budget : {1, 24, 32, 132, kMaxBlocks}) {
    c.max_blocks = budget;
    const EpGeometry g = ep_geometry(c, 2);
    EXPECT_EQ(g.max_blocks, budget);
    EXPECT(g.combine_reduced);
    const EpGeometry pull = ep_geometry(c, 4);  // a budget is the budget on a pulling context too
    EXPECT_EQ(pull.max_blocks, budget);
    EXPECT(!pull.combine_reduced);
  }
  for (int budget : {0, -2, kMaxBlocks + 1}) {
    c.max_blocks = budget;
    EXPECT_ERROR(ep_geometry(c, 2), ErrorCode::kInvalidArgument,
                 "max_blocks " + std::to_string(budget) + " is neither -1");
  }
}
