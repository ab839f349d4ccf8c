#include "plan/fused_plan.hpp"

#include <algorithm>

namespace symmem::detail {

GatherPieces plan_gather_pieces(int shard_rows, size_t row_bytes, int tile_rows) {
  GatherPieces p;
  if (shard_rows <= 0) return p;
  tile_rows = std::max(tile_rows, 1);
  const size_t shard_bytes = size_t(shard_rows) * row_bytes;
  int wanted = static_cast<int>(std::clamp<size_t>(shard_bytes / kGatherPieceTarget, 1, kMaxGatherPieces));
  // Whole tiles per piece, and never more pieces than tiles.
  const int tiles = (shard_rows + tile_rows - 1) / tile_rows;
  wanted = std::min(wanted, tiles);
  const int tiles_per_piece = (tiles + wanted - 1) / wanted;
  p.piece_rows = std::min(tiles_per_piece * tile_rows, shard_rows);
  p.pieces = (shard_rows + p.piece_rows - 1) / p.piece_rows;
  return p;
}

std::vector<GatherCopy> plan_gather_copies(int rank, int shard_rows, const GatherPieces& pieces) {
  std::vector<GatherCopy> copies;
  for (int j = 0; j < pieces.pieces; ++j) {
    const int first = j * pieces.piece_rows;
    const int rows = std::min(pieces.piece_rows, shard_rows - first);
    if (rows <= 0) break;
    copies.push_back({rank, first, rows, rank * pieces.pieces + j});
  }
  return copies;
}

int tiles_over_rows(int first_row, int rows, int tile_rows) {
  if (rows <= 0 || tile_rows <= 0) return 0;
  return (first_row + rows - 1) / tile_rows - first_row / tile_rows + 1;
}

uint32_t piece_tile_count(int shard, int shard_rows, const GatherCopy& piece, int tile_rows, int n_tiles) {
  const int first_row = shard * shard_rows + piece.first_row;
  return uint32_t(tiles_over_rows(first_row, piece.rows, tile_rows)) * uint32_t(n_tiles);
}

}  // namespace symmem::detail
