#include "plan/plan.hpp"

#include <algorithm>

#include "common/check.hpp"
#include "device/device_types.hpp"
#include "kernels/kernel_args.hpp"
#include "plan/block_rules.hpp"

namespace symmem::detail {
namespace {

bool is_all_gather_algo(Algo a) {
  return a == Algo::kPull || a == Algo::kPush || a == Algo::kCopyEngine || a == Algo::kLowLatency;
}
bool is_all_reduce_algo(Algo a) {
  return a == Algo::kOneShot || a == Algo::kOneShotPush || a == Algo::kTwoShot || a == Algo::kTwoShotPush ||
         a == Algo::kLowLatency || a == Algo::kLowLatencyTwoShot;
}
bool is_reduce_scatter_algo(Algo a) {
  return a == Algo::kTwoShot || a == Algo::kTwoShotPush || a == Algo::kLowLatency;
}
// All-reduce two-shot push stores its results into every rank's output, which must be in the heap
// (reduce-scatter's two_shot_push writes only its local output).
bool needs_heap_output(Algo a, bool reduce_scatter) { return a == Algo::kTwoShotPush && !reduce_scatter; }

// From this size per rank, pull beats push when the caller's SM budget caps the block count.
constexpr size_t kPullUnderBudgetBytes = size_t(16) << 20;

// Low latency is latency-bound: each thread waits for its words in turn, so every 4-byte word gets
// its own thread, within 4 to 128 blocks, as the H200 sweeps favour.
int low_latency_blocks(size_t words) { return blocks_for(words, kThreadsPerBlock, 4, 128); }

// Low latency gives every word its own thread: an SM budget below that slows it in proportion
// (2 x H200, 256 KiB per rank: 42 us on 4 blocks, 5.7 on 128), so a chosen (not asked-for) low
// latency yields to the SM algorithms when the budget binds.
bool low_latency_budget_binds(int max_blocks, int blocks, size_t words) {
  return max_blocks > 0 && max_blocks < (blocks > 0 ? blocks : low_latency_blocks(words));
}

// Built-in rule for the low-latency all-gather and reduce-scatter, for GPUs without a table row:
// while what each rank stores to its peers, (world - 1) x bytes, stays within 256 KiB. On 2 x H200
// it won from 1 to 256 KiB per rank, eager and replayed, against every SM algorithm and NCCL
// (bench/results/h200/small_messages); past two ranks the bound is scaled, not measured.
constexpr size_t kLowLatencyAutoPeerBytes = size_t(256) << 10;
bool low_latency_by_rule(size_t bytes_per_rank, int world, bool fits) {
  return fits && bytes_per_rank * static_cast<size_t>(std::max(1, world - 1)) <= kLowLatencyAutoPeerBytes;
}

}  // namespace

int common_vector_bytes(std::initializer_list<uint64_t> values) {
  int width = 16;
  for (uint64_t v : values)
    while (width > 1 && v % width != 0) width /= 2;
  return width;
}

AllGatherPlan plan_all_gather(const AllGatherRequest& r, const TuningTable& table) {
  AllGatherPlan plan;
  Algo algo = r.options.algo;
  if (r.nodes > 1 || algo == Algo::kHierarchical) {
    // Across nodes only the hierarchical all-gather runs (SYMMEM_ALGO and the table name
    // single-node algorithms and do not apply). It uses no SMs, so an SM budget binds nothing, and
    // a request for the copy engine (zero SMs) is one for it: inside each node it is the copy
    // engine's all-gather, so code written for one node runs unchanged on several.
    if (algo != Algo::kAuto && algo != Algo::kHierarchical && algo != Algo::kCopyEngine)
      throw Error(ErrorCode::kInvalidArgument, std::string("all_gather: algorithm ") + algo_name(algo) +
                                                   " runs inside one node, and this communicator spans " +
                                                   std::to_string(r.nodes) +
                                                   " nodes; use auto, hierarchical or copy_engine");
    plan.algo = Algo::kHierarchical;
    plan.blocks = 0;
    plan.vector_bytes = 1;
    // The local peers pull from this rank's input (its own node's shards) and from its output
    // (the shards it received from other nodes): both must be in the heap when it has peers.
    plan.stage_input = r.world > 1 && !r.in_symmetric;
    plan.stage_output = r.world > 1 && !r.out_symmetric;
    return plan;  // (asked for by name on one node: the copy engine's pull all-gather, scheduled alike)
  }
  if (algo != Algo::kAuto && !is_all_gather_algo(algo))
    throw Error(ErrorCode::kInvalidArgument, std::string("all_gather: algorithm ") + algo_name(algo) +
                                                 " is not an all-gather algorithm (pull, push, copy_engine, low_latency)");
  const bool ll_fits = r.bytes_per_rank <= r.low_latency_capacity;
  const size_t ll_words = (r.bytes_per_rank + 3) / 4;  // low latency moves 4-byte words
  auto fits = [&](Algo a) { return a != Algo::kLowLatency || ll_fits; };
  if (!fits(algo))
    throw Error(ErrorCode::kInvalidArgument, "all_gather: low_latency takes up to " +
                                                 std::to_string(r.low_latency_capacity) + " bytes per rank; this call has " +
                                                 std::to_string(r.bytes_per_rank));
  if (r.options.max_blocks == 0) {
    if (algo != Algo::kAuto && algo != Algo::kCopyEngine)
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("all_gather: ") + algo_name(algo) + " needs SMs but max_blocks is 0");
    algo = Algo::kCopyEngine;  // the caller's SM budget wins over SYMMEM_ALGO and the table
  }
  // SYMMEM_ALGO applies where it can serve the call; otherwise the call plans as if it were unset.
  if (algo == Algo::kAuto && is_all_gather_algo(r.forced) && fits(r.forced)) algo = r.forced;
  int blocks = r.options.blocks > 0 ? r.options.blocks : r.forced_blocks;
  if (algo == Algo::kAuto) {
    const auto e = table.lookup("all_gather", r.world, r.bytes_per_rank);
    if (e && is_all_gather_algo(e->algo) && fits(e->algo)) {
      algo = e->algo;
      if (blocks <= 0) blocks = e->blocks;
    } else {
      // Built-in rule, for GPUs without a table: low latency while the message is small, then push
      // (one-way stores), pull beyond, with blocks growing with the traffic.
      algo = low_latency_by_rule(r.bytes_per_rank, r.world, ll_fits) ? Algo::kLowLatency
             : r.bytes_per_rank <= (size_t(1) << 20)                 ? Algo::kPush
                                                                     : Algo::kPull;
    }
    // The table may pick an SM algorithm beyond a caller's SM budget: honour the budget. When
    // the budget binds on a large message, pull moves more per block than push (2 x H200, 16
    // blocks, 16-256 MiB per rank: 273-329 GB/s against 243-252; bench/results/h200).
    if (algo == Algo::kPush && r.options.max_blocks > 0 && r.options.max_blocks < blocks &&
        r.bytes_per_rank >= kPullUnderBudgetBytes)
      algo = Algo::kPull;
    if (algo == Algo::kLowLatency && low_latency_budget_binds(r.options.max_blocks, blocks, ll_words))
      algo = Algo::kPush;
  }
  if (algo == Algo::kLowLatency) {
    // Peers touch neither operand: nothing is staged, whatever the buffers.
    plan.algo = algo;
    if (blocks <= 0) blocks = low_latency_blocks(ll_words);
    plan.blocks = clamp_blocks(blocks, r.sm_count, r.options.max_blocks);
    plan.vector_bytes = 4;
    return plan;
  }
  if (algo == Algo::kCopyEngine) {
    plan.algo = algo;
    plan.blocks = 0;
    plan.copy_engine_push = r.copy_engine_push && r.out_symmetric;
    plan.stage_input = !plan.copy_engine_push && !r.in_symmetric;
    plan.vector_bytes = 1;
    return plan;
  }
  // Use what the buffers allow without staging when the caller did not insist. With both operands
  // local, pull stages only this rank's input (push would stage and copy out world times more).
  const bool chosen_by_caller = r.options.algo != Algo::kAuto;
  if (!chosen_by_caller) {
    if (algo == Algo::kPush && !r.out_symmetric) algo = Algo::kPull;
    if (algo == Algo::kPull && !r.in_symmetric && r.out_symmetric) algo = Algo::kPush;
  }
  plan.algo = algo;
  plan.stage_input = algo == Algo::kPull && !r.in_symmetric;
  plan.stage_output = algo == Algo::kPush && !r.out_symmetric;
  if (blocks <= 0) {
    const size_t traffic = r.bytes_per_rank * static_cast<size_t>(std::max(1, r.world - 1));
    blocks = blocks_for(traffic, size_t(128) << 10, 4, 64);
  }
  plan.blocks = clamp_blocks(blocks, r.sm_count, r.options.max_blocks);
  // Staged buffers are heap-aligned; the caller's pointers decide otherwise.
  const uint64_t in = plan.stage_input ? 0 : r.in_address;
  const uint64_t out = plan.stage_output ? 0 : r.out_address;
  plan.vector_bytes = common_vector_bytes({r.bytes_per_rank, in, out});
  plan.bulk = r.push_bulk && plan.algo == Algo::kPush && plan.vector_bytes == 16;
  if (plan.algo == Algo::kPull) plan.local_warps = pull_local_warps(r.world);
  return plan;
}

