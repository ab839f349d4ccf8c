// symmem-bench chunked_gemm: one GEMM against the same GEMM cut into row blocks (one per shard of
// a fused all-gather + GEMM), on one stream and on two. With the all-gather fully hidden, the
// fused op can be no faster than its chunked GEMM: this is the floor its design works against.
#pragma once

#include <vector>

#include "bench_context.hpp"
#include "report.hpp"

namespace symmem::bench {

std::vector<Row> run_chunked_gemm(BenchContext& ctx);

}  // namespace symmem::bench
