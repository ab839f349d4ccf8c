// MoE dispatch, second kernel (kernels/moe_args.hpp): a warp per (token, chunk of its row),
// grid-stride. The warp loads the experts of the token's tile (a token per lane), sums
// pairs_before over the lanes (the in-tile rank) for each of the token's destinations, adds the
// bases the count kernel left (plan/ep_layout.hpp's slot formula), keeps the routes for combine
// (chunk 0), and stores its chunk of the token's row into every destination with 16-byte vectors
// (NVLink), destination after destination (the chunk stays in L1 between them), or, for whole rows
// of 1 to 7 KiB, with bulk copies from shared memory (takes_bulk). Chunk 0 also stores the scales and, for
// kRankMajor, the ids and weights. Tokens are cut into as many chunks as keep every warp busy at small batches
// (decode). kRankMajor also marks this rank's unused rows with ids -1 (vLLM's experts see the whole area). One barrier
// at the end: when the kernel has finished on a rank, every block of every rank has stored its rows.
#include "device/dependent_launch.cuh"
#include "device/ptx.cuh"
#include "device/wait.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"
#include "kernels/moe_args.hpp"

namespace symmem::detail {
namespace {

constexpr int kDestinations = kEpMaxTopk > kMaxWorld ? kEpMaxTopk : kMaxWorld;

__device__ int64_t expert_at(const MoeDispatchArgs& a, int t, int k) {
  const size_t i = size_t(t) * a.g.topk + k;
  return a.topk_idx_int64 ? static_cast<const int64_t*>(a.topk_idx)[i]
                          : int64_t(static_cast<const int32_t*>(a.topk_idx)[i]);
}

// dst[v] = src[v] for v in [begin, end), lanes strided, kCopyUnroll loads in flight per lane.
constexpr int kCopyUnroll = 4;
__device__ void warp_copy(const uint4* src, uint4* dst, int begin, int end, int lane) {
  for (int base = begin + lane; base < end; base += 32 * kCopyUnroll) {
    uint4 v[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u)
      if (base + u * 32 < end) v[u] = src[base + u * 32];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u)
      if (base + u * 32 < end) dst[base + u * 32] = v[u];
  }
}

// The bulk path: two stages of a row a warp (one loads while the other is stored), mbarriers after.
constexpr int kPushWarps = kThreadsPerBlock / 32;
constexpr uint32_t kStageBytes = 7168;  // 16 warps x 2 stages: 224 KiB of the SM's 227
constexpr size_t kBulkSharedBytes = size_t(kPushWarps) * 2 * kStageBytes + size_t(kPushWarps) * 2 * sizeof(uint64_t);

// Chunks per token: enough warps busy at small batches, at least 32 vectors (512 B) per chunk.
__host__ __device__ inline int chunks_per_token(int warps, int tokens, int vectors) {
  return max(1, min(warps / max(tokens, 1), vectors / 32));
}

// Whole rows of 1 to 7 KiB go by bulk copies: a warp's lane 0 loads the next row into shared
// memory while the TMA engine writes the current one to every destination (the LSU path's
// per-thread 16-byte NVLink stores carry less per SM: fp8 prefill 208 -> 189 us on 2 x H200).
// Rows cut in chunks (decode) stay on registers (the bulk path measured no faster there), and so
// do rows under 1 KiB (never measured). The host decides with the call's token count (or, for a
// count on the device, the context's maximum, which the device clamps to); the device again.
__host__ __device__ inline bool takes_bulk(int warps, int tokens, int vectors) {
  return vectors >= 64 && vectors * 16 <= int(kStageBytes) && chunks_per_token(warps, tokens, vectors) == 1;
}

__device__ int warp_sum(int v) {
#pragma unroll
  for (int d = 16; d > 0; d /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, d);
  return v;
}

template <bool kMayBulk>
__global__ void __launch_bounds__(kThreadsPerBlock) moe_dispatch_push(MoeDispatchArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const EpGeometry& g = a.g;
  const EpScratch& sc = a.scratch;
  // Written by this call's count kernel, which completed before this one began.
  if (*sc.go == 0) return;  // the call does not fit (or the exchange failed): on every rank alike
  const uint32_t epoch = device::epoch_begin(s);
  const int tokens = *sc.num_tokens;
  const int lane = threadIdx.x % 32;
  const int warps = gridDim.x * (blockDim.x / 32);
  const int vectors = static_cast<int>(g.payload_bytes / 16);  // of a row
  const int chunks = chunks_per_token(warps, tokens, vectors);
  const bool bulk = kMayBulk && takes_bulk(warps, tokens, vectors);  // kMayBulk: the launch gave the stages
  const int chunk_vectors = (vectors + chunks - 1) / chunks;
  const int destinations = g.expert_major ? g.topk : s.world;
  const int64_t units = int64_t(tokens) * chunks;
  extern __shared__ __align__(128) unsigned char smem[];
  const int w = threadIdx.x / 32;
  unsigned char* stage = smem + size_t(w) * 2 * kStageBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + size_t(kPushWarps) * 2 * kStageBytes) + 2 * w;
  auto load_row = [&](int64_t t, int b) {  // bulk: unit t is token t's whole row
    device::mbarrier_arrive_expect_tx(&bars[b], uint32_t(g.payload_bytes));
    device::bulk_load_shared(stage + size_t(b) * kStageBytes,
                             static_cast<const char*>(a.x) + size_t(t) * g.payload_bytes, uint32_t(g.payload_bytes),
                             &bars[b]);
  };
  const int64_t first = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (bulk) {
    if (lane == 0) {
      device::mbarrier_init(&bars[0], 1);
      device::mbarrier_init(&bars[1], 1);
      device::fence_mbarrier_init();
      if (first < units) load_row(first, 0);
    }
    __syncwarp();
  }
  int iteration = 0;
  for (int64_t u = first; u < units; u += warps, ++iteration) {
    const int t = int(u / chunks), chunk = int(u % chunks);
    const int tile = t / kEpTileTokens, t_lane = t % kEpTileTokens;
    const int lane_token = tile * kEpTileTokens + lane;
    int32_t experts[kEpMaxTopk];
#pragma unroll
    for (int k = 0; k < kEpMaxTopk; ++k)
      experts[k] = k < g.topk && lane_token < tokens ? ep_kept_id(expert_at(a, lane_token, k), g.experts) : -1;
    const size_t bases = size_t(ep_warp_of_tile(tile, g.tiles_per_warp)) * g.bins;
    const size_t tile_bases = size_t(tile) * g.bins;
    // Every destination of the token: rank q[d] (-1: none) and row[d] there.
    int32_t q[kDestinations], row[kDestinations];
    const uint32_t tile_lanes_before = (1u << t_lane) - 1u;
#pragma unroll
    for (int d = 0; d < kDestinations; ++d) {
      q[d] = -1;
      row[d] = -1;
      if (d >= destinations) continue;
      if (g.expert_major) {
        const int32_t e = __shfl_sync(0xFFFFFFFFu, experts[d], t_lane);
        if (e < 0) continue;
        const int before = warp_sum(ep_pairs_before_expert(experts, g.topk, lane, t_lane, d, e));
        q[d] = ep_rank_of(e, g.local_experts);
        row[d] = int32_t(int64_t(e % g.local_experts) * g.rows_per_expert + sc.send_base[e] + sc.warp_base[bases + e] +
                         sc.tile_base[tile_bases + e] + before);
      } else {
        const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, ep_token_goes_to(experts, g.topk, g.local_experts, d));
        if (!(ballot >> t_lane & 1u)) continue;
        q[d] = d;
        row[d] = sc.send_base[d] + sc.warp_base[bases + d] + sc.tile_base[tile_bases + d] +
                 __popc(ballot & tile_lanes_before);
      }
    }
    if (chunk == 0 && lane == 0) {
#pragma unroll
      for (int d = 0; d < kDestinations; ++d) {
        if (d >= destinations) continue;
        const size_t i = size_t(t) * destinations + d;
        if (g.expert_major) {
          sc.route_rank[i] = q[d];
          sc.weights[i] = a.topk_weights[i];
        }
        sc.route_row[i] = row[d];
      }
    }
    // The token's own ids, lane k holding id k (kRankMajor's metadata).
    int32_t own = -1;
#pragma unroll
    for (int k = 0; k < kEpMaxTopk; ++k) {
      const int32_t v = __shfl_sync(0xFFFFFFFFu, experts[k], t_lane);
      if (lane == k) own = v;
    }
    const uint4* src = reinterpret_cast<const uint4*>(static_cast<const char*>(a.x) + size_t(t) * g.payload_bytes);
    const int begin = chunk * chunk_vectors, end = min(vectors, begin + chunk_vectors);
    if (bulk && lane == 0) {
      const int b = iteration & 1;
      if (u + warps < units) {
        // The other stage's row must be read out by its stores before the next row fills it.
        device::bulk_wait_group_read<0>();
        load_row(u + warps, b ^ 1);
      }
      // A local load always completes; this wait needs no deadline.
      while (!device::mbarrier_try_wait_parity(&bars[b], (iteration >> 1) & 1)) {
      }
#pragma unroll
      for (int d = 0; d < kDestinations; ++d) {
        if (q[d] < 0) continue;
        char* area = q[d] == s.rank ? a.buffers.dispatch : a.buffers.dispatch_peers[q[d] & (kMaxWorld - 1)];
        device::bulk_store_global(area + g.x_offset + size_t(row[d]) * g.payload_bytes, stage + size_t(b) * kStageBytes,
                                  uint32_t(g.payload_bytes));
      }
      device::bulk_commit_group();
    }
#pragma unroll
    for (int d = 0; d < kDestinations; ++d) {
      if (q[d] < 0) continue;
      char* area = q[d] == s.rank ? a.buffers.dispatch : a.buffers.dispatch_peers[q[d] & (kMaxWorld - 1)];
      // The chunk of the payload (the source stays in L1/L2 across destinations).
      uint4* dst = reinterpret_cast<uint4*>(area + g.x_offset + size_t(row[d]) * g.payload_bytes);
      if (!bulk) warp_copy(src, dst, begin, end, lane);
      if (chunk != 0) continue;
      if (g.fp8) {
        const size_t scales = g.scale_bytes / 4;
        const float* from = a.x_scales + size_t(t) * scales;
        float* to = reinterpret_cast<float*>(area + g.scales_offset) + size_t(row[d]) * scales;
        if (g.scale_bytes % 16 == 0 &&
            ((reinterpret_cast<uintptr_t>(from) | reinterpret_cast<uintptr_t>(to)) & 15) == 0) {
          // 16-byte stores: a quarter of the NVLink writes of per-float ones (fp8 prefill: 20 us of 200).
          for (size_t c = lane; c < scales / 4; c += 32)
            reinterpret_cast<uint4*>(to)[c] = reinterpret_cast<const uint4*>(from)[c];
        } else {
          for (size_t c = lane; c < scales; c += 32) to[c] = from[c];
        }
      }
      if (!g.expert_major && lane < g.topk) {
        const bool here = own >= 0 && ep_rank_of(own, g.local_experts) == q[d];
        reinterpret_cast<int32_t*>(area + g.topk_idx_offset)[size_t(row[d]) * g.topk + lane] =
            here ? own % g.local_experts : -1;
        reinterpret_cast<float*>(area + g.topk_weights_offset)[size_t(row[d]) * g.topk + lane] =
            a.topk_weights[size_t(t) * g.topk + lane];
      }
    }
  }
  if (bulk && lane == 0) {
    // Every bulk write performed, and ordered before the barrier's release (generic proxy).
    device::bulk_wait_all();
    device::fence_proxy_async_global();
  }
  if (!g.expert_major) {
    // Rows no token fills this call: ids -1, so that experts reading the whole area skip them.
    // (No peer writes them: they lie past every sender's rows.)
    const int64_t unused_from = int64_t(*sc.num_rows) * g.topk;
    int32_t* ids = reinterpret_cast<int32_t*>(a.buffers.dispatch + g.topk_idx_offset);
    for (int64_t i = unused_from + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < g.rows * int64_t(g.topk);
         i += int64_t(gridDim.x) * blockDim.x)
      ids[i] = -1;
  }
  if (!device::barrier(s, epoch, 0)) return;
  // Invariant: the same-index block of every rank stored its rows; the kernel's end, every block.
  device::epoch_commit(s, epoch);
}

}  // namespace

void launch_moe_dispatch_push(const MoeDispatchArgs& args, int blocks, cudaStream_t stream) {
  // The stages only for a call that takes the bulk path: they leave the SM almost no L1, which
  // the register path's rows use between destinations (bf16 prefill: 260 -> 276 us when given).
  const int warps = blocks * (kThreadsPerBlock / 32);
  const int vectors = static_cast<int>(args.g.payload_bytes / 16);
  const int tokens = args.num_tokens_device ? args.g.max_tokens : ep_call_tokens(args.num_tokens, args.g.max_tokens);
  if (takes_bulk(warps, tokens, vectors)) {
    static DynamicSharedLimit limit;
    limit.raise(moe_dispatch_push<true>, kBulkSharedBytes);
    launch_kernel(moe_dispatch_push<true>, blocks, kThreadsPerBlock, kBulkSharedBytes, stream, args);
  } else {
    launch_kernel(moe_dispatch_push<false>, blocks, kThreadsPerBlock, 0, stream, args);
  }
}

}  // namespace symmem::detail