int pull_local_warps(int world) { return world <= 1 ? 0 : std::max(2, 6 / (world - 1)); }

ReducePlan plan_reduce(const ReduceRequest& r, const TuningTable& table) {
  ReducePlan plan;
  const char* op = r.reduce_scatter ? "reduce_scatter" : "all_reduce";
  const size_t bytes = r.count * r.elem_bytes;
  Algo algo = r.options.algo;
  if (r.reduce_scatter) {
    // Reduce-scatter is the first half of two_shot (read the peers' slices) or of two_shot_push
    // (the peers store their slices here).
    if (algo != Algo::kAuto && !is_reduce_scatter_algo(algo))
      throw Error(ErrorCode::kInvalidArgument, std::string("reduce_scatter: algorithm ") + algo_name(algo) +
                                                   " is not a reduce-scatter algorithm (two_shot, two_shot_push, low_latency)");
    if (algo == Algo::kAuto && is_reduce_scatter_algo(r.forced)) algo = r.forced;
  } else {
    if (algo != Algo::kAuto && !is_all_reduce_algo(algo))
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("all_reduce: algorithm ") + algo_name(algo) +
                      " is not an all-reduce algorithm (one_shot, one_shot_push, two_shot, two_shot_push, low_latency, "
                      "low_latency_two_shot)");
    if (algo == Algo::kAuto && is_all_reduce_algo(r.forced)) algo = r.forced;
  }
  if (r.options.max_blocks == 0)
    throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": needs SMs but max_blocks is 0");
  int blocks = r.options.blocks > 0 ? r.options.blocks : r.forced_blocks;
  // The low-latency all-reduce reads its input in 4-byte words; the reduce-scatter reads slices at
  // any alignment (byte by byte where they are not aligned).
  const bool aligned4 = r.in_address % 4 == 0;
  const bool ll_fits = bytes <= r.low_latency_capacity && (aligned4 || r.reduce_scatter);
  // Two-shot low latency: each slice travels in half a slot, twice.
  // (At one rank it is a copy through the protocol, as every algorithm is.)
  const bool ll2_fits = aligned4 &&
                        two_shot_slice(r.count, r.world, r.elem_bytes) * r.elem_bytes <= r.low_latency_capacity / 2;
  // A low-latency algorithm the areas cannot hold: an error when the caller chose it; from
  // SYMMEM_ALGO or the table, the call plans as if that choice were absent.
  auto fits = [&](Algo a) {
    return (a != Algo::kLowLatency || ll_fits) && (a != Algo::kLowLatencyTwoShot || ll2_fits);
  };
  if (algo != Algo::kAuto && r.options.algo == Algo::kAuto && !fits(algo)) algo = Algo::kAuto;
  if (algo == Algo::kAuto) {
    std::optional<TuningEntry> e = table.lookup(op, r.world, bytes);
    if (e && (r.reduce_scatter ? is_reduce_scatter_algo(e->algo) : is_all_reduce_algo(e->algo)) && fits(e->algo)) {
      algo = e->algo;
      if (blocks <= 0) blocks = e->blocks;
    } else if (r.reduce_scatter) {
      algo = low_latency_by_rule(bytes, r.world, ll_fits) ? Algo::kLowLatency : Algo::kTwoShot;
    } else {
      algo = bytes <= (size_t(64) << 10) && ll_fits ? Algo::kLowLatency : Algo::kTwoShot;
    }
    if (r.reduce_scatter && algo == Algo::kLowLatency && low_latency_budget_binds(r.options.max_blocks, blocks, bytes / 4))
      algo = Algo::kTwoShotPush;
    if (needs_heap_output(algo, r.reduce_scatter) && !r.out_symmetric) algo = Algo::kTwoShot;
  }
  if (algo == Algo::kLowLatencyTwoShot && !ll2_fits)
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + ": low_latency_two_shot takes slices up to " +
                    std::to_string(r.low_latency_capacity / 2) +
                    " bytes with a 4-byte aligned input; this message has " +
                    std::to_string(bytes) + " bytes over " + std::to_string(r.world) + " ranks");
  if (needs_heap_output(algo, r.reduce_scatter) && !r.out_symmetric)
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + ": two_shot_push stores into every rank's output, which must be in the heap");
  if (algo == Algo::kLowLatency && !ll_fits)
    throw Error(ErrorCode::kInvalidArgument,
                r.reduce_scatter
                    ? std::string(op) + ": low_latency takes up to " + std::to_string(r.low_latency_capacity) +
                          " bytes per rank; this call has " + std::to_string(bytes)
                    : std::string(op) + ": low_latency takes messages up to " + std::to_string(r.low_latency_capacity) +
                          " bytes with a 4-byte aligned input; this one has " + std::to_string(bytes) +
                          " bytes at address " + std::to_string(r.in_address));
  plan.algo = algo;
  plan.receive_area = algo == Algo::kOneShotPush || (r.reduce_scatter && algo == Algo::kTwoShotPush);
  // Low latency and the push algorithms read only this rank's own input.
  plan.reads_peer_inputs = algo != Algo::kLowLatency && algo != Algo::kLowLatencyTwoShot &&
                           algo != Algo::kTwoShotPush && algo != Algo::kOneShotPush;
  plan.stage_input =
      (plan.reads_peer_inputs && !r.in_symmetric) || (algo == Algo::kOneShot && r.in_place && !r.reduce_scatter);
  plan.gather_via_scratch = !r.reduce_scatter && algo == Algo::kTwoShot && !r.out_symmetric;
  const uint64_t in = plan.stage_input ? 0 : r.in_address;
  const uint64_t slice = r.reduce_scatter ? bytes : 0;  // reduce-scatter slices start at r * bytes
  plan.vector = common_vector_bytes({in, r.out_address, slice}) == 16;
  if (blocks <= 0 && (algo == Algo::kLowLatency || algo == Algo::kLowLatencyTwoShot)) {
    // One-shot: the message's words; two-shot: one slice's.
    blocks = low_latency_blocks(
        (algo == Algo::kLowLatency ? bytes : two_shot_slice(r.count, r.world, r.elem_bytes) * r.elem_bytes) / 4);
  }
  if (blocks <= 0) {
    // Reads per rank: the whole message for one-shot / low latency, 1/world of it for two-shot.
    const bool reads_everything =
        (algo != Algo::kTwoShot && algo != Algo::kTwoShotPush && algo != Algo::kLowLatencyTwoShot) || r.reduce_scatter;
    const size_t traffic = reads_everything ? bytes * static_cast<size_t>(r.world) : bytes;
    blocks = blocks_for(traffic, size_t(64) << 10, 4, 64);
  }
  plan.blocks = clamp_blocks(blocks, r.sm_count, r.options.max_blocks);
  return plan;
}

