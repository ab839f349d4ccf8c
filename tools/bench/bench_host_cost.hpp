// symmem-bench host_cost: the CPU time to issue one call, per collective and layer (NCCL, symmem,
// a bare launch of an empty kernel), measured behind a GPU spin so that no call waits for the GPU.
#pragma once

#include <vector>

#include "bench_context.hpp"
#include "report.hpp"

namespace symmem::bench {

std::vector<Row> run_host_cost(BenchContext& ctx);

}  // namespace symmem::bench
