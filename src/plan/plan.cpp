// The planners (plan.hpp): a request, equal on every rank, in; a row of the table of algorithms
// (algorithms.hpp) and everything the launch needs out.
#include "plan/plan.hpp"

#include <algorithm>

#include "common/check.hpp"
#include "device/device_types.hpp"
#include "plan/block_rules.hpp"

namespace symmem::detail {
namespace {

// The row of `collective` an algorithm a caller, SYMMEM_ALGO or the table names. Across-nodes rows
// are not chosen by name on one node (plan_all_gather routes them first).
const Algorithm* named_row(Collective collective, Algo algo) {
  const Algorithm* row = find_algorithm(collective, algo);
  return row && !row->across_nodes ? row : nullptr;
}

const Algorithm& row_of(Collective collective, Algo algo) {
  const Algorithm* row = find_algorithm(collective, algo);
  if (!row)
    throw Error(ErrorCode::kInternal, std::string(collective_name(collective)) + ": no algorithm " + algo_name(algo));
  return *row;
}

// From this size per rank, pull beats push when the caller's SM budget caps the block count.
constexpr size_t kPullUnderBudgetBytes = size_t(16) << 20;

}  // namespace

int common_vector_bytes(std::initializer_list<uint64_t> values) {
  int width = 16;
  for (uint64_t v : values)
    while (width > 1 && v % width != 0) width /= 2;
  return width;
}

namespace {

// The across-nodes all-gather (the hierarchical one), whatever a single-node request would plan.
AllGatherPlan plan_across_nodes(const AllGatherRequest& r) {
  const Algo algo = r.options.algo;
  // Across nodes only the hierarchical all-gather runs (SYMMEM_ALGO and the table name
  // single-node algorithms and do not apply). It uses no SMs, so an SM budget binds nothing, and
  // a request for the copy engine (zero SMs) is one for it: inside each node it is the copy
  // engine's all-gather, so code written for one node runs unchanged on several.
  if (algo != Algo::kAuto && algo != Algo::kHierarchical && algo != Algo::kCopyEngine)
    throw Error(ErrorCode::kInvalidArgument, std::string("all_gather: algorithm ") + algo_name(algo) +
                                                 " runs inside one node, and this communicator spans " +
                                                 std::to_string(r.nodes) +
                                                 " nodes; use auto, hierarchical or copy_engine");
  const Algorithm& row = row_of(Collective::kAllGather, Algo::kHierarchical);
  AllGatherPlan plan;
  plan.algo = row.algo;
  plan.kernel = row.kernel;
  plan.blocks = 0;
  plan.vector_bytes = 1;
  // The local peers pull from this rank's input (its own node's shards) and from its output
  // (the shards it received from other nodes): both must be in the heap when it has peers.
  plan.stage_input = r.world > 1 && !r.in_symmetric;
  plan.stage_output = r.world > 1 && !r.out_symmetric;
  // Every node must cut the call alike (NCCL matches transfers by size and order), whatever
  // operands each passed: chunk as if staged, staged or not.
  AllGatherPlan chunking = plan;
  if (r.nodes > 1 && r.world > 1) chunking.stage_input = chunking.stage_output = true;
  plan.chunk_elements = all_gather_chunk_elements(chunking, r.elem_bytes, r.world * r.nodes, r.workspace);
  return plan;  // (asked for by name on one node: the copy engine's pull all-gather, scheduled alike)
}

}  // namespace

AllGatherPlan plan_all_gather(const AllGatherRequest& r, const TuningTable& table) {
  constexpr Collective kGather = Collective::kAllGather;
  if (r.nodes > 1 || r.options.algo == Algo::kHierarchical) return plan_across_nodes(r);
  Algo algo = r.options.algo;
  if (algo != Algo::kAuto && !named_row(kGather, algo))
    throw Error(ErrorCode::kInvalidArgument, std::string("all_gather: algorithm ") + algo_name(algo) +
                                                 " is not an all-gather algorithm (" + algorithm_names(kGather) + ")");
  const bool ll_fits = r.bytes_per_rank <= r.low_latency_capacity;
  const size_t ll_words = (r.bytes_per_rank + 3) / 4;  // low latency moves 4-byte words
  auto fits = [&](Algo a) { return !named_row(kGather, a)->low_latency || ll_fits; };
  if (algo != Algo::kAuto && !fits(algo))
    throw Error(ErrorCode::kInvalidArgument, "all_gather: low_latency takes up to " +
                                                 std::to_string(r.low_latency_capacity) + " bytes per rank; this call has " +
                                                 std::to_string(r.bytes_per_rank));
  if (r.options.max_blocks == 0) {
    if (algo != Algo::kAuto && named_row(kGather, algo)->uses_sms)
      throw Error(ErrorCode::kInvalidArgument,
                  std::string("all_gather: ") + algo_name(algo) + " needs SMs but max_blocks is 0");
    algo = Algo::kCopyEngine;  // the caller's SM budget wins over SYMMEM_ALGO and the table
  }
  // SYMMEM_ALGO applies where it can serve the call; otherwise the call plans as if it were unset.
  if (algo == Algo::kAuto && named_row(kGather, r.forced) && fits(r.forced)) algo = r.forced;
  int blocks = r.options.blocks > 0 ? r.options.blocks : r.forced_blocks;
  if (algo == Algo::kAuto) {
    const auto e = table.lookup("all_gather", r.world, r.bytes_per_rank);
    if (e && named_row(kGather, e->algo) && fits(e->algo)) {
      algo = named_row(kGather, e->algo)->algo;
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
    // blocks, 16-256 MiB per rank: 273-329 GB/s against 243-252;
    // bench/results/h200x2/all_gather_pull_vs_push_sm_budget_2.csv).
    if (algo == Algo::kPush && r.options.max_blocks > 0 && r.options.max_blocks < blocks &&
        r.bytes_per_rank >= kPullUnderBudgetBytes)
      algo = Algo::kPull;
    if (algo == Algo::kLowLatency && low_latency_budget_binds(r.options.max_blocks, blocks, ll_words))
      algo = Algo::kPush;
  }
  // Use what the buffers allow without staging when the caller did not insist. With both operands
  // local, pull stages only this rank's input (push would stage and copy out world times more).
  if (r.options.algo == Algo::kAuto) {
    if (algo == Algo::kPush && !r.out_symmetric) algo = Algo::kPull;
    if (algo == Algo::kPull && !r.in_symmetric && r.out_symmetric) algo = Algo::kPush;
  }
  const Algorithm& row = *named_row(kGather, algo);
  AllGatherPlan plan;
  plan.algo = row.algo;
  plan.kernel = row.kernel;
  if (row.low_latency) {
    // Peers touch neither operand: nothing is staged, whatever the buffers.
    if (blocks <= 0) blocks = low_latency_blocks(ll_words);
    plan.blocks = clamp_blocks(blocks, r.sm_count, r.options.max_blocks);
    plan.vector_bytes = 4;
  } else if (!row.uses_sms) {
    // The copy engine pulls the peers' inputs, or (SYMMEM_CE_DIRECTION=push, symmetric outputs
    // only) writes into the peers' outputs.
    plan.blocks = 0;
    plan.copy_engine_push = r.copy_engine_push && r.out_symmetric;
    plan.stage_input = !plan.copy_engine_push && !r.in_symmetric;
    plan.vector_bytes = 1;
  } else {
    plan.stage_input = row.input == Access::kPeers && !r.in_symmetric;
    plan.stage_output = row.output == Access::kPeers && !r.out_symmetric;
    if (blocks <= 0) {
      const size_t traffic = r.bytes_per_rank * static_cast<size_t>(std::max(1, r.world - 1));
      blocks = blocks_for(traffic, size_t(128) << 10, 4, 64);
    }
    plan.blocks = clamp_blocks(blocks, r.sm_count, r.options.max_blocks);
    // Staged buffers are heap-aligned; the caller's pointers decide otherwise.
    const uint64_t in = plan.stage_input ? 0 : r.in_address;
    const uint64_t out = plan.stage_output ? 0 : r.out_address;
    plan.vector_bytes = common_vector_bytes({r.bytes_per_rank, in, out});
    // Hopper bulk copies where every address allows them (SYMMEM_PUSH_BULK).
    if (r.push_bulk && plan.vector_bytes == 16) plan.kernel = row.aligned_kernel;
    if (row.kernel == KernelId::kAllGatherPull) plan.local_warps = pull_local_warps(r.world);
  }
  plan.chunk_elements = all_gather_chunk_elements(plan, r.elem_bytes, r.world, r.workspace);
  return plan;
}

KernelId narrowed_kernel(const AllGatherPlan& plan, int vector_bytes) {
  if (vector_bytes >= 16) return plan.kernel;
  const Algorithm& row = row_of(Collective::kAllGather, plan.algo);
  return plan.kernel == row.aligned_kernel ? row.kernel : plan.kernel;
}

int pull_local_warps(int world) { return world <= 1 ? 0 : std::max(2, 6 / (world - 1)); }

namespace {

ReducePlan plan_reduce_as_asked(const ReduceRequest& r, const TuningTable& table);

// Below this many bytes per chunk, a chunked push all-reduce (or reduce-scatter) loses to a pull
// run in one piece, with the pull's block count (the caller's or SYMMEM_BLOCKS', else the built-in
// rule's: the table's was measured for the push): every chunk adds a launch and two barriers (7-9 us
// on 2 x H200).
// - Symmetric operands: the two-shot pull (reduce-scatter: the pull) reads and writes them where
//   they are, at about 5 % more time than push per byte. Measured on 2 x H200 at 3e820ed
//   (bench/results/h200x2/all_reduce_2.csv; nccl_tests_windows_2.csv as of commit 1b9647a, through
//   libsymmem_nccl.so, whose 16 MiB budget cuts a push into 4 MiB chunks): 16 MiB two_shot pull
//   60 us in one piece against two_shot_push 83 us in 4 chunks, 256 MiB 825 us against 1305 us in
//   64 chunks, while two_shot_push in 4 chunks of 64 MiB (789 us) still beats the pull. With this
//   rule the shim's window all-reduce beats NCCL at 16-256 MiB (nccl_tests_windows_all_2.csv,
//   16856da).
// - Local operands (input and output), all-reduce at 2 ranks: the one-shot pull, which copies its
//   input into the heap first (a local copy) and reads as many bytes from the peer as two-shot, in
//   one pass fewer. Measured through libsymmem_nccl.so (16 MiB budget: 1 MiB receive slots, 4 MiB
//   staging) on 2 x H200, bf16 sum, out of place, medians of 2 repetitions
//   (bench/results/h200x2/nccl_tests_staged_pull_2.csv, each algorithm named by SYMMEM_ALGO): 2 MiB
//   one_shot 18.0 us, one_shot_push 19.1 in 2 chunks, two_shot 24.3; 4 MiB 25.2, 37.5 in 4 chunks,
//   29.5 (NCCL 29.1 and 34.6). With this rule (3 repetitions, bf16 and fp32): 2 MiB 16.0-16.7
//   against one_shot_push's 18.1-18.6, 4 MiB 22.8-23.6 against 35.9-36.6. Not measured: other
//   GPUs, other budgets (a table naming a push whose receive slot cuts a larger message), sizes
//   between one slot and 2 MiB, mixed operands (one symmetric, one local: the push stays), other
//   worlds (the push stays; at 4 ranks the H200 table's push needs a symmetric output, so local
//   operands run the staged two-shot pull already). Reduce-scatter's staged pull lost to the push
//   in 2 chunks (4 MiB: 22.0 against 19.5 us): its push stays.
constexpr size_t kChunkedPushLosesBelowBytes = size_t(32) << 20;

// Local operands (input and output) at 2 ranks: from these message sizes (an all-reduce's
// message, a reduce-scatter's whole input), and wherever the plan would run in chunks, the
// pipelined reductions, which stage nothing and run any size in one kernel through fixed slots.
// Measured through libsymmem_nccl.so on 2 x H200 (nccl-tests, bf16 sum, processes, 97cbe1c,
// bench/results/h200x2/nccl_tests_pipelined_2.csv, one run per setting, the others named by
// SYMMEM_ALGO), 64 MiB workspace, 128 blocks: all-reduce 8 MiB 35.5 us against the one-shot push's
// 41.7 and the one-shot pull's 40.7 (NCCL 49.6), 64 MiB 209.8 against 327.1 and 277.6 (NCCL
// 246.6); reduce-scatter 16 MiB 41.6 against the push's 44.3 (NCCL 53.0), 64 MiB 144.0 against
// 174.4 (NCCL 166.8), while at 8 MiB the default plan there (the push) took 21.0 against its 25.8
// at 160 blocks and 29.8 at 64. With a 16 MiB workspace a 64 MiB all-reduce takes 262.7 (NCCL
// 247.1 in that run). Not measured: other worlds (their plans stand), mixed operands.
constexpr size_t kPipelinedAllReduceFromBytes = size_t(8) << 20;
constexpr size_t kPipelinedReduceScatterFromBytes = size_t(16) << 20;

// The pipelined reductions' blocks unless the caller or SYMMEM_BLOCKS names a count (same file: a
// 64 MiB all-reduce took 209.8 us at 128 blocks, 222.6 at 64 and 222.0 at 160).
constexpr int kPipelinedBlocks = 128;

}  // namespace

namespace {

// Only a plan the table or the built-in rule chose is revisited; an algorithm the caller or
// SYMMEM_ALGO named (and that runs) stands. Every input here is agreed, so every rank revisits alike.
bool named_by_caller(const ReduceRequest& r, const ReducePlan& plan) {
  const Collective collective = r.reduce_scatter ? Collective::kReduceScatter : Collective::kAllReduce;
  const Algorithm* forced = named_row(collective, r.forced);
  return r.options.algo != Algo::kAuto || (forced && forced->algo == plan.algo);
}

// plan_reduce without the pipelined rule.
ReducePlan plan_reduce_staged(const ReduceRequest& r, const TuningTable& table) {
  ReducePlan plan = plan_reduce_as_asked(r, table);
  if (named_by_caller(r, plan)) return plan;
  const bool push = plan.receive_area || plan.kernel == KernelId::kAllReduceTwoShotPush;
  // A chunk's share of the message: a reduce-scatter chunk covers chunk_elements of every rank's slice.
  const size_t chunk_bytes = plan.chunk_elements * r.elem_bytes * (r.reduce_scatter ? size_t(r.world) : 1);
  const bool chunked_push = push && plan.chunk_elements < r.count && chunk_bytes < kChunkedPushLosesBelowBytes;
  ReduceRequest asked = r;
  if (chunked_push) {
    asked.options.algo = r.reduce_scatter ? Algo::kPull : Algo::kTwoShot;
    const ReducePlan where_they_are = plan_reduce_as_asked(asked, table);
    if (where_they_are.chunk_elements >= r.count && !where_they_are.stage_input && !where_they_are.gather_via_staging)
      return where_they_are;
  }
  if (r.reduce_scatter || r.world != 2 || r.in_symmetric || r.out_symmetric) return plan;
  // Local operands (input and output), all-reduce at 2 ranks, where the plan chunks a push or
  // stages a two-shot (the table's two-shot push needs a symmetric output; without a table the
  // built-in two-shot): at 2 ranks the one-shot reads or stores as many bytes over NVLink as the
  // two-shot, in one pass fewer, and stages less (the push nothing, the pull its input only; the
  // two-shot its input and its output). So the one-shot push where its receive slot holds the
  // message, else the one-shot pull (in chunks too when it replaces the staged two-shot, which
  // chunks at the same staging capacity), with the blocks the caller or SYMMEM_BLOCKS asked for,
  // else the built-in rule's (the table's were measured for another algorithm). Measured on 2 x H200
  // through TPAllReduce.all_reduce on plain tensors (out of place; default workspace: 16 MiB receive
  // slots at 2 ranks, 64 MiB staging), bf16 sum, eager, each algorithm named by SYMMEM_ALGO, medians
  // (bench/results/h200x2/torch_staged_all_reduce_2.csv, 3de4099): 8 MiB one_shot_push 35.2 us
  // against the staged two-shot's 41.8 (NCCL 47.7), 16 MiB 67.4 / 74.7 (74.5); 32 MiB one_shot 128.2
  // against 135.6 (138.7) and one_shot_push's 135.3 in 2 chunks, 64 MiB 243.7 / 266.4 (248.9),
  // 128 MiB in 2 chunks 488.1 / 533.6 (NCCL 462.7, still faster than both); from graphs alike. Not measured:
  // in place, other GPUs (the H100 table has the same shape), smaller workspaces (the one-shot
  // pull then runs in more chunks), GPUs without a table (the one-shot push from 64 KiB), mixed
  // operands, reduce-scatter.
  const bool staged_two_shot = plan.algo == Algo::kTwoShot && (plan.stage_input || plan.gather_via_staging);
  if (!chunked_push && !staged_two_shot) return plan;
  asked.options.algo = Algo::kOneShotPush;
  const ReducePlan stores = plan_reduce_as_asked(asked, table);
  if (stores.chunk_elements >= r.count) return stores;
  asked.options.algo = Algo::kOneShot;
  const ReducePlan one_pass = plan_reduce_as_asked(asked, table);
  return one_pass.chunk_elements >= r.count || staged_two_shot ? one_pass : plan;
}

}  // namespace

ReducePlan plan_reduce(const ReduceRequest& r, const TuningTable& table) {
  const ReducePlan plan = plan_reduce_staged(r, table);
  if (named_by_caller(r, plan)) return plan;
  if (r.world != 2 || r.in_symmetric || r.out_symmetric) return plan;
  const size_t message = r.count * r.elem_bytes * (r.reduce_scatter ? size_t(r.world) : 1);
  const size_t from = r.reduce_scatter ? kPipelinedReduceScatterFromBytes : kPipelinedAllReduceFromBytes;
  if (message < from && plan.chunk_elements >= r.count) return plan;
  ReduceRequest asked = r;
  asked.options.algo = Algo::kPipelined;
  return plan_reduce_as_asked(asked, table);
}

namespace {

ReducePlan plan_reduce_as_asked(const ReduceRequest& r, const TuningTable& table) {
  const Collective collective = r.reduce_scatter ? Collective::kReduceScatter : Collective::kAllReduce;
  const char* op = collective_name(collective);
  const size_t bytes = r.count * r.elem_bytes;
  Algo algo = r.options.algo;
  if (algo != Algo::kAuto && !named_row(collective, algo))
    throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": algorithm " + algo_name(algo) + " is not " +
                                                 (r.reduce_scatter ? "a reduce-scatter" : "an all-reduce") +
                                                 " algorithm (" + algorithm_names(collective) + ")");
  if (algo == Algo::kAuto && named_row(collective, r.forced)) algo = r.forced;
  if (r.options.max_blocks == 0)
    throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": needs SMs but max_blocks is 0");
  int blocks = r.options.blocks > 0 ? r.options.blocks : r.forced_blocks;
  // The low-latency all-reduce reads its input in 4-byte words; the reduce-scatter reads slices at
  // any alignment (byte by byte where they are not aligned).
  const bool aligned4 = r.in_address % 4 == 0;
  const bool ll_fits = bytes <= r.low_latency_capacity && (aligned4 || r.reduce_scatter);
  // Two-shot low latency: each slice travels in half a slot, twice.
  // (At one rank it is a copy through the protocol, as every algorithm is.)
  const size_t slice_bytes = two_shot_slice(r.count, r.world, r.elem_bytes) * r.elem_bytes;
  const bool ll2_fits = aligned4 && slice_bytes <= r.low_latency_capacity / 2;
  // A low-latency algorithm the areas cannot hold: an error when the caller chose it; from
  // SYMMEM_ALGO or the table, the call plans as if that choice were absent.
  auto fits = [&](Algo a) {
    const Algorithm* row = named_row(collective, a);
    return !row->low_latency || (row->reduces_a_slice ? ll2_fits : ll_fits);
  };
  if (algo != Algo::kAuto && r.options.algo == Algo::kAuto && !fits(algo)) algo = Algo::kAuto;
  if (algo == Algo::kAuto) {
    std::optional<TuningEntry> e = table.lookup(op, r.world, bytes);
    if (e && named_row(collective, e->algo) && fits(e->algo)) {
      algo = e->algo;
      if (blocks <= 0) blocks = e->blocks;
    } else if (r.reduce_scatter) {
      algo = low_latency_by_rule(bytes, r.world, ll_fits) ? Algo::kLowLatency : Algo::kPull;
    } else {
      algo = bytes <= (size_t(64) << 10) && ll_fits ? Algo::kLowLatency : Algo::kTwoShot;
    }
    algo = named_row(collective, algo)->algo;  // (an alias named by the table)
    if (r.reduce_scatter && algo == Algo::kLowLatency && low_latency_budget_binds(r.options.max_blocks, blocks, bytes / 4))
      algo = Algo::kPush;
    if (named_row(collective, algo)->output == Access::kPeersSymmetricOnly && !r.out_symmetric) algo = Algo::kTwoShot;
  }
  const Algorithm& row = *named_row(collective, algo);
  if (row.low_latency && row.reduces_a_slice && !ll2_fits)
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + ": " + row.name + " takes slices up to " +
                    std::to_string(r.low_latency_capacity / 2) +
                    " bytes with a 4-byte aligned input; this message has " +
                    std::to_string(bytes) + " bytes over " + std::to_string(r.world) + " ranks");
  if (row.output == Access::kPeersSymmetricOnly && !r.out_symmetric)
    throw Error(ErrorCode::kInvalidArgument,
                std::string(op) + ": " + row.name + " stores into every rank's output, which must be in the heap");
  if (row.low_latency && !row.reduces_a_slice && !ll_fits)
    throw Error(ErrorCode::kInvalidArgument,
                r.reduce_scatter
                    ? std::string(op) + ": low_latency takes up to " + std::to_string(r.low_latency_capacity) +
                          " bytes per rank; this call has " + std::to_string(bytes)
                    : std::string(op) + ": low_latency takes messages up to " + std::to_string(r.low_latency_capacity) +
                          " bytes with a 4-byte aligned input; this one has " + std::to_string(bytes) +
                          " bytes at address " + std::to_string(r.in_address));
  ReducePlan plan;
  plan.algo = row.algo;
  plan.kernel = row.kernel;
  // (The pipelined reductions use the receive area too, as slots of their own: not this protocol.)
  plan.receive_area = row.kernel == KernelId::kReducePushed;
  plan.reads_peer_inputs = row.input == Access::kPeers;
  plan.stage_input = (plan.reads_peer_inputs && !r.in_symmetric) || (row.in_place_stages_input && r.in_place);
  plan.gather_via_staging = row.output == Access::kPeersIfSymmetric && !r.out_symmetric;
  const uint64_t in = plan.stage_input ? 0 : r.in_address;
  const uint64_t slice = r.reduce_scatter ? bytes : 0;  // reduce-scatter slices start at r * bytes
  plan.vector = common_vector_bytes({in, r.out_address, slice}) == 16;
  if (blocks <= 0 && row.kernel == KernelId::kReducePipelined) blocks = kPipelinedBlocks;
  if (blocks <= 0 && row.low_latency) {
    // The words of what each rank reduces: the message, or one two-shot slice.
    blocks = low_latency_blocks((row.reduces_a_slice ? slice_bytes : bytes) / 4);
  }
  if (blocks <= 0) {
    // Reads per rank: the whole message for one-shot / low latency, 1/world of it for two-shot;
    // a reduce-scatter reads its slice of every rank's input.
    const size_t traffic = row.reduces_a_slice ? bytes : bytes * static_cast<size_t>(r.world);
    blocks = blocks_for(traffic, size_t(64) << 10, 4, 64);
  }
  plan.blocks = clamp_blocks(blocks, r.sm_count, r.options.max_blocks);
  plan.chunk_elements = reduce_chunk_elements(plan, r.reduce_scatter, r.elem_bytes, r.world, r.workspace);
  if (plan.kernel == KernelId::kReducePipelined)
    plan.piece_elements =
        pipelined_piece_elements(r.count, r.reduce_scatter, r.elem_bytes, r.world, plan.blocks, r.workspace);
  return plan;
}

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
  if (plan.gather_via_staging) limit = std::min(limit, whole_vectors(limits.staging, elem_bytes));
  if (plan.kernel == KernelId::kAllReduceTwoShotPush) {
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

size_t pipelined_piece_elements(size_t count, bool reduce_scatter, size_t elem_bytes, int world, int blocks,
                                const WorkspaceLimits& limits) {
  const size_t grid = size_t(std::max(1, blocks));
  const size_t slots = grid * size_t(std::max(1, world));
  const size_t fits = std::max<size_t>(16, std::min(limits.staging, size_t(1) << 40) / slots / 16 * 16);
  const size_t slice = reduce_scatter ? count : two_shot_slice(count, world, elem_bytes);
  const size_t spread = (slice * elem_bytes + grid - 1) / grid;
  const size_t bytes = std::min(fits, std::max<size_t>(16, (spread + 15) / 16 * 16));
  return bytes / elem_bytes;
}

std::vector<ElementChunk> plan_chunks(size_t count, size_t limit) {
  std::vector<ElementChunk> chunks;
  if (limit == 0) limit = 1;
  for (size_t begin = 0; begin < count; begin += limit) chunks.push_back({begin, std::min(limit, count - begin)});
  return chunks;
}

std::string describe(const AllGatherPlan& p) {
  return std::string("all_gather ") + algo_name(p.algo) +
         (p.algo == Algo::kCopyEngine ? (p.copy_engine_push ? " push" : " pull") : "") +
         (p.kernel == KernelId::kAllGatherPushBulk ? " bulk" : "") +
         " blocks=" + std::to_string(p.blocks) + " vector=" + std::to_string(p.vector_bytes) +
         (p.local_warps > 0 ? " local-warps=" + std::to_string(p.local_warps) : "") +
         (p.stage_input ? " staged-input" : "") + (p.stage_output ? " staged-output" : "");
}

std::string describe(const ReducePlan& p) {
  return std::string(algo_name(p.algo)) + " blocks=" + std::to_string(p.blocks) +
         (p.vector ? " vector=16" : " scalar") + (p.stage_input ? " staged-input" : "") +
         (p.gather_via_staging ? " gather-via-staging" : "") + (p.receive_area ? " receive-area" : "") +
         (p.piece_elements ? " piece=" + std::to_string(p.piece_elements) : "");
}

}  // namespace symmem::detail