std::vector<CopyPiece> plan_copy_engine(int rank, int world, size_t bytes, int streams, size_t piece_bytes) {
  std::vector<CopyPiece> pieces;
  if (world <= 1 || bytes == 0 || streams <= 0) return pieces;
  const int peers = world - 1;
  // Each peer's copy is cut into pieces of at most piece_bytes, and into enough pieces that every
  // stream has work; pieces go out in waves (every peer's first piece, then every second piece),
  // next peer first, handed to the streams round-robin.
  constexpr size_t kSmallestPiece = size_t(64) << 10;
  const size_t by_size = (bytes + piece_bytes - 1) / std::max<size_t>(1, piece_bytes);
  const size_t by_streams = static_cast<size_t>((streams + peers - 1) / peers);
  const size_t most = std::max<size_t>(1, bytes / kSmallestPiece);
  const size_t cuts = std::max<size_t>(1, std::min(std::max(by_size, by_streams), most));
  const size_t piece = (bytes + cuts - 1) / cuts;
  int next_stream = 0;
  for (size_t c = 0; c < cuts; ++c) {
    for (int k = 1; k <= peers; ++k) {
      const int peer = (rank + k) % world;
      const size_t offset = c * piece;
      if (offset >= bytes) continue;
      pieces.push_back({peer, offset, std::min(piece, bytes - offset), next_stream});
      next_stream = (next_stream + 1) % streams;
    }
  }
  return pieces;
}

