// The gather half of the fused all-gather, shared by all_gather_matmul (its consumer: the flagged
// CUTLASS GEMM) and all_gather_pieces (its consumer: a kernel of the caller's, e.g. a Triton GEMM).
//
// DATA MOVEMENT (rank r of W; all_gather_matmul.cpp has the why of each step):
//   caller's stream: r's own shard -> slot r of `gathered` (skipped in place). Its flags are
//                    neither written nor waited for: it precedes the consumer in stream order.
//   side stream 0:   forked after it: the ready handshake (every peer's slot holds its shard of
//                    this call, and the calls match), then every peer's slot is PULLED into r's
//                    own piece by piece on up to W - 1 lanes (copy engines, zero SMs), each piece
//                    followed by a stream write of 1 into r's flag for it
//                    (flags[shard * pieces + piece]); then the done handshake (no peer reads r's
//                    slot any more).
// The caller enqueues its consumer on its stream after this returns, then joins side stream 0
// (SideStreams::join_control) and resets the flags to 0 on its stream, before anything of the
// next call. Every flag is r's own and written by r's streams only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "collectives/operands.hpp"
#include "fused/side_streams.hpp"
#include "plan/fused_plan.hpp"

namespace symmem::detail {

class HostBoard;

struct PieceGather {
  Resolved gathered;     // symmetric: world shards of shard_rows rows
  int rank = 0;
  int world = 1;
  int shard_rows = 0;
  size_t row_bytes = 0;
  GatherPieces pieces;
  const uint32_t* flags = nullptr;  // world * pieces.pieces words of this rank, 0 between calls
  bool in_place = false;            // a_shard is this rank's slot of gathered
};

// Enqueues the gather half above: the own shard on `stream`, the rest forked from it onto `sides`
// (side stream 0 stays forked: the caller joins it after its consumer).
void enqueue_piece_gather(const PieceGather& g, const void* a_shard, const HostBoard& board, uint32_t signature,
                          SideStreams& sides, cudaStream_t stream);

}  // namespace symmem::detail
