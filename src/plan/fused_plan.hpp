// Planning of the fused all-gather + GEMM: how each shard of A is cut into pieces the GEMM waits
// for, and which copy stream carries which piece. Pure C++ (CPU-tested).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace symmem::detail {

struct GatherPieces {
  int pieces = 1;      // per shard
  int piece_rows = 0;  // rows per piece (the last piece of a shard may be shorter)
};

// A piece is about kGatherPieceTarget bytes, a whole number of `tile_rows` (so that a tile of the
// GEMM waits for one piece where shards are whole tiles), and a shard has at most
// kMaxGatherPieces: fine enough that the GEMM starts on the own shard after a small first copy,
// coarse enough that per-copy overheads stay negligible.
constexpr size_t kGatherPieceTarget = size_t(8) << 20;
constexpr int kMaxGatherPieces = 8;
GatherPieces plan_gather_pieces(int shard_rows, size_t row_bytes, int tile_rows);

// One copy of the fused all-gather: rows [first_row, first_row + rows) of shard `shard`
// (shard-relative), flagged as chunk `chunk` when it has landed.
struct GatherCopy {
  int shard;
  int first_row;
  int rows;
  int chunk;
};

// The copies of this rank's shard in the order they are issued: to `destination` (a rank, or
// this rank itself for the own copy). Every row of the shard exactly once, in row order.
std::vector<GatherCopy> plan_gather_copies(int rank, int shard_rows, const GatherPieces& pieces);

// How many `tile_rows`-row tiles (tile t: rows [t * tile_rows, (t + 1) * tile_rows)) hold a row of
// [first_row, first_row + rows); 0 when rows <= 0. matmul_reduce_scatter's GEMM announces each tile
// once to every piece its rows touch, so a piece is complete after this many tiles per N column.
int tiles_over_rows(int first_row, int rows, int tile_rows);
// The count done[] of piece `piece` of shard `shard` reaches once all its tiles are announced:
// tiles_over_rows of its rows times the GEMM's tiles along N.
uint32_t piece_tile_count(int shard, int shard_rows, const GatherCopy& piece, int tile_rows, int n_tiles);

}  // namespace symmem::detail