namespace {

constexpr size_t kChunkUnbounded = ~size_t(0);

// Elements in `bytes`, rounded down to whole 16-byte vectors, at least one vector.
size_t whole_vectors(size_t bytes, size_t elem_bytes) {
  const size_t vectors = std::max<size_t>(1, bytes / 16);
  return vectors * (16 / std::min<size_t>(16, elem_bytes));
}

}  // namespace

size_t all_gather_chunk_elements(const AllGatherPlan& plan, size_t elem_bytes, int world,
                                 const WorkspaceLimits& limits) {
  // `world`: the output's slots (the job's ranks for the hierarchical all-gather).
  size_t limit = kChunkUnbounded;
  if (plan.stage_input) limit = std::min(limit, whole_vectors(limits.staging, elem_bytes));
  if (plan.stage_output)
    limit = std::min(limit, whole_vectors(limits.staging / static_cast<size_t>(std::max(1, world)), elem_bytes));
  return limit;
}

size_t reduce_chunk_elements(const ReducePlan& plan, bool reduce_scatter, size_t elem_bytes, int world,
                             const WorkspaceLimits& limits) {
  const size_t w = static_cast<size_t>(std::max(1, world));
  size_t limit = kChunkUnbounded;
  // The staged input holds world slices per chunk for reduce-scatter, the chunk for all-reduce.
  if (plan.stage_input) limit = std::min(limit, whole_vectors(limits.staging / (reduce_scatter ? w : 1), elem_bytes));
  if (plan.gather_via_scratch) limit = std::min(limit, whole_vectors(limits.staging, elem_bytes));
  if (plan.algo == Algo::kTwoShotPush && !reduce_scatter) {
    // world slices of two_shot_slice(chunk) elements: with slices of whole vectors of
    // floor16(staging / world) bytes, slice * world * elem <= staging.
    const size_t slice_bytes = std::max<size_t>(16, limits.staging / w / 16 * 16);
    limit = std::min(limit, slice_bytes * w / elem_bytes);
  }
  if (plan.receive_area) {
    // world sender slots of round_up(chunk * elem, 256) bytes in one half.
    const size_t slot = std::max<size_t>(256, limits.receive_half / w / 256 * 256);
    limit = std::min(limit, whole_vectors(slot, elem_bytes));
  }
  return limit;
}

