// symmem-bench all_reduce --vllm-table: for T in {32, ..., 4096} tokens x 8192 hidden bf16, the
// time of each all-reduce algorithm, NCCL, and the best with its speedup over NCCL, in the layout
// of vLLM's communicator benchmark.
#pragma once

#include <vector>

#include "bench_context.hpp"

namespace symmem::bench {

constexpr int kVllmTokens[] = {32, 64, 96, 128, 192, 256, 1024, 2048, 3062, 4096};
constexpr int kVllmHidden = 8192;

std::vector<Row> run_vllm_table(BenchContext& ctx);

}  // namespace symmem::bench
