// MoE combine (kernels/moe_args.hpp): an entry exchange of one low-latency line per block with
// the same block of every peer, then a pull of every token's rows from the peers' combine areas,
// summed in float32 in a fixed order (top-k order for kExpertMajor, with the weights unless they
// were applied before the experts; rank order for kRankMajor), rounded to bfloat16 once, written
// locally. The order and the arithmetic depend on nothing but the token's routes, so the result is
// the same on every run and on every rank. A warp handles units of 256 columns of one token (8 per
// lane, one 16-byte vector per source row), several units a turn (kLoadsInFlight vectors a lane),
// with every source row's vector of them loaded before any is added.
// Exit guard: a block ends only once the same block of every peer has finished reading this rank's
// combine area, so the kernel's end means every peer has: whatever the stream runs next (the next
// combine's staging copy, the caller's next expert outputs) may overwrite it. Each block posts its
// "done reading" line as soon as its last loads of peer memory have returned, and waits for the
// peers' lines only at its very end, so the round trip overlaps its last sums and stores.
// Counted low-latency call: every block reaches call_end. Failure records name phase 0 (entry) or
// 1 (exit).
//
// The staging kernel copies the valid rows of expert outputs held elsewhere into this rank's
// combine area first (local), on the same stream: the entry lines of combine follow it.
#include "device/call_counter.cuh"
#include "device/dependent_launch.cuh"
#include "device/low_latency.cuh"
#include "device/ptx.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"
#include "kernels/moe_args.hpp"
#include "kernels/moe_combine_lines.cuh"

namespace symmem::detail {
namespace {

using namespace combine_lines;

constexpr int kSources = kEpMaxTopk > kMaxWorld ? kEpMaxTopk : kMaxWorld;
constexpr int kColumnsPerWarp = 256;  // 32 lanes x 8 bfloat16
constexpr int kStageUnroll = 4;

// Source rows of 16 bytes a lane loads a turn, for a kernel of S sources: kLoadsInFlight / S units
// (fewer loads when a call has fewer sources than S). What hides NVLink's latency from a small SM
// budget: one unit of a world-2 rank-major combine, two loads, held 24 blocks to 195 GB/s on 2 x H200.
constexpr int kLoadsInFlight = 8;

// Token t's row from its source i (kExpertMajor: top-k entry i; kRankMajor: rank i), at `column`,
// in the combine area that holds it, and the weight it is summed with; false when the token has no
// row there. Both pulls read the routes through this.
__device__ __forceinline__ bool source_row(const MoeCombineArgs& a, int t, int i, int sources, size_t column,
                                           const float* weights, const char** row, float* weight) {
  const EpScratch& sc = a.scratch;
  const size_t r = size_t(t) * sources + i;
  const int q = a.g.expert_major ? sc.route_rank[r] : (sc.route_row[r] >= 0 ? i : -1);
  if (q < 0) return false;
  const char* area = q == a.sync.rank ? a.buffers.combine : a.buffers.combine_peers[q & (kMaxWorld - 1)];
  *row = area + (size_t(sc.route_row[r]) * a.g.hidden + column) * 2;
  *weight = a.g.expert_major && !a.weights_applied ? weights[r] : 1.f;
  return true;
}

// The sum of kUnits units (token, 256 columns) per warp turn, S sources each (S >= the call's
// sources): every unit's rows are loaded before any is added. Same order, same arithmetic as one
// unit at a time.
template <int S>
__device__ void sum_units(const MoeCombineArgs& a, int64_t first, int64_t step, int64_t units, int segments,
                          int sources, const float* weights, int lane) {
  constexpr int kUnits = S < kLoadsInFlight ? kLoadsInFlight / S : 1;
  const EpGeometry& g = a.g;
  for (int64_t u0 = first; u0 < units; u0 += step * kUnits) {
    uint4 v[kUnits][S];
    float w[kUnits][S];
    uint32_t routed[kUnits];
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      routed[k] = 0;
      const int64_t u = u0 + k * step;
      const int t = int(u / segments);
      const int column = int(u % segments) * kColumnsPerWarp + lane * 8;
      const bool live = u < units && column < g.hidden;
#pragma unroll
      for (int i = 0; i < S; ++i) {
        w[k][i] = 0.f;
        const char* row;
        if (!live || i >= sources || !source_row(a, t, i, sources, column, weights, &row, &w[k][i])) continue;
        v[k][i] = *reinterpret_cast<const uint4*>(row);
        routed[k] |= 1u << i;
      }
    }
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      const int64_t u = u0 + k * step;
      const int t = int(u / segments);
      const int column = int(u % segments) * kColumnsPerWarp + lane * 8;
      if (u >= units || column >= g.hidden) continue;
      float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int i = 0; i < S; ++i)
        if (routed[k] & (1u << i)) add_scaled(acc, v[k][i], w[k][i]);
      *reinterpret_cast<uint4*>(static_cast<char*>(a.out) + (size_t(t) * g.hidden + column) * 2) = to_bf16x8(acc);
    }
  }
}

