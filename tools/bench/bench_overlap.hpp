// symmem-bench overlap: an fp16 GEMM on the caller's stream while an all-gather runs on a second
// stream with no data dependency (FSDP prefetch). The all-gather is in place, as FSDP2's is (each
// rank's shard is its slot of the output), for every implementation. Rows: gemm_alone, allgather_alone_<impl>,
// sequential_nccl, overlap_nccl, overlap_nccl_ce, overlap_symmem_sm<blocks>, overlap_symmem_copy_engine,
// all timed interleaved. symmem gets the shard as a symmetric operand ({output buffer, rank * bytes}:
// zero copy). Every row that gathers checks its output (#wrong); gemm_alone has none to check.
#pragma once

#include <vector>

#include "bench_context.hpp"

namespace symmem::bench {

std::vector<Row> run_overlap(BenchContext& ctx);

}  // namespace symmem::bench
