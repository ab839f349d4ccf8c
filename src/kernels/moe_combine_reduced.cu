// MoE combine of the expert-major layout, reduced on the experts' side (plan/moe_combine_path.hpp):
// where a token has several routes on one rank, that rank sums them and sends one row, instead of
// every route's row crossing NVLink.
//
//   entry     block b writes the weights its peers' blocks b will read (this call's: the combine's,
//             the dispatch's, or 1 when applied before the experts) into its combine heap buffer,
//             then exchanges the entry line with block b of every peer (kernels/moe_combine_lines.cuh):
//             every peer's expert outputs and weights are written, and its dispatch fit.
//   partials  for every rank q and each of q's tokens in block b's units, a warp reads the token's
//             routes and weights from q's buffer, sums the rows of this rank's experts among them in
//             top-k order (float32, fmaf(w, x, acc) from 0) and stores that partial row, rounded to
//             bfloat16, into q's partial area, at [this rank][token]; a token with no route here
//             sends nothing.
//   lines     block b releases its partials and exchanges the second line with block b of every
//             peer: every partial of this rank's tokens in block b's units has arrived.
//   sum       a warp per unit of this rank's tokens adds, in rank order from 0, the partials of the
//             ranks its routes reach (float32), rounds to bfloat16 and writes the output.
//
// Units. A rank's n tokens are cut into units (token, chunk of 256-column segments), u = t * chunks
// + chunk, unit u on block u % blocks, chunks from n alone: block b of every rank takes the same
// units of rank q's tokens, in both phases, so block b's two line exchanges order everything it reads.
// Result: the same bits on every run and rank; each rank's partial is rounded to bfloat16 as the
// rank-major layout's expert outputs are (and vLLM's reduce-scatter inputs), so it differs from the
// pull's (one float32 sum in top-k order, rounded once) by that rounding. Float32 partials would
// cross NVLink at twice the bytes (tried: no faster than vLLM's path at decode-128).
//
// Reuse. Nothing reads a peer's memory after the block's second line: a rank's next writes to
// what its peers read (its routes: the next dispatch; its weights: the next combine's entry) and
// a peer's next writes into its partial area (the next combine, after this rank's entry line) all
// come after this kernel has ended on it, and it ends only once every peer's block has posted its
// second line, after its reads. No exit guard is needed.
// Counted low-latency call: every block reaches call_end. Failure records name phase 0 (entry) or
// 1 (partials).
#include "device/call_counter.cuh"
#include "device/dependent_launch.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"
#include "kernels/moe_args.hpp"
#include "kernels/moe_combine_lines.cuh"