// The exit guard (file comment). SYMMEM_MUTANT_NO_COMBINE_EXIT_GUARD, set only by a test's mutant
// build (CMake option of the same name, tests/gpu/shared_gpu_mutants.sh), removes it: the
// back-to-back combine cases must then fail.
#ifdef SYMMEM_MUTANT_NO_COMBINE_EXIT_GUARD
constexpr bool kExitGuard = false;
#else
constexpr bool kExitGuard = true;
#endif

// Exit, one thread. "Done reading": no fence before the lines, since the loads they answer for have
// returned their values (summed, or landed in shared memory) and no later store can change what a
// returned load read; nothing else is published. The wait: the same block of every peer is done
// with this rank's combine area (a failed wait is recorded; the block ends as usual).
__device__ __forceinline__ void post_done_reading(const MoeCombineArgs& a, uint32_t call) {
  if (kExitGuard) post_lines(a, call, kSecondPhase);
}
__device__ __forceinline__ void wait_peers_done_reading(const MoeCombineArgs& a, uint32_t call) {
  if (kExitGuard) (void)collect_lines(a, call, kSecondPhase);
}

// S: the sources a token sums at most (a register budget; the call's own count is read below).
template <int S>
__global__ void __launch_bounds__(kThreadsPerBlock) moe_combine(MoeCombineArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const EpGeometry& g = a.g;
  const EpScratch& sc = a.scratch;
  const uint32_t call = device::call_begin(s);
  if (!enter_combine(a, call)) {
    device::call_end(s, call);
    return;
  }
  const int tokens = *sc.num_tokens;
  const int segments = g.hidden / kColumnsPerWarp + (g.hidden % kColumnsPerWarp ? 1 : 0);
  const int sources = g.expert_major ? g.topk : s.world;
  const float* weights = a.weights ? a.weights : sc.weights;
  const int lane = threadIdx.x % 32;
  const int64_t first = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const int64_t step = gridDim.x * (blockDim.x / 32);
  const int64_t units = int64_t(tokens) * segments;
  sum_units<S>(a, first, step, units, segments, sources, weights, lane);
  __syncthreads();  // every warp's loads have returned: they were summed
  if (threadIdx.x == 0) {
    post_done_reading(a, call);
    wait_peers_done_reading(a, call);
  }
  // Invariant: the same block of every peer finished reading this rank's combine area; the
  // kernel's end, every block.
  device::call_end(s, call);
}

// The bulk path: warp 0 streams every source row of a unit (token, chunk of columns) into shared
// memory with bulk copies (the TMA engine keeps kBulkStages units in flight, so a few SMs fill
// NVLink without a load per lane per 16 bytes), with the unit's routes and weights beside them; the
// other warps sum each unit from shared memory as it lands and release its stage: same order, same
// arithmetic as sum_units. Warp 0 runs ahead of the sums by up to kBulkStages units.
constexpr int kBulkStages = 6;
constexpr uint32_t kBulkStageBytes = 32 << 10;  // a unit: every source's chunk

// What warp 0 read of a unit's routes, for the summing warps.
struct BulkUnit {
  uint32_t routed;  // bit i: source i holds a row of the token
  float weight[kSources];
};

constexpr size_t kBulkBarriersOffset = size_t(kBulkStages) * kBulkStageBytes;
constexpr size_t kBulkUnitsOffset = kBulkBarriersOffset + 2 * kBulkStages * sizeof(uint64_t);
constexpr size_t kBulkSharedBytes = kBulkUnitsOffset + kBulkStages * sizeof(BulkUnit);

