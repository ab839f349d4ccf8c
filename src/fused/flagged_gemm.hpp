// The GEMM of all_gather_matmul: one persistent CUTLASS kernel (sm90, TMA, warp-specialised) over
// all of C = A B whose tiles wait for their rows of A to arrive (flag_waiting_scheduler.cuh).
// Row-major A [m x k], B [k x n], C [m x n] (torch's layout), fp16 or bf16 in and out, fp32
// accumulation. Host interface only; the kernels are in flagged_gemm_*.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "fused/chunk_flags.hpp"
#include "symmem/types.hpp"

namespace symmem::detail {

struct FlaggedGemm {
  const void* a;
  const void* b;
  void* c;
  int m, n, k;
  DataType type;
  ChunkFlags chunks;  // tile_rows must be kFlaggedGemmTileRows
  int sm_count;       // SMs the persistent grid may use
};

// False (with the reason) when the kernels were not built (no CUTLASS at build time).
bool flagged_gemm_built(std::string* why);
// Empty when the kernel can run `gemm` (CUTLASS's can_implement), else why. Launches nothing.
std::string flagged_gemm_problem(const FlaggedGemm& gemm);
// The M tile height of the kernel (the granularity at which rows are waited for).
constexpr int kFlaggedGemmTileRows = 128;
// Launches on `stream` (capturable). Throws symmem::Error on a launch failure.
void run_flagged_gemm(FlaggedGemm gemm, cudaStream_t stream);

}  // namespace symmem::detail