std::vector<ElementChunk> plan_chunks(size_t count, size_t limit) {
  std::vector<ElementChunk> chunks;
  if (limit == 0) limit = 1;
  for (size_t begin = 0; begin < count; begin += limit) chunks.push_back({begin, std::min(limit, count - begin)});
  return chunks;
}

std::string describe(const AllGatherPlan& p) {
  return std::string("all_gather ") + algo_name(p.algo) +
         (p.algo == Algo::kCopyEngine ? (p.copy_engine_push ? " push" : " pull") : "") + (p.bulk ? " bulk" : "") +
         " blocks=" + std::to_string(p.blocks) + " vector=" + std::to_string(p.vector_bytes) +
         (p.local_warps > 0 ? " local-warps=" + std::to_string(p.local_warps) : "") +
         (p.stage_input ? " staged-input" : "") + (p.stage_output ? " staged-output" : "");
}

std::string describe(const ReducePlan& p) {
  return std::string(algo_name(p.algo)) + " blocks=" + std::to_string(p.blocks) +
         (p.vector ? " vector=16" : " scalar") + (p.stage_input ? " staged-input" : "") +
         (p.gather_via_scratch ? " gather-via-scratch" : "") + (p.receive_area ? " receive-area" : "");
}

}  // namespace symmem::detail