// Columns of a unit's chunk: a whole row when every source's row fits a stage, else a multiple of
// kEpScaleColumns (hidden is one, plan/ep_geometry.cpp).
__host__ __device__ inline int bulk_chunk_columns(int hidden, int sources) {
  const int fit = int(kBulkStageBytes / (2u * uint32_t(sources))) / kEpScaleColumns * kEpScaleColumns;
  return hidden < fit ? hidden : fit;
}

__global__ void __launch_bounds__(kThreadsPerBlock) moe_combine_bulk(MoeCombineArgs a) {
  device::enter_kernel();
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBulkBarriersOffset);  // a unit landed
  uint64_t* empty = full + kBulkStages;                                      // a unit was summed
  BulkUnit* meta = reinterpret_cast<BulkUnit*>(smem + kBulkUnitsOffset);
  const SyncArgs& s = a.sync;
  const EpGeometry& g = a.g;
  const EpScratch& sc = a.scratch;
  const int summers = int(blockDim.x) - 32;
  const uint32_t call = device::call_begin(s);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kBulkStages; ++i) {
      device::mbarrier_init(&full[i], 1);
      device::mbarrier_init(&empty[i], uint32_t(summers));
    }
    device::fence_mbarrier_init();
  }
  if (!enter_combine(a, call)) {  // its __syncthreads also publishes the initialised barriers
    device::call_end(s, call);
    return;
  }
  const int tokens = *sc.num_tokens;
  const int sources = g.expert_major ? g.topk : s.world;
  const int columns = bulk_chunk_columns(g.hidden, sources);
  const uint32_t chunk_bytes = uint32_t(columns) * 2;  // a source's slice of a stage
  const int chunks = (g.hidden + columns - 1) / columns;
  const int64_t units = int64_t(tokens) * chunks;
  const int64_t mine = blockIdx.x < units ? (units - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  // Unit j of this block is unit blockIdx.x + j * gridDim.x: token u / chunks, chunk u % chunks.
  if (threadIdx.x == 0) {
    const float* weights = a.weights ? a.weights : sc.weights;
    device::fence_proxy_async_global();  // the acquired expert outputs, for the bulk copies' reads
    for (int64_t j = 0; j < mine; ++j) {
      const int stage = int(j % kBulkStages);
      // The summing warps released the stage's previous unit. Local progress: no deadline.
      if (j >= kBulkStages)
        while (!device::mbarrier_try_wait_parity(&empty[stage], uint32_t(j / kBulkStages - 1) & 1u)) {
        }
      const int64_t u = blockIdx.x + j * gridDim.x;
      const int t = int(u / chunks), c = int(u % chunks);
      const uint32_t bytes = uint32_t(min(columns, g.hidden - c * columns)) * 2;
      const char* from[kSources];
      BulkUnit unit{};
      uint32_t total = 0;
      for (int i = 0; i < sources; ++i) {
        if (!source_row(a, t, i, sources, size_t(c) * columns, weights, &from[i], &unit.weight[i])) continue;
        unit.routed |= 1u << i;
        total += bytes;
      }
      meta[stage] = unit;  // before the arrival below, which releases it
      device::mbarrier_arrive_expect_tx(&full[stage], total);  // 0 bytes: the phase completes now
      unsigned char* to = smem + size_t(stage) * kBulkStageBytes;
      for (int i = 0; i < sources; ++i)
        if (unit.routed & (1u << i)) device::bulk_load_shared(to + size_t(i) * chunk_bytes, from[i], bytes, &full[stage]);
    }
    // Done reading once the last unit of each stage has landed (earlier ones landed before their
    // stage was reused): posted while the summing warps still work on those units. No deadline,
    // as for the summing warps' waits below.
    for (int64_t j = mine > kBulkStages ? mine - kBulkStages : 0; kExitGuard && j < mine; ++j)
      while (!device::mbarrier_try_wait_parity(&full[j % kBulkStages], uint32_t(j / kBulkStages) & 1u)) {
      }
    post_done_reading(a, call);
  } else if (threadIdx.x >= 32) {
    for (int64_t j = 0; j < mine; ++j) {
      const int stage = int(j % kBulkStages);
      // A bulk copy of mapped memory always completes (a peer's allocation outlives its process
      // while mapped here): this wait needs no deadline.
      while (!device::mbarrier_try_wait_parity(&full[stage], uint32_t(j / kBulkStages) & 1u)) {
      }
      const int64_t u = blockIdx.x + j * gridDim.x;
      const int t = int(u / chunks), c = int(u % chunks);
      const int vectors = min(columns, g.hidden - c * columns) / 8;
      const unsigned char* from = smem + size_t(stage) * kBulkStageBytes;
      const uint32_t routed = meta[stage].routed;
      char* out = static_cast<char*>(a.out) + (size_t(t) * g.hidden + size_t(c) * columns) * 2;
      for (int v = int(threadIdx.x) - 32; v < vectors; v += summers) {
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int i = 0; i < sources; ++i)
          if (routed & (1u << i))
            add_scaled(acc, reinterpret_cast<const uint4*>(from + size_t(i) * chunk_bytes)[v], meta[stage].weight[i]);
        reinterpret_cast<uint4*>(out)[v] = to_bf16x8(acc);
      }
      device::mbarrier_arrive(&empty[stage]);  // this thread's reads of the stage are done
    }
  }
  if (threadIdx.x == 0) wait_peers_done_reading(a, call);  // beside the summing warps' last units
  // Invariant: the same block of every peer finished reading this rank's combine area; the
  // kernel's end, every block.
  device::call_end(s, call);
}

