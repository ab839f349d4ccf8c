// The steps the copy-engine all-gather is made of, shared with the hierarchical all-gather: the
// handshake (its protocol and why it cannot lose a flag: copy_engine_state.hpp) and a set of copies
// spread over the copy engines. Zero SMs.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace symmem::detail {

class CopyEngineState;
class HostBoard;

// One handshake of `phase` (CopyEngineState::kPhaseReady or kPhaseDone) with every local peer, as
// one batch of stream memory operations on `stream`. A ready and a done handshake alternate.
void enqueue_handshake(const HostBoard& board, int rank, int world, uint32_t phase, uint32_t signature,
                       cudaStream_t stream);

struct BoardPage;

// The stream memory operations of one watched wait (copy_engine_state.hpp), appended to ops[count...]
// (6 + 2 * (world - 1) of them at most): of `phase` for every peer (wait_peer ==
// BoardPage::kEveryPeer) or for peer wait_peer's signal of `piece` (phase kPhasePiece).
void enqueue_watched_wait(BoardPage* mine, int rank, int world, uint32_t phase, uint32_t wait_peer, uint32_t piece,
                          uint32_t signature, CUstreamBatchMemOpParams* ops, unsigned& count);

// matmul_reduce_scatter's piece signals: once *count >= at_least (this rank's GEMM has stored the
// piece), tell `peer` that piece `piece` of what this rank made for it may be read (one batch);
// and wait (watched, bounded) for peer `peer`'s signal of `piece` to this rank.
void enqueue_piece_signal(const HostBoard& board, int rank, int peer, int piece, uint32_t signature,
                          const uint32_t* count, uint32_t at_least, cudaStream_t stream);
void enqueue_piece_wait(const HostBoard& board, int rank, int world, int peer, int piece, uint32_t signature,
                        cudaStream_t stream);

struct EngineCopy {
  void* dst;
  const void* src;
  size_t bytes;
  int stream;  // side stream index (modulo the side streams) when the copies are not batched
};

// Enqueues `copies` (one cudaMemcpyBatchAsync when `batchable` and there are several; batching
// cannot be captured): the first stream's share on `stream` itself, the other shares forked onto
// side streams, `own` (may be null) on a side stream beside them; every side stream used is
// joined back into `stream` before this returns.
void enqueue_copies(CopyEngineState& ce, const std::vector<EngineCopy>& copies, const EngineCopy* own, bool batchable,
                    cudaStream_t stream);

}  // namespace symmem::detail
