// MoE combine of the expert-major layout, reduced on the experts' side (plan/moe_combine_path.hpp):
// where a token has several routes on one rank, that rank sums them and sends one row, instead of
// every route's row crossing NVLink. One exchange of lines per block at its end, no entry barrier,
// and nothing of a peer is read: a rank reads only its own memory, and writes into its peers' lines and partials.
//
//   routes    block b posts its presence line (word blockIdx.x: a peer in another call sees this
//             call's signature there, and this rank sees the peer's in word 0) and sends, for each
//             of its units of this rank's tokens, the token's routes as low-latency lines to every
//             peer (2K lines a unit: the row of route k at that peer, or -1 elsewhere, then its
//             weight: this call's, the dispatch's, or 1 when applied before the experts), into
//             this rank's slot of the peer's area after the blocks' words.
//   partials  for every rank q (the next first, this rank last) and each of q's tokens in block b's
//             units, a warp takes the unit's route lines (q's from this rank's area; this rank's
//             own from its scratch), sums the rows of this rank's experts among them in top-k order
//             (float32, fmaf(w, x, acc) from 0) and stores that partial, rounded to bfloat16, into
//             q's partial area (the half of the call's parity), at [this rank][token]; a token with
//             no route here sends nothing.
//   line      block b releases its partials and exchanges one line with block b of every peer
//             (kernels/moe_combine_lines.cuh, word kMaxBlocks + blockIdx.x), and takes their
//             presence lines: every partial of this rank's tokens in block b's units has arrived.
//   sum       a warp per unit of this rank's tokens adds, in rank order from 0, the partials of the
//             ranks its routes reach (float32), rounds to bfloat16 and writes the output.
//
// Units. A rank's n tokens are cut into units (token, chunk of 256-column segments), u = t * chunks
// + chunk, unit u on block u % blocks, chunks from n alone: block b of every rank takes the same
// units of rank q's tokens in every phase, so block b's line orders everything it reads.
// Result: the same bits on every run and rank; each rank's partial is rounded to bfloat16 as the
// rank-major layout's expert outputs are (and vLLM's reduce-scatter inputs), so it differs from the
// pull's (one float32 sum in top-k order, rounded once) by that rounding.
//
// Reuse, without an entry barrier or exit guard. The routes' lines are taken and cleared in their
// call (device/low_latency.cuh). A peer writes this rank's partial half of call n again in call n + 2;
// it starts that call only after its call n + 1 ended, which took this rank's lines of call n + 1,
// which this rank posts only after its call n (and its sums of that half) ended. The rows and
// routes a rank sums from are its own: the caller's next expert outputs, or the next dispatch,
// come after this kernel on its stream.
// Counted low-latency call: every block reaches call_end, and receives from every peer. Failure
// records name phase 0 (a route line, or a peer's presence line) or 1 (its delivery line).
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

__device__ __forceinline__ char* heap_of(const MoeCombineArgs& a, int q) {
  return q == a.sync.rank ? a.buffers.combine : a.buffers.combine_peers[q & (kMaxWorld - 1)];
}

// Rank q's partial area of this call (the half of its parity), the row rank `from` sums for token t.
__device__ __forceinline__ char* partial_row(const MoeCombineArgs& a, uint32_t call, int q, int from, int t) {
  const EpGeometry& g = a.g;
  const size_t row = (size_t(call & 1u) * g.world + from) * g.max_tokens + t;
  return heap_of(a, q) + g.partials_offset + row * g.hidden * 2;
}

// The first of unit u's route lines in a sender's slot: after the blocks' presence and delivery
// lines (plan/moe_combine_path.hpp bounds the slot's use).
__device__ __forceinline__ size_t route_word(const EpGeometry& g, int64_t u) {
  return 2 * size_t(kMaxBlocks) + size_t(u) * 2 * g.topk;
}

// The weight of this rank's pair (t, k) in this call.
__device__ __forceinline__ float weight_of(const MoeCombineArgs& a, size_t pair) {
  if (a.weights_applied) return 1.f;
  return a.weights ? a.weights[pair] : a.scratch.weights[pair];
}

// Lane l of a unit's 2K route lines as seen by rank `at`: l < K, route l's row there, or -1 where
// the route lies elsewhere; l = K + k, route k's weight. One encoding for the lines sent to a peer
// and for this rank's own units.
__device__ __forceinline__ uint32_t route_line_word(int lane, int K, int32_t rank, int32_t row, float weight, int at) {
  return lane >= K ? __float_as_uint(weight) : rank == at ? uint32_t(row) : 0xFFFFFFFFu;
}

