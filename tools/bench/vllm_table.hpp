// symmem-bench all_reduce --vllm-table: for T in {32, ..., 4096} tokens x 8192 hidden bf16, the
// time of NCCL (plain and symmetric kernels), of symmem's planner choice and of each symmem
// algorithm, in the layout of vLLM's communicator benchmark.
//
// Rows per T, interleaved (each of --reps repetitions times one batch of every row in turn):
//   nccl             ncclAllReduce on the symmem heap buffers, never registered
//   nccl_symmetric   ncclAllReduce on ncclMemAlloc buffers registered as NCCL_WIN_COLL_SYMMETRIC
//                    windows (NCCL 2.28's symmetric kernels; NVLS stays off, NCCL_NVLS_ENABLE=0)
//   symmem_auto      the planner's choice; symmem_<algo> each algorithm that accepts the size
// Every symmem row passes heap Buffers (symmetric operands: zero copy, no staging).
//
// Checks (-c 1, the default) on every row, NCCL's included: the inputs are nonzero integers in
// [-16, 16], different on every rank, so the sum over ranks is exact in bf16 and must equal the
// float64 host reference bit for bit; the output is poisoned (0xFF: NaN) before every batch and
// compared after it (after the replay in graph mode), and every rank must hold the same bits.
#pragma once

#include <vector>

#include "bench_context.hpp"

namespace symmem::bench {

constexpr int kVllmTokens[] = {32, 64, 96, 128, 192, 256, 1024, 2048, 3062, 4096};
constexpr int kVllmHidden = 8192;

std::vector<Row> run_vllm_table(BenchContext& ctx);

}  // namespace symmem::bench
