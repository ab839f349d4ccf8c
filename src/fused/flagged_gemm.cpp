// Dispatch of the persistent flag-waiting GEMM by element type. The kernels exist only when the
// build found CUTLASS's headers (SYMMEM_HAVE_FUSED_GEMM); otherwise every call says so.
#include "fused/flagged_gemm.hpp"

#include <algorithm>
#include <cstdint>

#include "common/check.hpp"

namespace symmem::detail {

FlaggedGemm flagged_gemm_of(const void* a, const void* b, void* c, int m, int n, int k, DataType type, int sm_count,
                            int shard_rows, const GatherPieces& pieces) {
  FlaggedGemm g{};
  g.a = a;
  g.b = b;
  g.c = c;
  g.m = m;
  g.n = n;
  g.k = k;
  g.type = type;
  g.sm_count = sm_count;
  ChunkFlags& chunks = g.chunks;
  chunks.rows = m;
  chunks.shard_rows = shard_rows;
  chunks.piece_rows = pieces.piece_rows;
  chunks.pieces = pieces.pieces;
  chunks.tile_rows = kFlaggedGemmTileRows;
  chunks.tiles = (m + chunks.tile_rows - 1) / chunks.tile_rows;
  return g;
}

int flagged_gemm_tile_n(int m, int n, int sm_count) {
  constexpr int kClusterRows = 2 * kFlaggedGemmTileRows;  // clusters of 2 tiles along M
  const int64_t bands = (int64_t(m) + kClusterRows - 1) / kClusterRows;
  const int64_t slots = std::max(1, sm_count / 2);
  auto cost = [&](int64_t width) {
    const int64_t clusters = bands * ((n + width - 1) / width);
    return (clusters + slots - 1) / slots * width;
  };
  return cost(192) < cost(256) ? 192 : 256;
}

#ifdef SYMMEM_HAVE_FUSED_GEMM
namespace flagged_gemm {
void run_fp16(const FlaggedGemm& gemm, cudaStream_t stream);
void run_bf16(const FlaggedGemm& gemm, cudaStream_t stream);
void run_fp16_float_out(const FlaggedGemm& gemm, cudaStream_t stream);
void run_bf16_float_out(const FlaggedGemm& gemm, cudaStream_t stream);
std::string problem_fp16(const FlaggedGemm& gemm);
std::string problem_bf16(const FlaggedGemm& gemm);
std::string problem_fp16_float_out(const FlaggedGemm& gemm);
std::string problem_bf16_float_out(const FlaggedGemm& gemm);
}  // namespace flagged_gemm

bool flagged_gemm_built(std::string*) { return true; }

std::string flagged_gemm_problem(const FlaggedGemm& gemm) {
  switch (gemm.type) {
    case DataType::kFloat16:
      return gemm.float_out ? flagged_gemm::problem_fp16_float_out(gemm) : flagged_gemm::problem_fp16(gemm);
    case DataType::kBFloat16:
      return gemm.float_out ? flagged_gemm::problem_bf16_float_out(gemm) : flagged_gemm::problem_bf16(gemm);
    default: return std::string("no GEMM for ") + dtype_name(gemm.type);
  }
}

void run_flagged_gemm(FlaggedGemm gemm, cudaStream_t stream) {
  switch (gemm.type) {
    case DataType::kFloat16:
      return gemm.float_out ? flagged_gemm::run_fp16_float_out(gemm, stream) : flagged_gemm::run_fp16(gemm, stream);
    case DataType::kBFloat16:
      return gemm.float_out ? flagged_gemm::run_bf16_float_out(gemm, stream) : flagged_gemm::run_bf16(gemm, stream);
    default: throw Error(ErrorCode::kInvalidArgument, std::string("fused GEMM: no GEMM for ") + dtype_name(gemm.type));
  }
}
#else
bool flagged_gemm_built(std::string* why) {
  if (why) *why = "this build has no fused GEMM (CUTLASS headers were not found at build time: pip install nvidia-cutlass)";
  return false;
}
std::string flagged_gemm_problem(const FlaggedGemm&) { return "this build has no fused GEMM"; }
void run_flagged_gemm(FlaggedGemm, cudaStream_t) {
  throw Error(ErrorCode::kUnsupported, "this build has no fused GEMM");
}
#endif

}  // namespace symmem::detail