// One warp: the float32 sum, in source order, of n bfloat16 rows (source i: the row at lane i's
// `row`, times lane i's `weight`) over segments [first, first + count) of them, rounded to
// bfloat16 once and stored at `to` (the same columns). SEGS segments a turn, R sources a group
// (groups in order): every load of a group is issued before any is added, SEGS x R 16-byte loads
// a lane in flight, ceil(count / SEGS) x ceil(n / R) round trips. Four segments of two rows: at
// DeepSeek-V3 decode-128 on 2 ranks a unit is 7 segments at 32 blocks and 4 at 64, where this
// shape never takes more round trips than two of four and fewer for 1, 2, 5 or 6 rows (measured,
// docs/moe.md); on units of 1, 2, 5, 6, 9 or 10 segments two of four takes fewer for some rows
// (slower there at 40 and 132 blocks, level at 24 and 48). A shape chosen per sum was tried and not kept (one
// function for both shapes shuffles more per group; two functions made the kernel spill). Not
// inlined: its own registers keep the kernel from spilling.
constexpr int kSegmentsATurn = 4, kRowsATurn = 2;
template <int SEGS, int R>
__device__ __noinline__ void sum_rows(const char* row, float weight, int n, int hidden, int first, int count, char* to,
                                      int lane) {
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

// One warp: the route lines of this rank's unit u (token t) into every peer's area.
__device__ void send_routes(const MoeCombineArgs& a, uint32_t call, int64_t u, int t, int lane) {
  const EpGeometry& g = a.g;
  const SyncArgs& s = a.sync;
  const int K = g.topk;
  if (lane >= 2 * K) return;
  const size_t pair = size_t(t) * K + (lane < K ? lane : lane - K);
  const int32_t rank = a.scratch.route_rank[pair], row = a.scratch.route_row[pair];
  const float weight = weight_of(a, pair);
  const uint64_t tag = uint64_t(s.signature) << 32;
  for (int i = 1; i < s.world; ++i) {
    const int peer = (s.rank + i) % s.world;
    device::st_relaxed_sys_u64(
        device::low_latency_slot(a.lines.peers[peer], call, s.rank, a.lines.slot_words) + route_word(g, u) + lane,
        tag | route_line_word(lane, K, rank, row, weight, peer));
  }
}

// One warp: the partial of this rank's experts for token t of rank q (unit u; its routes here in
// top-k order), segments [first, first + count), stored into q's partial area. False when q's
// route lines did not come (timeout, mismatch or abort, recorded).
__device__ bool push_partial(const MoeCombineArgs& a, uint32_t call, int q, int64_t u, int t, int first, int count,
                             int lane) {
  const EpGeometry& g = a.g;
  const SyncArgs& s = a.sync;
  const int me = s.rank, K = g.topk;
  // Lane k < K: route k's row here (or -1); lane K + k: its weight.
  uint32_t word = 0;
  bool ok = true;
  if (q == me) {
    if (lane < 2 * K) {
      const size_t pair = size_t(t) * K + (lane < K ? lane : lane - K);
      word = route_line_word(lane, K, a.scratch.route_rank[pair], a.scratch.route_row[pair], weight_of(a, pair), me);
    }
  } else if (lane < 2 * K) {
    // Word 0 of q's slot, watched while the line is empty, shows a peer in another call at once (a
    // dispatch's count header, another call's lines), as the pulls' entry line does.
    uint64_t* slot = device::low_latency_slot(a.lines.peers[me], call, q, a.lines.slot_words);
    uint64_t* line = slot + route_word(g, u) + lane;
    ok = device::read_line(s, line, q, kEntryPhase, &word, slot);
    if (ok) device::st_relaxed_sys_u64(line, 0);  // taken: empty again (device/low_latency.cuh)
  }
  if (!__all_sync(kFullWarp, ok)) return false;
  const uint32_t here = __ballot_sync(kFullWarp, lane < K && int(word) >= 0);
  if (here == 0) return true;  // no route of the token on this rank: q does not read this partial
  // Lane i: the i-th route here (top-k order kept).
  const int k = nth_set_bit(here, lane);
  const int row = int(__shfl_sync(kFullWarp, word, k & 31));
  const float weight = __uint_as_float(__shfl_sync(kFullWarp, word, (K + k) & 31));
  const char* source = a.buffers.combine + size_t(row < 0 ? 0 : row) * g.hidden * 2;
  sum_rows<kSegmentsATurn, kRowsATurn>(source, weight, __popc(here), g.hidden, first, count,
                                       partial_row(a, call, q, me, t), lane);
  return true;
}

// One warp: this rank's output for token t, segments [first, first + count): the partials of the
// ranks its routes reach, added in rank order.
__device__ void sum_partials(const MoeCombineArgs& a, uint32_t call, int t, int first, int count, int lane) {
  const EpGeometry& g = a.g;
  const int32_t rank = lane < g.topk ? a.scratch.route_rank[size_t(t) * g.topk + lane] : -1;
  const uint32_t ranks = __reduce_or_sync(kFullWarp, rank >= 0 ? 1u << rank : 0u);
  const int r = nth_set_bit(ranks, lane);  // lane i: the i-th rank, lowest first
  const char* source = partial_row(a, call, a.sync.rank, r < 0 ? 0 : r, t);
  char* to = static_cast<char*>(a.out) + size_t(t) * g.hidden * 2;
  sum_rows<kSegmentsATurn, kRowsATurn>(source, 1.f, __popc(ranks), g.hidden, first, count, to, lane);
}

__global__ void __launch_bounds__(kThreadsPerBlock) moe_combine_reduced(MoeCombineArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const EpGeometry& g = a.g;
  const uint32_t call = device::call_begin(s);
  const int segments = (g.hidden + kColumnsPerSegment - 1) / kColumnsPerSegment;
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int grid_warps = gridDim.x * warps;
  // The dispatch's `go` (the same on every rank): a dispatch that did not fit left the
  // communicator failed, with nothing to sum; the line is still exchanged (a peer in another call
  // shows its signature there).
  const bool go = *a.scratch.go != 0;
  const Units mine = units_of(go ? *a.scratch.num_tokens : 0, segments, grid_warps);
  const int64_t my_units = block_units(mine.count);
  for (int64_t j = warp; j < my_units; j += warps) {
    const int64_t u = blockIdx.x + j * gridDim.x;
    send_routes(a, call, u, int(u / mine.chunks), lane);
  }
  if (threadIdx.x == 0) post_lines(a, call, kEntryPhase);  // presence, before any wait
  // Partials: block b's units of every rank's tokens, the next rank first, this rank's own last
  // (the block's items, rank after rank, dealt to its warps in turn).
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  int64_t item = 0;
  bool ok = true;  // this warp's route lines all came
  for (int i = 1; i <= s.world && ok; ++i) {
    const int q = (s.rank + i) % s.world;
    const Units theirs = q == s.rank ? mine : units_of(go ? tokens_of(a, q) : 0, segments, grid_warps);
    const int64_t count = block_units(theirs.count);
    for (int64_t j = ((warp - item) % warps + warps) % warps; j < count && ok; j += warps) {
      const int64_t u = blockIdx.x + j * gridDim.x;
      const int c = int(u % theirs.chunks);
      ok = push_partial(a, call, q, u, int(u / theirs.chunks), c * theirs.segments_per_chunk,
                        theirs.segments_per_chunk, lane);
    }
    item += count;
  }
  if (!ok && lane == 0) failed = 1;
  __shared__ int arrived;
  __syncthreads();  // every warp's partials stored
  if (threadIdx.x == 0) {
    arrived = 0;
    if (!failed) {
      device::fence_acq_rel_sys();  // release: the partials before the line
      post_lines(a, call, kSecondPhase);
      arrived = collect_lines(a, call, kEntryPhase) && collect_lines(a, call, kSecondPhase);
      device::fence_acq_rel_sys();  // acquire: the peers' partials
    }
  }
  __syncthreads();
  if (arrived) {
    for (int64_t j = warp; j < my_units; j += warps) {
      const int64_t u = blockIdx.x + j * gridDim.x;
      const int c = int(u % mine.chunks);
      sum_partials(a, call, int(u / mine.chunks), c * mine.segments_per_chunk, mine.segments_per_chunk, lane);
    }
  }
  // Invariant: block b of every peer has stored its partials of this rank's tokens in this block's
  // units and taken this block's route lines; the kernel's end, every block.
  device::call_end(s, call);
}

}  // namespace

void launch_moe_combine_reduced(const MoeCombineArgs& args, int blocks, cudaStream_t stream) {
  launch_kernel(moe_combine_reduced, blocks, kThreadsPerBlock, 0, stream, args);
}

}  // namespace symmem::detail