namespace symmem::detail {
namespace {

using namespace combine_lines;

constexpr int kColumnsPerSegment = 256;  // 32 lanes x 8 columns
constexpr uint32_t kFullWarp = 0xFFFFFFFFu;

// The units of a rank with n tokens (file comment): chunks per token enough to keep the grid's
// warps busy at small n, never an empty chunk.
struct Units {
  int segments_per_chunk;
  int chunks;
  int64_t count;
};
__device__ __forceinline__ Units units_of(int n, int segments, int grid_warps) {
  const int wanted = max(1, min(segments, grid_warps / max(n, 1)));
  Units u;
  u.segments_per_chunk = (segments + wanted - 1) / wanted;
  u.chunks = (segments + u.segments_per_chunk - 1) / u.segments_per_chunk;
  u.count = int64_t(n) * u.chunks;
  return u;
}

// Units of block b among `count`: b, b + G, ...
__device__ __forceinline__ int64_t block_units(int64_t count) {
  return count > blockIdx.x ? (count - 1 - blockIdx.x) / gridDim.x + 1 : 0;
}

// Rank q's tokens this call: this rank's own count, or q's from the dispatch's count exchange
// (`go` says every count fit, so the exchanged one is exact).
__device__ __forceinline__ int tokens_of(const MoeCombineArgs& a, int q) {
  const EpGeometry& g = a.g;
  if (q == a.sync.rank) return *a.scratch.num_tokens;
  return ep_call_tokens(int(min(a.scratch.counts[size_t(q) * g.header_words + g.header_tokens_word()],
                                uint32_t(g.max_tokens))),
                        g.max_tokens);
}

__device__ __forceinline__ const char* heap_of(const MoeCombineArgs& a, int q) {
  return q == a.sync.rank ? a.buffers.combine : a.buffers.combine_peers[q & (kMaxWorld - 1)];
}

// One warp: the float32 sum, in source order, of n bfloat16 rows (source i: the row at lane i's
// `row`, times lane i's `weight`) over segments [first, first + count) of them, rounded to
// bfloat16 once and stored at `to` (the same columns). SEGS segments a turn, R sources a group
// (groups in order): every load of a group is issued before any is added, SEGS x R 16-byte loads
// a lane in flight. A token's routes on one rank (or ranks holding its routes) are about K / W
// (W): two segments of four rows keeps 8 in flight at top-8 of 2 ranks. (One variant per n, with
// more segments for fewer rows, took 226 registers in one kernel: ptxas keeps all three live.)
constexpr int kSegmentsATurn = 2, kRowsATurn = 4;
template <int SEGS, int R>
__device__ void sum_rows(const char* row, float weight, int n, int hidden, int first, int count, char* to, int lane) {
  for (int s0 = first; s0 < first + count; s0 += SEGS) {
    float acc[SEGS][8];
#pragma unroll
    for (int s = 0; s < SEGS; ++s)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[s][i] = 0.f;
    for (int g0 = 0; g0 < n; g0 += R) {
      uint4 v[SEGS][R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const char* from = reinterpret_cast<const char*>(
            __shfl_sync(kFullWarp, reinterpret_cast<unsigned long long>(row), (g0 + r) & 31));
#pragma unroll
        for (int s = 0; s < SEGS; ++s) {
          const int column = (s0 + s) * kColumnsPerSegment + lane * 8;
          if (g0 + r < n && s0 + s < first + count && column < hidden)
            v[s][r] = *reinterpret_cast<const uint4*>(from + size_t(column) * 2);
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float w = __shfl_sync(kFullWarp, weight, (g0 + r) & 31);
#pragma unroll
        for (int s = 0; s < SEGS; ++s) {
          const int column = (s0 + s) * kColumnsPerSegment + lane * 8;
          if (g0 + r < n && s0 + s < first + count && column < hidden) add_scaled(acc[s], v[s][r], w);
        }
      }
    }
#pragma unroll
    for (int s = 0; s < SEGS; ++s) {
      const int column = (s0 + s) * kColumnsPerSegment + lane * 8;
      if (s0 + s < first + count && column < hidden)
        *reinterpret_cast<uint4*>(to + size_t(column) * 2) = to_bf16x8(acc[s]);
    }
  }
}

// Lane i (i < popc(mask)): the index of the mask's i-th set bit, lowest first; else -1.
__device__ __forceinline__ int nth_set_bit(uint32_t mask, int lane) {
  const unsigned bit = __fns(mask, 0, lane + 1);
  return bit == 0xFFFFFFFFu ? -1 : int(bit);
}

// One warp: the partial of this rank's experts for token t of rank q (its routes here in top-k
// order), segments [first, first + count), stored into q's partial area.
__device__ void push_partial(const MoeCombineArgs& a, int q, int t, int first, int count, int lane) {
  const EpGeometry& g = a.g;
  const int me = a.sync.rank, K = g.topk;
  const char* heap_q = heap_of(a, q);
  // Lane k: entry k of the token's routes at q.
  int rank = -1, row = 0;
  float weight = 0.f;
  if (lane < K) {
    const size_t i = size_t(t) * K + lane;
    rank = reinterpret_cast<const int32_t*>(heap_q + g.route_rank_offset)[i];
    row = reinterpret_cast<const int32_t*>(heap_q + g.route_row_offset)[i];
    weight = reinterpret_cast<const float*>(heap_q + g.combine_weights_offset)[i];
  }
  const uint32_t here = __ballot_sync(kFullWarp, lane < K && rank == me);
  if (here == 0) return;  // no route of the token on this rank: q does not read this partial
  // Lane i: the i-th route here (top-k order kept).
  const int k = nth_set_bit(here, lane);
  row = __shfl_sync(kFullWarp, row, k & 31);
  weight = __shfl_sync(kFullWarp, weight, k & 31);
  const char* source = a.buffers.combine + size_t(row) * g.hidden * 2;
  char* to = const_cast<char*>(heap_q) + g.partials_offset + (size_t(me) * g.max_tokens + t) * g.hidden * 2;
  sum_rows<kSegmentsATurn, kRowsATurn>(source, weight, __popc(here), g.hidden, first, count, to, lane);
}

// One warp: this rank's output for token t, segments [first, first + count): the partials of the
// ranks its routes reach, added in rank order.
__device__ void sum_partials(const MoeCombineArgs& a, int t, int first, int count, int lane) {
  const EpGeometry& g = a.g;
  const int32_t rank = lane < g.topk ? a.scratch.route_rank[size_t(t) * g.topk + lane] : -1;
  const uint32_t ranks = __reduce_or_sync(kFullWarp, rank >= 0 ? 1u << rank : 0u);
  const int r = nth_set_bit(ranks, lane);  // lane i: the i-th rank, lowest first
  const char* source =
      a.buffers.combine + g.partials_offset + (size_t(r < 0 ? 0 : r) * g.max_tokens + t) * g.hidden * 2;
  char* to = static_cast<char*>(a.out) + size_t(t) * g.hidden * 2;
  sum_rows<kSegmentsATurn, kRowsATurn>(source, 1.f, __popc(ranks), g.hidden, first, count, to, lane);
}

// Before the entry line: the weights of this rank's tokens in block b's units, where the peers'
// blocks b read them.
__device__ void publish_weights(const MoeCombineArgs& a, const Units& mine) {
  const EpGeometry& g = a.g;
  const float* weights = a.weights ? a.weights : a.scratch.weights;
  float* to = reinterpret_cast<float*>(a.buffers.combine + g.combine_weights_offset);
  const int64_t units = block_units(mine.count);
  for (int64_t i = threadIdx.x; i < units * g.topk; i += blockDim.x) {
    const int64_t u = blockIdx.x + (i / g.topk) * gridDim.x;
    const size_t e = size_t(u / mine.chunks) * g.topk + i % g.topk;
    to[e] = a.weights_applied ? 1.f : weights[e];
  }
}

__global__ void __launch_bounds__(kThreadsPerBlock) moe_combine_reduced(MoeCombineArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const EpGeometry& g = a.g;
  const uint32_t call = device::call_begin(s);
  const int segments = (g.hidden + kColumnsPerSegment - 1) / kColumnsPerSegment;
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int grid_warps = gridDim.x * warps;
  const Units mine = units_of(*a.scratch.num_tokens, segments, grid_warps);
  publish_weights(a, mine);
  __syncthreads();  // every thread's weights before thread 0's release in the entry
  if (!enter_combine(a, call)) {
    device::call_end(s, call);
    return;
  }
  // Partials: block b's units of every rank's tokens, the next rank first (the block's items,
  // rank after rank, dealt to its warps in turn).
  int64_t item = 0;
  for (int i = 1; i <= s.world; ++i) {
    const int q = (s.rank + i) % s.world;
    const Units theirs = units_of(tokens_of(a, q), segments, grid_warps);
    const int64_t count = block_units(theirs.count);
    for (int64_t j = ((warp - item) % warps + warps) % warps; j < count; j += warps) {
      const int64_t u = blockIdx.x + j * gridDim.x;
      const int c = int(u % theirs.chunks);
      push_partial(a, q, int(u / theirs.chunks), c * theirs.segments_per_chunk, theirs.segments_per_chunk, lane);
    }
    item += count;
  }
  __shared__ int arrived;
  __syncthreads();  // every warp's partials stored
  if (threadIdx.x == 0) {
    device::fence_acq_rel_sys();  // release: the partials before the lines
    post_lines(a, call, kSecondPhase);
    arrived = collect_lines(a, call, kSecondPhase);
    device::fence_acq_rel_sys();  // acquire: the peers' partials
  }
  __syncthreads();
  if (arrived) {
    const int64_t count = block_units(mine.count);
    for (int64_t j = warp; j < count; j += warps) {
      const int64_t u = blockIdx.x + j * gridDim.x;
      const int c = int(u % mine.chunks);
      sum_partials(a, int(u / mine.chunks), c * mine.segments_per_chunk, mine.segments_per_chunk, lane);
    }
  }
  // Invariant: the same block of every peer has stored its partials of this rank's tokens in this
  // block's units, and read what it needed of this rank's routes and weights; the kernel's end,
  // every block.
  device::call_end(s, call);
}

}  // namespace

void launch_moe_combine_reduced(const MoeCombineArgs& args, int blocks, cudaStream_t stream) {
  launch_kernel(moe_combine_reduced, blocks, kThreadsPerBlock, 0, stream, args);
}

}  // namespace symmem::detail
