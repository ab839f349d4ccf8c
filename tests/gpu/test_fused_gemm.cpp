// The persistent GEMM of the fused ops on one GPU, without communication: matmul_reduce_scatter's
// copies wait until done[piece] reaches tiles_over_rows(piece) x (N tiles), so every tile must be
// announced exactly once to every piece its rows touch, never to another, whatever the rotation,
// tile width, padding (an odd number of M tiles in clusters of 2; N tiles rounded up to the
// swizzle) or shard edge inside a tile. A count short of its target would stall a pull until the
// GEMM ends (too low: forever); one above it would let a pull read rows not written yet. The first
// test checks the final counts, the second their order against the stores.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/driver_api.hpp"
#include "fixture.hpp"
#include "fused/flagged_gemm.hpp"
#include "plan/fused_plan.hpp"
#include "test.hpp"
#include "test_kernels.hpp"

using namespace symmem;
using namespace symmem::test;

namespace {

constexpr int kMaxChunks = kMaxWorld * detail::kMaxGatherPieces;

void skip_without_fused_gemm() {
  std::string why;
  if (!detail::flagged_gemm_built(&why)) SKIP(why);
  int device = 0, major = 0;
  TEST_CUDA(cudaGetDevice(&device));
  TEST_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major != 9) SKIP("the fused GEMM needs an sm_90 GPU");
}

// matmul_reduce_scatter's GEMM as rank `rank` of `world` runs it (fp16 in, float32 out, the
// rotation starting at rank + 1's rows), announcing into `done`.
detail::FlaggedGemm announcing_gemm(const void* a, const void* b, void* c, int world, int shard_rows, int n, int k,
                                    int tile_n, int rank, int sm_count, uint32_t* done) {
  const detail::GatherPieces pieces =
      detail::plan_gather_pieces(shard_rows, size_t(n) * sizeof(float), detail::kFlaggedGemmTileRows);
  detail::FlaggedGemm g = detail::flagged_gemm_of(a, b, c, world * shard_rows, n, k, DataType::kFloat16, sm_count,
                                                  shard_rows, pieces);
  g.float_out = true;
  g.tile_n = tile_n;
  detail::ChunkFlags& ch = g.chunks;
  ch.done = done;
  ch.first_tile = ((rank + 1) % world) * shard_rows / ch.tile_rows;
  ch.n_tiles = (n + tile_n - 1) / tile_n;
  return g;
}

// The pieces of every shard, as (shard, piece) pairs, in the GEMM's geometry.
std::vector<std::pair<int, detail::GatherCopy>> pieces_of(const detail::FlaggedGemm& g, int world) {
  const detail::GatherPieces pieces{g.chunks.pieces, g.chunks.piece_rows};
  std::vector<std::pair<int, detail::GatherCopy>> all;
  for (int shard = 0; shard < world; ++shard)
    for (const detail::GatherCopy& piece : detail::plan_gather_copies(shard, g.chunks.shard_rows, pieces))
      all.emplace_back(shard, piece);
  return all;
}

uint32_t target_of(const detail::FlaggedGemm& g, int shard, const detail::GatherCopy& piece) {
  return detail::piece_tile_count(shard, g.chunks.shard_rows, piece, g.chunks.tile_rows, g.chunks.n_tiles);
}

}  // namespace

