// The row geometry the persistent GEMM's scheduler shares with the copies beside it: the M rows
// [0, rows) are `world` shards of `shard_rows` rows, each in `pieces` pieces of `piece_rows` rows
// (the last one shorter); chunk s * pieces + j is piece j of shard s.
//   all_gather_matmul (flags set, done null): the rows of A arrive. Piece j of shard s is present
// once flags[chunk] != 0; the flags are set by this rank's stream memory operations after each
// piece's copy and reset to 0 on this rank's stream after the GEMM (src/fused/all_gather_matmul.cpp).
// The shard ready_shard is in place before the GEMM starts: its flags are neither waited for nor set.
//   matmul_reduce_scatter (flags null, done set): the rows of C leave. After a tile's output is in
// global memory, done[chunk] is incremented once for every chunk the tile's rows touch; the copy
// streams wait until it reaches the chunk's tile count (tiles_over_rows) and reset it after the
// call (src/fused/matmul_reduce_scatter.cpp).
// Plain struct for host and device.
#pragma once

#include <cstdint>

#include "device/device_types.hpp"

namespace symmem::detail {

struct ChunkFlags {
  const uint32_t* flags;  // world * pieces words of this rank's device memory, or null
  uint32_t* done;         // world * pieces tile counters in this rank's device memory, or null
  int rows;               // M
  int shard_rows;         // M / world
  int piece_rows;         // ceil(shard_rows / pieces)
  int pieces;             // per shard
  int tile_rows;          // the GEMM's tile height
  int tiles;              // ceil(rows / tile_rows)
  int first_tile;         // the tile the GEMM computes first (then first_tile + 1, ..., wrapping)
  int n_tiles;            // done only: the GEMM's tiles along N (the scheduler may pad beyond them)
  int store_groups;       // done only: bulk store groups the epilogue commits per tile (flagged_gemm.cuh)
  // flags only: the shard whose rows precede the GEMM on its own stream (all_gather_matmul: this
  // rank's own), so its tiles wait for no flag and nothing writes its flags; -1: none.
  int ready_shard = -1;
  SyncArgs sync;          // deadline, abort word and failure record of the waits (no barrier flags)
};

// The flag index of a row of A.
SYMMEM_HOST_DEVICE inline int chunk_of_row(const ChunkFlags& c, int row) {
  const int shard = row / c.shard_rows;
  int piece = (row - shard * c.shard_rows) / c.piece_rows;
  if (piece >= c.pieces) piece = c.pieces - 1;
  return shard * c.pieces + piece;
}

// The M tile computed at position `position` of the schedule: first_tile, then the following ones
// in row order, wrapping around (all_gather_matmul: the own shard's first, then the next ranks' in
// the order their pieces arrive; matmul_reduce_scatter: the next rank's first, the own last).
SYMMEM_HOST_DEVICE inline int rotated_tile(const ChunkFlags& c, int position) {
  if (position >= c.tiles) return position;  // cluster padding beyond M: left as it is
  const int t = position + c.first_tile;
  return t >= c.tiles ? t - c.tiles : t;
}

}  // namespace symmem::detail
