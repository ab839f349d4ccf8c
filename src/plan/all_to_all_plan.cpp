#include "plan/all_to_all_plan.hpp"

#include <algorithm>

#include "plan/all_to_all_layout.hpp"
#include "plan/block_rules.hpp"
#include "plan/plan.hpp"
#include "symmem/error.hpp"

namespace symmem::detail {
namespace {

constexpr Collective kToAll = Collective::kAllToAll;

const Algorithm* row_named(Algo a) { return a == Algo::kAuto ? nullptr : find_algorithm(kToAll, a); }

std::string name_of(const AllToAllRequest& r) {
  switch (r.form) {
    case AllToAllForm::kUniform: return "all_to_all";
    case AllToAllForm::kHostSplits: return "all_to_all_v";
    case AllToAllForm::kDeviceSplits: return r.experts > 1 ? "all_to_all_vdev_2d" : "all_to_all_vdev";
  }
  return "all_to_all";
}

}  // namespace

AllToAllPlan plan_all_to_all(const AllToAllRequest& r, const TuningTable& table) {
  const std::string op = name_of(r);
  Algo algo = r.options.algo;
  if (algo != Algo::kAuto && !row_named(algo))
    throw Error(ErrorCode::kInvalidArgument, op + ": algorithm " + algo_name(algo) +
                                                 " is not an all-to-all algorithm (" + algorithm_names(kToAll) + ")");
  const bool uniform = r.form == AllToAllForm::kUniform;
  // The copy engines need every pair's offsets on the host.
  auto serves = [&](Algo a) { return uniform || row_named(a)->uses_sms; };
  if (!uniform && algo != Algo::kAuto && !serves(algo))
    throw Error(ErrorCode::kInvalidArgument,
                op + ": copy_engine needs every pair's offsets on the host, and with per-rank splits a rank's host "
                     "knows only its own; use push, pull or low_latency (or the uniform all_to_all)");
  if (r.options.max_blocks == 0) {
    if (!uniform)
      throw Error(ErrorCode::kInvalidArgument,
                  op + ": needs SMs (its split exchange runs on them) but max_blocks is 0");
    if (algo != Algo::kAuto && row_named(algo)->uses_sms)
      throw Error(ErrorCode::kInvalidArgument, op + ": " + algo_name(algo) + " needs SMs but max_blocks is 0");
    algo = Algo::kCopyEngine;  // the caller's SM budget wins over SYMMEM_ALGO and the table
  }
  const bool ll_fits = uniform && r.pair_bytes <= r.low_latency_capacity;
  auto fits = [&](Algo a) { return !uniform || !row_named(a)->low_latency || ll_fits; };
  if (algo != Algo::kAuto && !fits(algo))
    throw Error(ErrorCode::kInvalidArgument,
                op + ": low_latency moves up to " + std::to_string(r.low_latency_capacity) +
                    " bytes per pair of ranks; this call moves " + std::to_string(r.pair_bytes));
  // SYMMEM_ALGO applies where it can serve the call; otherwise the call plans as if it were unset.
  if (algo == Algo::kAuto && row_named(r.forced) && serves(r.forced) && fits(r.forced)) algo = r.forced;
  int blocks = r.options.blocks > 0 ? r.options.blocks : r.forced_blocks;
  const size_t pair_words = (r.pair_bytes + 3) / 4;  // low latency's unit: a 4-byte word per thread

  AllToAllPlan plan;
  if (uniform) {
    if (algo == Algo::kAuto) {
      const auto e = table.lookup("all_to_all", r.world, r.pair_bytes * static_cast<size_t>(r.world));
      if (e && row_named(e->algo) && fits(e->algo)) {
        algo = e->algo;
        if (blocks <= 0) blocks = e->blocks;
      } else {
        algo = low_latency_by_rule(r.pair_bytes, r.world, ll_fits) ? Algo::kLowLatency : Algo::kAuto;
      }
      if (algo == Algo::kLowLatency && low_latency_budget_binds(r.options.max_blocks, blocks, pair_words))
        algo = Algo::kAuto;
    }
  }
  // Variable forms: the device sends each pair of at most low_latency_pair_bytes as lines (set
  // below, once the blocks are known), the others by the SM path the plan names.
  const bool variable_lines = !uniform && (algo == Algo::kAuto || algo == Algo::kLowLatency);
  const bool lines_forced = !uniform && algo == Algo::kLowLatency;
  if (lines_forced) algo = Algo::kAuto;
  // Push writes the peers' outputs (they must be in the heap) and reads its own input; pull reads
  // the peers' inputs (in the heap, or staged) and writes its own output. A symmetric output
  // takes push, anything else pull.
  if (algo == Algo::kAuto) algo = r.out_symmetric ? Algo::kPush : Algo::kPull;
  const Algorithm& row = *row_named(algo);
  if (row.output == Access::kPeersSymmetricOnly && !r.out_symmetric)
    throw Error(ErrorCode::kInvalidArgument,
                op + ": " + row.name +
                    " stores into every rank's output, which must be in the heap; use pull "
                    "(or auto)");
  plan.algo = row.algo;
  plan.kernel = row.kernel;
  plan.exchange = !uniform;
  plan.stage_input = (r.in_place && row.in_place_stages_input) || (row.input == Access::kPeers && !r.in_symmetric);
  if (!row.uses_sms) {
    plan.blocks = 0;
    plan.vector_bytes = 1;
  } else {
    if (blocks <= 0) {
      blocks = !uniform          ? kAllToAllVariableBlocks
               : row.low_latency ? low_latency_blocks(pair_words)
                                 : uniform_all_to_all_blocks(r.pair_bytes * static_cast<size_t>(std::max(1, r.world)));
    }
    plan.blocks = clamp_blocks(blocks, r.sm_count, r.options.max_blocks);
    if (variable_lines) {
      // Per pair: a rank then stores and receives at most (W - 1) x the threshold as lines, the
      // uniform rule's bound on a rank's lines, however skewed the matrix. A pair's lines follow
      // the header in its slot. Chosen by the plan (not forced), a pair goes by lines only while
      // the grid has a thread for each of its words: past that every thread waits for its words
      // in turn (2 x H200, one-hot 256 KiB per rank on 32 blocks: 14.0 us by lines, 10.3 by push).
      const size_t room =
          r.low_latency_capacity - std::min(r.low_latency_capacity, 4 * size_t(kMaxAllToAllHeaderWords));
      const size_t grid_words = size_t(plan.blocks) * kThreadsPerBlock;
      plan.low_latency_pair_bytes =
          lines_forced ? room : std::min({room, low_latency_rule_pair_bytes(r.world), 4 * grid_words});
      // One piece per pair only: a 2-D call's pieces land in several places (the SM path serves it).
      if (r.experts > 1) plan.low_latency_pair_bytes = 0;
    }
    const uint64_t in = plan.stage_input ? 0 : r.in_address;
    plan.vector_bytes =
        row.low_latency ? 4 : common_vector_bytes({uniform ? r.pair_bytes : r.row_bytes, in, r.out_address});
  }
  // Chunked wherever an algorithm that stages an input in place runs, in place or not: whether a
  // local input is in place is its rank's own (descriptor_of), and every rank must launch the same
  // chunks.
  if (uniform && (plan.stage_input || row.in_place_stages_input)) {
    const size_t per_pair = r.workspace.staging / static_cast<size_t>(std::max(1, r.world)) / 16 * 16;
    if (per_pair == 0)
      throw Error(ErrorCode::kInvalidArgument, op + ": the staging workspace of " +
                                                   std::to_string(r.workspace.staging) +
                                                   " bytes cannot hold a slice per rank");
    if (r.pair_bytes > per_pair) plan.chunk_pair_bytes = per_pair;
  }
  return plan;
}

std::string describe(const AllToAllPlan& p) {
  std::string s = std::string("all_to_all ") + algo_name(p.algo) + " blocks=" + std::to_string(p.blocks) +
                  " vector=" + std::to_string(p.vector_bytes);
  if (p.exchange) s += " split-exchange";
  if (p.low_latency_pair_bytes > 0) s += " low-latency-up-to=" + std::to_string(p.low_latency_pair_bytes);
  if (p.stage_input) s += " staged-input";
  if (p.chunk_pair_bytes > 0) s += " chunk=" + std::to_string(p.chunk_pair_bytes);
  return s;
}

}  // namespace symmem::detail