TEST(fused_gemm_announces_every_tile_to_exactly_its_pieces) {
  Fixture& fx = Fixture::get();
  skip_without_fused_gemm();
  struct Case {
    int world, shard_rows, n, k, tile_n, swizzle;
  };
  // Shards of whole tiles; shard edges inside tiles; an odd number of M tiles (a padded cluster);
  // one tile in all; both widths; more tiles than SMs; N tiles padded by the swizzle (3 of 4 real).
  const std::vector<Case> cases = {{2, 256, 512, 64, 256, 1},   {2, 200, 264, 64, 192, 1}, {3, 200, 264, 128, 256, 1},
                                   {4, 8, 8, 8, 192, 1},        {1, 384, 520, 64, 256, 1}, {8, 100, 1024, 64, 192, 1},
                                   {2, 4096, 6656, 64, 192, 1}, {2, 512, 520, 64, 256, 2}};
  DeviceBuffer done(kMaxChunks * sizeof(uint32_t));
  int checked = 0;
  for (const Case& c : cases) {
    const int m = c.world * c.shard_rows;
    DeviceBuffer a(size_t(m) * c.k * 2), b(size_t(c.k) * c.n * 2), out(size_t(m) * c.n * sizeof(float));
    TEST_CUDA(cudaMemsetAsync(a.ptr, 0, size_t(m) * c.k * 2, fx.stream));
    TEST_CUDA(cudaMemsetAsync(b.ptr, 0, size_t(c.k) * c.n * 2, fx.stream));
    for (int rank = 0; rank < c.world; ++rank) {  // every rotation the ranks would use
      TEST_CUDA(cudaMemsetAsync(done.ptr, 0, kMaxChunks * sizeof(uint32_t), fx.stream));
      detail::FlaggedGemm g = announcing_gemm(a.ptr, b.ptr, out.ptr, c.world, c.shard_rows, c.n, c.k, c.tile_n, rank,
                                              fx.sm_count, static_cast<uint32_t*>(done.ptr));
      g.swizzle = c.swizzle;
      const std::string problem = detail::flagged_gemm_problem(g);
      EXPECT_EQ(problem, std::string());
      if (!problem.empty()) continue;
      detail::run_flagged_gemm(g, fx.stream);
      std::vector<uint32_t> counts(kMaxChunks);
      TEST_CUDA(cudaMemcpyAsync(counts.data(), done.ptr, counts.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost,
                                fx.stream));
      TEST_CUDA(cudaStreamSynchronize(fx.stream));
      std::vector<uint32_t> expected(kMaxChunks, 0);
      for (const auto& [shard, piece] : pieces_of(g, c.world)) expected[piece.chunk] = target_of(g, shard, piece);
      for (int i = 0; i < kMaxChunks; ++i) {
        if (counts[i] != expected[i]) {
          fail(__FILE__, __LINE__, "world " + std::to_string(c.world) + " shard_rows " + std::to_string(c.shard_rows) +
                                       " n " + std::to_string(c.n) + " rotation " + std::to_string(rank) + ": piece " +
                                       std::to_string(i) + " heard " + std::to_string(counts[i]) + " tiles, expected " +
                                       std::to_string(expected[i]));
        }
      }
      ++checked;
    }
  }
  EXPECT(checked == 2 + 2 + 3 + 4 + 1 + 8 + 2 + 2);
}

// The order of the announcements against the stores: the GEMM runs on half the SMs while another
// stream, for every piece, waits until its counter reaches its target and then copies the piece's
// rows of C (a copy within the GPU is a kernel: it runs on the SMs the GEMM leaves free). C starts
// as NaN; a piece announced before all its rows had landed would leave NaN or old rows in the
// snapshot. Every rotation, 3 rounds each, integer inputs (C is exact). It catches an announcement
// made before a tile's epilogue; not one made right after it without waiting for the stores (the
// negative control, an announcement right after the epilogue, passed it on one H200: a store
// lands within about a microsecond, less than a stream wait plus a copy launch).
TEST(fused_gemm_announces_a_piece_only_after_its_rows_landed) {
  Fixture& fx = Fixture::get();
  skip_without_fused_gemm();
  const int world = 2, shard_rows = 2048, n = 4096, k = 1024, m = world * shard_rows;
  const size_t c_bytes = size_t(m) * n * sizeof(float);
  DeviceBuffer a(size_t(m) * k * 2), b(size_t(k) * n * 2), c(c_bytes), snapshot(c_bytes);
  DeviceBuffer done(kMaxChunks * sizeof(uint32_t));
  fill_small_integers(a.ptr, size_t(m) * k, DataType::kFloat16, 11, fx.stream);
  fill_small_integers(b.ptr, size_t(k) * n, DataType::kFloat16, 12, fx.stream);
  cudaStream_t copies = nullptr;
  TEST_CUDA(cudaStreamCreateWithFlags(&copies, cudaStreamNonBlocking));
  long stale = 0;
  for (int round = 0; round < 3 * world; ++round) {
    const int rank = round % world;
    TEST_CUDA(cudaMemsetAsync(c.ptr, 0xFF, c_bytes, fx.stream));  // NaN
    TEST_CUDA(cudaMemsetAsync(snapshot.ptr, 0, c_bytes, fx.stream));
    TEST_CUDA(cudaMemsetAsync(done.ptr, 0, kMaxChunks * sizeof(uint32_t), fx.stream));
    const int sm_count = std::max(2, fx.sm_count / 2 / 2 * 2);  // half the SMs, whole clusters of 2
    const detail::FlaggedGemm g =
        announcing_gemm(a.ptr, b.ptr, c.ptr, world, shard_rows, n, k, 256, rank, sm_count,
                        static_cast<uint32_t*>(done.ptr));
    EXPECT(g.chunks.pieces > 1);
    cudaEvent_t ready = nullptr;
    TEST_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    TEST_CUDA(cudaEventRecord(ready, fx.stream));  // the resets above precede the copies' waits
    TEST_CUDA(cudaStreamWaitEvent(copies, ready, 0));
    detail::run_flagged_gemm(g, fx.stream);  // first: the waits below are behind it in any queue
    for (const auto& [shard, piece] : pieces_of(g, world)) {
      CUstreamBatchMemOpParams wait =
          detail::stream_wait_op(g.chunks.done + piece.chunk, target_of(g, shard, piece), CU_STREAM_WAIT_VALUE_GEQ);
      if (detail::DriverApi::get().stream_batch_mem_op(copies, 1, &wait, 0) != CUDA_SUCCESS)
        fail(__FILE__, __LINE__, "cuStreamBatchMemOp failed");
      const size_t at = size_t(shard * shard_rows + piece.first_row) * n * sizeof(float);
      TEST_CUDA(cudaMemcpyAsync(static_cast<char*>(snapshot.ptr) + at, static_cast<char*>(c.ptr) + at,
                                size_t(piece.rows) * n * sizeof(float), cudaMemcpyDeviceToDevice, copies));
    }
    TEST_CUDA(cudaStreamSynchronize(copies));
    TEST_CUDA(cudaStreamSynchronize(fx.stream));
    TEST_CUDA(cudaEventDestroy(ready));
    MismatchCounter differences;
    count_differences(snapshot.ptr, c.ptr, c_bytes, differences.get(), fx.stream);
    stale += differences.read(fx.stream);
  }
  TEST_CUDA(cudaStreamDestroy(copies));
  EXPECT_EQ(stale, 0L);
}

