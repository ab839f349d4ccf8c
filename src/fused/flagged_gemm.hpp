// The GEMM of the fused ops: one persistent CUTLASS kernel (sm90, TMA, warp-specialised) over all of
// C = A B whose tiles wait for their rows of A to arrive (all_gather_matmul) or announce their rows
// of C (matmul_reduce_scatter; flag_waiting_scheduler.cuh). Row-major A [m x k] and C [m x n]
// (torch's layout), B [k x n] row-major or column-major (b_column_major: torch's W.t()), fp16 or
// bf16 in, the same type or float32 out, fp32 accumulation. Host interface only; the kernels are
// in flagged_gemm_*.cu, one translation unit per (input type, output type, B layout).
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "fused/chunk_flags.hpp"
#include "plan/fused_plan.hpp"
#include "symmem/types.hpp"

namespace symmem::detail {

struct FlaggedGemm {
  const void* a;
  const void* b;
  void* c;
  int m, n, k;
  DataType type;                // of A and B
  bool float_out = false;       // C is float32 (else `type`)
  bool b_column_major = false;  // B (i, j) at b[i + j * k] (else b[i * n + j])
  ChunkFlags chunks;            // tile_rows must be kFlaggedGemmTileRows
  int sm_count;                 // SMs the persistent grid may use
  // The tile order inside the rotated schedule: M bands taken `swizzle` at a time (1, 2, 4, 8),
  // rasterised along N (every N tile of the bands before the next bands) unless raster_along_m.
  int swizzle = 1;
  bool raster_along_m = false;
  int tile_n = 0;  // the tiles' width, 256 or 192; 0: flagged_gemm_tile_n's choice
};

// C [m x n] = A [m x k] B [k x n] on `sm_count` SMs, the M rows cut into shards of `shard_rows`
// rows in `pieces` (the ChunkFlags geometry at the GEMM's tile height). The op's own parts are the
// caller's to set: chunks.flags or chunks.done, chunks.first_tile, float_out, tile_n.
FlaggedGemm flagged_gemm_of(const void* a, const void* b, void* c, int m, int n, int k, DataType type, int sm_count,
                            int shard_rows, const GatherPieces& pieces);

// The tile width (256 or 192 columns; both 128 rows, clusters of 2 along M) that leaves the fewest
// SMs idle in the last wave: the smaller (waves x width), 256 on a tie (its tiles reuse more). At
// N = 6656 that is 192 for M = 4096 to 16384 (cuBLASLt picks 192 x 192 tiles at M = 4096 and
// 16384). When both widths fit in one wave it picks 192 (less work per tile): not measured.
int flagged_gemm_tile_n(int m, int n, int sm_count);

// False (with the reason) when the kernels were not built (no CUTLASS at build time).
bool flagged_gemm_built(std::string* why);
// Empty when the kernel can run `gemm` (CUTLASS's can_implement), else why. Launches nothing.
std::string flagged_gemm_problem(const FlaggedGemm& gemm);
// The M tile height of the kernel (the granularity at which rows are waited for).
constexpr int kFlaggedGemmTileRows = 128;
// Launches on `stream` (capturable). Throws symmem::Error on a launch failure.
void run_flagged_gemm(FlaggedGemm gemm, cudaStream_t stream);

namespace flagged_gemm {
// One kernel family (the shipped tile widths) of one translation unit: its launch and its check.
struct Instantiation {
  void (*run)(const FlaggedGemm&, cudaStream_t);
  std::string (*problem)(const FlaggedGemm&);
};
}  // namespace flagged_gemm

}  // namespace symmem::detail
