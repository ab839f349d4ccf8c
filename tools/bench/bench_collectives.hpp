// Sweeps of one collective over sizes: NCCL rows and symmem rows on the same buffers, checked
// and timed in the same run. One function per collective family.
#pragma once

#include <vector>

#include "bench_context.hpp"
#include "plan/algorithms.hpp"
#include "plan/tuning_table.hpp"

namespace symmem::bench {

std::vector<Row> run_all_gather(BenchContext& ctx);

// symmem variants to run: every requested algorithm of `collective` (by any name it answers to) at
// every requested block count; every algorithm when none is requested (the table's rows, in its
// order, plan/algorithms.hpp).
std::vector<std::pair<Algo, int>> variants(const Args& a, detail::Collective collective);
std::vector<Row> run_reduction(BenchContext& ctx, bool reduce_scatter);

// The tuning entries this run's symmem rows support: per size, the fastest (algo, blocks).
std::vector<detail::TuningEntry> tuning_entries(const std::vector<Row>& rows);

}  // namespace symmem::bench