// B column-major (torch's W.t(): the kernel instantiated for a K-major B reads it where it lies):
// the same products as from B row-major, for both input types, both tile widths, 16-bit and
// float32 outputs, shapes on and off the tile grid. Small integers make every float32 sum exact,
// so the 16-bit outputs must equal the exact products rounded once, and the column-major kernel's
// outputs must equal the row-major one's bit for bit. C starts as NaN.
TEST(fused_gemm_reads_a_column_major_b) {
  Fixture& fx = Fixture::get();
  skip_without_fused_gemm();
  struct Case {
    int m, n, k;
  };
  const std::vector<Case> cases = {{256, 512, 1024}, {200, 264, 520}, {8, 8, 8}, {512, 1536, 1024}};
  const uint64_t iteration = 3, b_seed = pattern_seed(99, 5);
  int checked = 0;
  for (DataType type : {DataType::kFloat16, DataType::kBFloat16}) {
    const size_t elem = dtype_size(type);
    for (const Case& c : cases) {
      const size_t b_bytes = size_t(c.k) * c.n * elem, c_capacity = size_t(c.m) * c.n * sizeof(float);
      DeviceBuffer a(size_t(c.m) * c.k * elem), b_row(b_bytes), b_col(b_bytes), c_row(c_capacity), c_col(c_capacity);
      fill_small_integers(a.ptr, size_t(c.m) * c.k, type, pattern_seed(0, iteration), fx.stream);
      fill_small_integers(b_row.ptr, size_t(c.k) * c.n, type, b_seed, fx.stream);
      fill_small_integers_column_major(b_col.ptr, c.k, c.n, type, b_seed, fx.stream);
      const detail::GatherPieces pieces =
          detail::plan_gather_pieces(c.m, size_t(c.k) * elem, detail::kFlaggedGemmTileRows);
      for (bool float_out : {false, true}) {
        for (int tile_n : {192, 256}) {
          const size_t c_bytes = size_t(c.m) * c.n * (float_out ? sizeof(float) : elem);
          // One rank's GEMM with no flags and no counters: every row is local, nothing waits for C.
          auto gemm = [&](const void* b, bool column_major, void* out) {
            detail::FlaggedGemm g =
                detail::flagged_gemm_of(a.ptr, b, out, c.m, c.n, c.k, type, fx.sm_count, c.m, pieces);
            g.float_out = float_out;
            g.tile_n = tile_n;
            g.b_column_major = column_major;
            const std::string problem = detail::flagged_gemm_problem(g);
            EXPECT_EQ(problem, std::string());
            if (!problem.empty()) return false;
            TEST_CUDA(cudaMemsetAsync(out, 0xFF, c_bytes, fx.stream));  // NaN
            detail::run_flagged_gemm(g, fx.stream);
            return true;
          };
          if (!gemm(b_row.ptr, false, c_row.ptr) || !gemm(b_col.ptr, true, c_col.ptr)) continue;
          MismatchCounter wrong;
          count_differences(c_col.ptr, c_row.ptr, c_bytes, wrong.get(), fx.stream);
          if (!float_out)
            count_gathered_product_mismatches(c_col.ptr, c.m, c.n, c.k, c.m, type, iteration, b_seed, wrong.get(),
                                              fx.stream);
          const long bad = wrong.read(fx.stream);
          if (bad != 0)
            fail(__FILE__, __LINE__, std::string(dtype_name(type)) + " m " + std::to_string(c.m) + " n " +
                                         std::to_string(c.n) + " k " + std::to_string(c.k) + " tile_n " +
                                         std::to_string(tile_n) + (float_out ? " float32 out" : "") + ": " +
                                         std::to_string(bad) + " bytes or elements differ");
          ++checked;
        }
      }
    }
  }
  EXPECT(checked == 2 * 4 * 2 * 2);
}
