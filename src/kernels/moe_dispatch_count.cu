// MoE dispatch, first kernel (kernels/moe_args.hpp): count, exchange the counts, decide. One block
// of kEpCountWarps warps; a counted low-latency call (call_end on every path).
//
// Counting: warp w takes tiles [w * tiles_per_warp, ...) in order; before each tile it stores its
// running per-bin counts as the tile's base (tile_base), then adds the tile's pairs to them in
// shared memory. The warps' totals become warp_base (exclusive over warps) and this rank's counts.
// Failure records: the exchange's waits name phase 0; a call that does not fit records
// kStatusCapacity (plan/capacity_failure.hpp) on every rank, and `go` stays 0.
#include "device/call_counter.cuh"
#include "device/dependent_launch.cuh"
#include "device/low_latency.cuh"
#include "plan/capacity_failure.hpp"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"
#include "kernels/moe_args.hpp"

namespace symmem::detail {
namespace {

__device__ int64_t expert_at(const MoeDispatchArgs& a, int t, int k) {
  const size_t i = size_t(t) * a.g.topk + k;
  return a.topk_idx_int64 ? static_cast<const int64_t*>(a.topk_idx)[i]
                          : int64_t(static_cast<const int32_t*>(a.topk_idx)[i]);
}

// Fault candidates in layout_fault's order (senders first, then receivers): a smaller key wins.
__device__ uint32_t fault_key(int phase, int index) { return uint32_t(phase) << 20 | uint32_t(index); }

__global__ void __launch_bounds__(kThreadsPerBlock) moe_dispatch_count(MoeDispatchArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const EpGeometry& g = a.g;
  const EpScratch& sc = a.scratch;
  const uint32_t call = device::call_begin(s);
  const int world = s.world, me = s.rank;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) *sc.go = 0;  // until the verdict

  const int requested = a.num_tokens_device ? *a.num_tokens_device : a.num_tokens;
  const int tokens = ep_call_tokens(requested, g.max_tokens);

  // Per-warp counts: per expert (always: the receivers' expert_num_tokens), per rank (kRankMajor).
  __shared__ int32_t expert_count[kEpCountWarps][kEpMaxExperts];
  __shared__ int32_t rank_count[kEpCountWarps][kMaxWorld];
  __shared__ unsigned long long bad_id;  // first out-of-range expert id + 1, 0: none
  for (int i = threadIdx.x; i < kEpCountWarps * g.experts; i += blockDim.x)
    expert_count[i / g.experts][i % g.experts] = 0;
  if (threadIdx.x < kEpCountWarps * kMaxWorld) rank_count[threadIdx.x / kMaxWorld][threadIdx.x % kMaxWorld] = 0;
  if (threadIdx.x == 0) bad_id = 0;
  __syncthreads();

  const int tiles = (tokens + kEpTileTokens - 1) / kEpTileTokens;
  const int first = warp * g.tiles_per_warp;
  const int last = min(tiles, first + g.tiles_per_warp);
  for (int tile = first; tile < last; ++tile) {
    __syncwarp();
    // The tile's base: this warp's counts before it.
    for (int b = lane; b < g.bins; b += 32)
      sc.tile_base[size_t(tile) * g.bins + b] = g.expert_major ? expert_count[warp][b] : rank_count[warp][b];
    __syncwarp();
    const int t = tile * kEpTileTokens + lane;
    if (t < tokens) {
      uint32_t ranks = 0;
      for (int k = 0; k < g.topk; ++k) {
        const int64_t e = expert_at(a, t, k);
        if (ep_routed(e, g.experts)) {
          atomicAdd(&expert_count[warp][e], 1);
          ranks |= 1u << ep_rank_of(int(e), g.local_experts);
        } else if (e >= g.experts) {
          atomicCAS(&bad_id, 0ull, static_cast<unsigned long long>(e) + 1);
        }
      }
      if (!g.expert_major)
        for (int q = 0; q < world; ++q)
          if (ranks >> q & 1u) atomicAdd(&rank_count[warp][q], 1);
    }
  }
  __syncthreads();

  // Warp totals -> exclusive warp bases; this rank's totals.
  __shared__ int32_t total_expert[kEpMaxExperts];
  __shared__ int32_t total_rank[kMaxWorld];
  for (int b = threadIdx.x; b < g.experts + world; b += blockDim.x) {
    const bool is_expert = b < g.experts;
    const int bin = is_expert ? b : b - g.experts;
    int32_t run = 0;
    for (int w = 0; w < kEpCountWarps; ++w) {
      const int32_t v = is_expert ? expert_count[w][bin] : rank_count[w][bin];
      if (is_expert == g.expert_major) sc.warp_base[size_t(w) * g.bins + bin] = run;
      run += v;
    }
    if (is_expert)
      total_expert[bin] = run;
    else
      total_rank[bin] = run;
  }
  __syncthreads();

