// The fused all-gather + GEMM's row bookkeeping, on the CPU: the pieces every shard is cut into,
// the copies that carry them, the flag every row of A maps to, and the order the GEMM takes its M
// tiles in. For many shapes: every row is copied exactly once under the flag that the GEMM's tiles
// wait for, and every tile of the schedule appears exactly once.
#include <algorithm>
#include <string>
#include <vector>

#include "fused/chunk_flags.hpp"
#include "fused/flagged_gemm.hpp"
#include "fused/fused_problems.hpp"
#include "plan/fused_plan.hpp"
#include "test.hpp"

using namespace symmem::detail;

namespace {

ChunkFlags chunks_of(int world, int shard_rows, const GatherPieces& pieces, int tile_rows, int rank) {
  ChunkFlags c{};
  c.rows = world * shard_rows;
  c.shard_rows = shard_rows;
  c.piece_rows = pieces.piece_rows;
  c.pieces = pieces.pieces;
  c.tile_rows = tile_rows;
  c.tiles = (c.rows + tile_rows - 1) / tile_rows;
  c.first_tile = rank * shard_rows / tile_rows;
  return c;
}

}  // namespace

TEST(gather_pieces_cover_every_row_once_under_the_flag_the_gemm_waits_for) {
  const int tile = 128;
  int layouts = 0;
  for (int world : {1, 2, 3, 4, 8}) {
    for (int shard_rows : {1, 7, 127, 128, 200, 1000, 2048, 4096, 8192}) {
      for (size_t row_bytes : {size_t(16), size_t(4096), size_t(32768)}) {
        const GatherPieces p = plan_gather_pieces(shard_rows, row_bytes, tile);
        EXPECT(p.pieces >= 1 && p.pieces <= kMaxGatherPieces);
        EXPECT(p.piece_rows >= 1 && p.piece_rows <= shard_rows);
        EXPECT(p.piece_rows == shard_rows || p.piece_rows % tile == 0);  // whole tiles, or the whole shard
        EXPECT((p.pieces - 1) * p.piece_rows < shard_rows && p.pieces * p.piece_rows >= shard_rows);
        for (int rank = 0; rank < world; ++rank) {
          const ChunkFlags c = chunks_of(world, shard_rows, p, tile, rank);
          std::vector<int> copied(shard_rows, 0);
          int last_end = 0;
          for (const GatherCopy& copy : plan_gather_copies(rank, shard_rows, p)) {
            EXPECT_EQ(copy.shard, rank);
            EXPECT_EQ(copy.first_row, last_end);  // in row order, no gap
            last_end = copy.first_row + copy.rows;
            for (int r = copy.first_row; r < last_end; ++r) {
              ++copied[r];
              // The GEMM waits for this row under the flag its copy sets.
              EXPECT_EQ(chunk_of_row(c, rank * shard_rows + r), copy.chunk);
            }
          }
          for (int r = 0; r < shard_rows; ++r) EXPECT_EQ(copied[r], 1);
          // The schedule visits every M tile once, the own shard's first tile first.
          std::vector<int> seen(c.tiles, 0);
          for (int position = 0; position < c.tiles; ++position) ++seen[rotated_tile(c, position)];
          for (int t = 0; t < c.tiles; ++t) EXPECT_EQ(seen[t], 1);
          EXPECT_EQ(rotated_tile(c, 0), rank * shard_rows / tile);
          EXPECT_EQ(rotated_tile(c, c.tiles), c.tiles);  // cluster padding stays put
          ++layouts;
        }
      }
    }
  }
  EXPECT(layouts > 100);
}

TEST(gather_pieces_are_about_the_target_size) {
  // 2 ranks, M = 4096, K = 16384, 16-bit: 64 MiB shards in 8 pieces of 8 MiB (256 rows).
  const GatherPieces p = plan_gather_pieces(2048, 16384 * 2, 128);
  EXPECT_EQ(p.pieces, 8);
  EXPECT_EQ(p.piece_rows, 256);
  // A small shard is one piece.
  EXPECT_EQ(plan_gather_pieces(64, 1024, 128).pieces, 1);
}

TEST(gemm_tile_width_leaves_the_fewest_sms_idle) {
  // N = 6656 on 132 SMs: 192-wide tiles fill the last wave better at every M benchmarked
  // (M = 4096: 7 waves of 256 against 9 of 192, 1792 against 1728 columns).
  for (int m : {4096, 8192, 16384}) EXPECT_EQ(flagged_gemm_tile_n(m, 6656, 132), 192);
  // N = 4096, M = 4096: 4 waves of 256 against 6 of 192.
  EXPECT_EQ(flagged_gemm_tile_n(4096, 4096, 132), 256);
  // A tie (M = 2048, N = 5120: 3 waves of 256 or 4 of 192): 256, whose tiles reuse more.
  EXPECT_EQ(flagged_gemm_tile_n(2048, 5120, 132), 256);
  // One wave either way: the narrower tiles end it sooner.
  EXPECT_EQ(flagged_gemm_tile_n(256, 768, 132), 192);
}

// matmul_reduce_scatter: the copy of piece j of shard d waits until done[d * pieces + j] reaches
// tiles_over_rows(...) * n_tiles. Replays the GEMM's announcements (every tile once, to every
// chunk chunk_of_row gives its first to last row) and checks each piece's count is exactly that:
// one less and the copy would read rows not written yet, one more and it would wait forever.
TEST(every_piece_hears_from_exactly_the_tiles_the_copy_waits_for) {
  const int tile = 128;
  int layouts = 0;
  for (int world : {1, 2, 3, 4, 8}) {
    for (int shard_rows : {1, 7, 127, 128, 200, 1000, 2048, 4096}) {
      for (size_t row_bytes : {size_t(32), size_t(26624), size_t(65536)}) {
        const GatherPieces p = plan_gather_pieces(shard_rows, row_bytes, tile);
        const ChunkFlags c = chunks_of(world, shard_rows, p, tile, 0);
        std::vector<int> heard(size_t(world) * p.pieces, 0);
        for (int t = 0; t < c.tiles; ++t) {
          const int first = t * tile, last = std::min(first + tile, c.rows) - 1;
          for (int chunk = chunk_of_row(c, first); chunk <= chunk_of_row(c, last); ++chunk) ++heard[chunk];
        }
        for (int shard = 0; shard < world; ++shard) {
          for (const GatherCopy& piece : plan_gather_copies(shard, shard_rows, p)) {
            const int first_row = shard * shard_rows + piece.first_row;
            EXPECT(heard[piece.chunk] == tiles_over_rows(first_row, piece.rows, tile));
          }
        }
        ++layouts;
      }
    }
  }
  EXPECT(layouts == 5 * 8 * 3);
  EXPECT(tiles_over_rows(0, 128, 128) == 1);
  EXPECT(tiles_over_rows(127, 2, 128) == 2);
  EXPECT(tiles_over_rows(100, 0, 128) == 0);
}

// b's layout arrives from the C ABI as an integer: the two layouts pass, anything else is refused
// naming the value (before anything is resolved or launched).
TEST(fused_b_layout_problem_refuses_an_unknown_layout) {
  EXPECT_EQ(fused_b_layout_problem("all_gather_matmul", symmem::MatrixLayout::kRowMajor), std::string());
  EXPECT_EQ(fused_b_layout_problem("all_gather_matmul", symmem::MatrixLayout::kColumnMajor), std::string());
  const std::string why = fused_b_layout_problem("matmul_reduce_scatter", static_cast<symmem::MatrixLayout>(2));
  EXPECT(why.find("matmul_reduce_scatter: b_layout 2") == 0);
}