__global__ void __launch_bounds__(kThreadsPerBlock) moe_combine_stage(MoeStageArgs a) {
  device::enter_kernel();
  const EpGeometry& g = a.g;
  const int64_t vectors = g.hidden * 2 / 16;  // of a row
  // Valid rows: kExpertMajor, rows [0, expert_num_tokens[e]) of each local expert (a group);
  // kRankMajor, rows [0, num_rows) of one group. Blocks share the groups, several per group when
  // there are fewer groups than blocks.
  const int groups = g.expert_major ? g.local_experts : 1;
  const int64_t group_rows = g.expert_major ? g.rows_per_expert : g.rows;
  const int per_group = max(1, int(gridDim.x) / groups);
  const int part = blockIdx.x % per_group;
  for (int group = blockIdx.x / per_group; group < groups; group += max(1, int(gridDim.x) / per_group)) {
    const int64_t valid = g.expert_major ? a.scratch.expert_num_tokens[group] : *a.scratch.num_rows;
    const size_t first = size_t(group * group_rows) * vectors;
    // kStageUnroll vectors a thread in flight, loaded before any is stored.
    const int64_t stride = int64_t(per_group) * blockDim.x;
    const uint4* from = static_cast<const uint4*>(a.expert_out) + first;
    uint4* to = reinterpret_cast<uint4*>(a.combine) + first;
    for (int64_t i0 = part * int64_t(blockDim.x) + threadIdx.x; i0 < valid * vectors; i0 += stride * kStageUnroll) {
      uint4 v[kStageUnroll];
#pragma unroll
      for (int k = 0; k < kStageUnroll; ++k)
        if (i0 + k * stride < valid * vectors) v[k] = from[i0 + k * stride];
#pragma unroll
      for (int k = 0; k < kStageUnroll; ++k)
        if (i0 + k * stride < valid * vectors) to[i0 + k * stride] = v[k];
    }
  }
}

}  // namespace

void launch_moe_combine(const MoeCombineArgs& args, int blocks, bool bulk, cudaStream_t stream) {
  static_assert(kSources <= 16, "moe_combine<16> holds every source");
  const int sources = args.g.expert_major ? args.g.topk : args.sync.world;
  if (bulk) {
    static DynamicSharedLimit limit;
    limit.raise(moe_combine_bulk, kBulkSharedBytes);
    launch_kernel(moe_combine_bulk, blocks, kThreadsPerBlock, kBulkSharedBytes, stream, args);
  } else if (sources <= 2) {
    launch_kernel(moe_combine<2>, blocks, kThreadsPerBlock, 0, stream, args);
  } else if (sources <= 4) {
    launch_kernel(moe_combine<4>, blocks, kThreadsPerBlock, 0, stream, args);
  } else if (sources <= 8) {
    launch_kernel(moe_combine<8>, blocks, kThreadsPerBlock, 0, stream, args);
  } else {
    launch_kernel(moe_combine<16>, blocks, kThreadsPerBlock, 0, stream, args);
  }
}

void launch_moe_combine_stage(const MoeStageArgs& args, int blocks, cudaStream_t stream) {
  launch_kernel(moe_combine_stage, blocks, kThreadsPerBlock, 0, stream, args);
}

}  // namespace symmem::detail