  // The header: per-expert counts, [per-rank counts], tokens, bad id.
  auto my_word = [&](int w) -> uint32_t {
    if (w < g.experts) return uint32_t(total_expert[w]);
    if (!g.expert_major && w < g.experts + world) return uint32_t(total_rank[w - g.experts]);
    if (w == g.header_tokens_word()) return capacity_word(requested < 0 ? 0 : uint64_t(requested));
    return static_cast<uint32_t>(bad_id > 0xFFFFFFFFull ? 0xFFFFFFFFull : bad_id);
  };
  device::fence_acq_rel_sys();  // this stream's earlier writes before the lines (the entry guard)
  const uint64_t tag = uint64_t(s.signature) << 32;
  for (int w = threadIdx.x; w < g.header_words; w += blockDim.x) {
    const uint32_t word = my_word(w);
    for (int k = 1; k < world; ++k) {
      const int peer = (me + k) % world;
      device::st_relaxed_sys_u64(device::low_latency_slot(a.lines.peers[peer], call, me, a.lines.slot_words) + w,
                                 tag | word);
    }
  }
  __shared__ int ok;
  if (threadIdx.x == 0) ok = 1;
  __syncthreads();
  uint64_t* slots = device::low_latency_slot(a.lines.peers[me], call, 0, a.lines.slot_words);
  const uint32_t every = (1u << world) - 1;
  for (int w = threadIdx.x; w < g.header_words; w += blockDim.x) {
    uint32_t word[kMaxWorld];
    if (!device::collect_words(s, slots, a.lines.slot_words, w, every, my_word(w), 0, word)) {
      ok = 0;
      break;
    }
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r)
      if (r < world) sc.counts[size_t(r) * g.header_words + w] = word[r];
  }
  __syncthreads();
  device::fence_acq_rel_sys();  // acquire: the peers' writes before their lines
  if (!ok) {
    device::call_end(s, call);
    return;
  }
  auto count = [&](int r, int w) { return sc.counts[size_t(r) * g.header_words + w]; };

  // The verdict, from the matrix every rank holds: senders in rank order (token count, bad id),
  // then receivers (an expert or a rank whose rows would not fit).
  __shared__ uint32_t winner;
  if (threadIdx.x == 0) winner = 0xFFFFFFFFu;
  __syncthreads();
  if (threadIdx.x < world) {
    const int r = threadIdx.x;
    if (count(r, g.header_tokens_word()) > uint32_t(g.max_tokens)) atomicMin(&winner, fault_key(0, 2 * r));
    if (count(r, g.header_bad_id_word()) != 0) atomicMin(&winner, fault_key(0, 2 * r + 1));
  }
  for (int b = threadIdx.x; b < g.bins; b += blockDim.x) {
    uint64_t rows = 0;
    for (int r = 0; r < world; ++r) rows += count(r, g.expert_major ? b : g.experts + b);
    const uint64_t capacity = g.expert_major ? uint64_t(g.rows_per_expert) : uint64_t(g.rows);
    if (rows > capacity) atomicMin(&winner, fault_key(1, b));
  }
  __syncthreads();
  if (winner != 0xFFFFFFFFu) {
    if (threadIdx.x == 0) {
      LayoutFault f;
      const int index = winner & 0xFFFFF;
      if ((winner >> 20) == 0) {
        const int r = index / 2;
        if (index % 2 == 0)
          f = {kFaultTokens, r, -1, count(r, g.header_tokens_word()), uint64_t(g.max_tokens)};
        else
          f = {kFaultExpertId, r, -1, uint64_t(count(r, g.header_bad_id_word())) - 1, uint64_t(g.experts)};
      } else {
        uint64_t rows = 0;
        for (int r = 0; r < world; ++r) rows += count(r, g.expert_major ? index : g.experts + index);
        if (g.expert_major)
          f = {kFaultExpertFull, ep_rank_of(index, g.local_experts), index, rows, uint64_t(g.rows_per_expert)};
        else
          f = {kFaultOutputTooSmall, index, -1, rows, uint64_t(g.rows)};
      }
      const EncodedFault e = encode_fault(f);
      device::record_failure_at(s, kStatusCapacity, e.peer, e.block, e.phase, e.peer_signature);
    }
    device::call_end(s, call);
    return;
  }

  // This rank's send bases, received counts, token count; then go.
  for (int b = threadIdx.x; b < g.bins; b += blockDim.x) {
    int32_t base = 0;
    for (int r = 0; r < me; ++r) base += int32_t(count(r, g.expert_major ? b : g.experts + b));
    sc.send_base[b] = base;
  }
  __shared__ int32_t received[kEpMaxExperts];
  for (int e = threadIdx.x; e < g.local_experts; e += blockDim.x) {
    int32_t rows = 0;
    for (int r = 0; r < world; ++r) rows += int32_t(count(r, me * g.local_experts + e));
    sc.expert_num_tokens[e] = rows;
    received[e] = rows;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t rows = 0;
    if (g.expert_major) {
      for (int e = 0; e < g.local_experts; ++e) rows += received[e];
    } else {
      for (int r = 0; r < world; ++r) rows += int32_t(count(r, g.experts + me));
    }
    *sc.num_rows = rows;
    *sc.num_tokens = tokens;
    *sc.go = 1;
  }
  // Invariant: every rank holds the same verdict; every line addressed to this rank was read and cleared.
  device::call_end(s, call);
}

}  // namespace

void launch_moe_dispatch_count(const MoeDispatchArgs& args, cudaStream_t stream) {
  launch_kernel(moe_dispatch_count, 1, kThreadsPerBlock, 0, stream, args);
}

}  // namespace symmem::detail
