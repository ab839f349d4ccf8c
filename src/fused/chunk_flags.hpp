// Where the rows of the gathered A come from, as the persistent GEMM of all_gather_matmul sees them:
// A [rows x k] is `world` shards of `shard_rows` rows; each shard arrives in `pieces` pieces of
// `piece_rows` rows (the last one shorter), and piece j of shard s is present once
// flags[s * pieces + j] != 0. The flags are set by this rank's stream memory operations after each
// piece's copy (its own shard's, and the pulls of the peers') and reset to 0 on this rank's stream
// after the GEMM (src/fused/all_gather_matmul.cpp). Plain struct for host and device.
#pragma once

#include <cstdint>

#include "device/device_types.hpp"

namespace symmem::detail {

struct ChunkFlags {
  const uint32_t* flags;  // world * pieces words of this rank's device memory
  int rows;               // M
  int shard_rows;         // M / world
  int piece_rows;         // ceil(shard_rows / pieces)
  int pieces;             // per shard
  int tile_rows;          // the GEMM's tile height
  int tiles;              // ceil(rows / tile_rows)
  int first_tile;         // the tile the GEMM computes first: the own shard's first one
  SyncArgs sync;          // deadline, abort word and failure record of the waits (no barrier flags)
};

// The flag index of a row of A.
SYMMEM_HOST_DEVICE inline int chunk_of_row(const ChunkFlags& c, int row) {
  const int shard = row / c.shard_rows;
  int piece = (row - shard * c.shard_rows) / c.piece_rows;
  if (piece >= c.pieces) piece = c.pieces - 1;
  return shard * c.pieces + piece;
}

// The M tile computed at position `position` of the schedule: the own shard's tiles first, then
// the following shards' in rank order (the order their pieces arrive in), wrapping around.
SYMMEM_HOST_DEVICE inline int rotated_tile(const ChunkFlags& c, int position) {
  if (position >= c.tiles) return position;  // cluster padding beyond M: left as it is
  const int t = position + c.first_tile;
  return t >= c.tiles ? t - c.tiles : t;
}

}  // namespace symmem::detail
