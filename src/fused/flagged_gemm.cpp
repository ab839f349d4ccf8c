// Dispatch of the persistent flag-waiting GEMM by element type, output type and B's layout. The
// kernels exist only when the build found CUTLASS's headers (SYMMEM_HAVE_FUSED_GEMM); otherwise
// every call says so.
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
// Defined by flagged_gemm_{fp16,bf16}[_float_out][_column_major_b].cu.
extern const Instantiation kFp16, kBf16, kFp16FloatOut, kBf16FloatOut;
extern const Instantiation kFp16ColumnMajorB, kBf16ColumnMajorB, kFp16FloatOutColumnMajorB, kBf16FloatOutColumnMajorB;
}  // namespace flagged_gemm

namespace {

// The instantiation that runs `gemm` (its input type, output type and B layout), or nullptr.
const flagged_gemm::Instantiation* instantiation_of(const FlaggedGemm& gemm) {
  using namespace flagged_gemm;
  const bool col = gemm.b_column_major;
  switch (gemm.type) {
    case DataType::kFloat16:
      if (gemm.float_out) return col ? &kFp16FloatOutColumnMajorB : &kFp16FloatOut;
      return col ? &kFp16ColumnMajorB : &kFp16;
    case DataType::kBFloat16:
      if (gemm.float_out) return col ? &kBf16FloatOutColumnMajorB : &kBf16FloatOut;
      return col ? &kBf16ColumnMajorB : &kBf16;
    default: return nullptr;
  }
}

}  // namespace

bool flagged_gemm_built(std::string*) { return true; }

std::string flagged_gemm_problem(const FlaggedGemm& gemm) {
  const flagged_gemm::Instantiation* kernel = instantiation_of(gemm);
  if (!kernel) return std::string("no GEMM for ") + dtype_name(gemm.type);
  return kernel->problem(gemm);
}

void run_flagged_gemm(FlaggedGemm gemm, cudaStream_t stream) {
  const flagged_gemm::Instantiation* kernel = instantiation_of(gemm);
  if (!kernel)
    throw Error(ErrorCode::kInvalidArgument, std::string("fused GEMM: no GEMM for ") + dtype_name(gemm.type));
  kernel->run(gemm, stream);
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
