// The gather half of the fused all-gather, shared by all_gather_matmul (its consumer: the flagged
// CUTLASS GEMM) and all_gather_pieces (its consumer: a kernel of the caller's, e.g. a Triton GEMM).
//
// DATA MOVEMENT (rank r of W; all_gather_matmul.cpp has the why of each step):
//   caller's stream: r's own shard -> slot r of `gathered` (skipped in place). Its flags are
//                    neither written nor waited for: it precedes the consumer in stream order.
//   side stream 0:   forked after it: the ready handshake (board/handshake.hpp: every peer's slot
//                    holds its shard of this call, and the calls match), then every peer's slot is
//                    PULLED into r's own piece by piece on up to W - 1 lanes (copy engines, zero
//                    SMs), each piece followed by a stream write of 1 into r's flag for it
//                    (flags[shard * pieces + piece]); then the done handshake (no peer reads r's
//                    slot any more).
//   caller's stream: the consumer, then the join of side stream 0 and the reset of the flags to 0,
//                    before anything of the next call. Every flag is r's own and written by r's
//                    streams only.
// Where the branches may share a hardware queue in an order the call cannot choose (a capture
// where fused_problems.hpp says so, and ranks sharing a GPU, tests only, at all) nothing branches:
// every step above runs on the caller's stream, ahead of the consumer.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>

#include "collectives/operands.hpp"
#include "plan/fused_plan.hpp"

namespace symmem::detail {

struct CommunicatorState;

struct PieceGather {
  Resolved gathered;  // symmetric: world shards of shard_rows rows
  int rank = 0;
  int world = 1;
  int shard_rows = 0;
  size_t row_bytes = 0;
  GatherPieces pieces;
  const uint32_t* flags = nullptr;  // world * pieces.pieces words of this rank, 0 between calls
  bool in_place = false;            // a_shard is this rank's slot of gathered
};

// One call (inside its EnqueueScope, signed with `signature`): the gather half above around
// consume(), which enqueues the consumer on `stream`. On an exception (the consumer's included)
// it joins what was forked, resets the flags, poisons the communicator when the call was eager
// (the handshake sequence may be broken; `op` names the call) and rethrows.
void gather_pieces_around(CommunicatorState& st, const PieceGather& g, const void* a_shard, uint32_t signature,
                          cudaStream_t stream, const char* op, const std::function<void()>& consume);

}  // namespace symmem::detail
