// The copy-engine handshakes between the local ranks, as stream memory operations on host board
// words (zero SMs): a ready and a done handshake around the copies of a call, and the piece
// signals of matmul_reduce_scatter. Every wait is a watched wait: the copy-engine watchdog
// (copy_engine_watchdog.hpp) times it from when the GPU reached it and releases it on a failure,
// so none can block forever. Used by the copy-engine and hierarchical all-gathers and the fused
// ops.
//
// HANDSHAKE. One cuStreamBatchMemOp per handshake (stream memory operations: no kernel, no SM).
// S is the call's signature (nonzero); page(r) is rank r's board page, which the GPUs address
// through its device mapping. Every write is the default one, preceded by a system-scope fence
// (the v2 API the driver gives us has no unfenced write), so each write is visible only after
// everything this stream wrote before it.
//   ready: write S into page(p).ce_ready[me] for every peer p         (my input is visible first)
//          write ce_signature = S, then ce_wait_state = 1 | which wait (phase 0) into page(me)
//                                                                     (a watchdog that reads the 1
//                                                                      reads this wait's phase and S)
//          wait until page(me).ce_ready[p] == S for every peer p
//          write ce_wait_state = 2, then page(me).ce_ready[p] = 0 for every peer p
//          -> every peer's input holds this call's data (pull); every peer's output may be written (push)
//   (then the copies that the ready handshake allows: collectives/copy_engine_copies.hpp, fused/)
//   done:  the same with ce_done and phase 1, after the copies joined (the fence of the first
//          done write makes the copies' writes visible before it)
//          -> every peer finished reading my input (pull); my output holds every slot (push)
//
// PIECES (matmul_reduce_scatter, between a ready and a done handshake). Peer p's stream writes S
// into page(me).ce_piece[p][j] once piece j of what it made for me may be read; my stream writes
// S, then ce_wait_state = 1 | (phase 2, peer p, piece j), waits until that one word is S, writes
// ce_wait_state = 2 and resets the word. The watchdog (copy_engine_watchdog.hpp) times and
// releases it as a handshake wait (the same words of this rank's page: a failed or released piece
// wait reads a dead peer's memory into this rank's own, never writes a peer). Only one stream of a
// rank waits at a time (side stream 0), as ce_wait_state requires. A peer writes piece j's word of
// the next call only after passing that call's ready handshake, which needs my ready write of
// that call, which my stream issues after this call's piece resets: no signal is lost or misread.
//
// WHY FLAGS ARE NEVER LOST OR MISREAD. Peer p writes its next call's ready into my page only after
// passing this call's done wait, which needs my done write, which my stream issues after
// resetting my ready words (and the fence before that done write orders the resets before it).
// Likewise p's next done write follows its next ready wait, which needs my next ready write,
// which follows my done reset. So when my stream starts a wait, each word it waits on holds 0 (the
// peer has not arrived yet) or exactly what the peer wrote for its matching call: S when it made
// the same call, another signature when it made a different one. The argument is about order, not
// values, so carrying S instead of a constant 1 changes nothing in it; it adds the mismatch check,
// and since S is fixed per call site the flags stay right across CUDA graph replays.
//
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "board/host_board.hpp"

namespace symmem::detail {

// One handshake of `phase` (WaitWord::kPhaseReady or kPhaseDone) with every local peer, as one
// batch of stream memory operations on `stream`. A ready and a done handshake alternate.
void enqueue_handshake(const HostBoard& board, int rank, int world, uint32_t phase, uint32_t signature,
                       cudaStream_t stream);

// The stream memory operations of one watched wait, appended to ops[count...] (6 + 2 * (world - 1)
// of them at most): of `phase` for every peer (wait_peer == BoardPage::kEveryPeer) or for peer
// wait_peer's signal of `piece` (phase kPhasePiece).
void enqueue_watched_wait(BoardPage* mine, int rank, int world, uint32_t phase, uint32_t wait_peer, uint32_t piece,
                          uint32_t signature, CUstreamBatchMemOpParams* ops, unsigned& count);

// matmul_reduce_scatter's piece signals: once *count >= at_least (this rank's GEMM has stored the
// piece), tell `peer` that piece `piece` of what this rank made for it may be read (one batch);
// and wait (watched, bounded) for peer `peer`'s signal of `piece` to this rank.
void enqueue_piece_signal(const HostBoard& board, int rank, int peer, int piece, uint32_t signature,
                          const uint32_t* count, uint32_t at_least, cudaStream_t stream);
void enqueue_piece_wait(const HostBoard& board, int rank, int world, int peer, int piece, uint32_t signature,
                        cudaStream_t stream);

}  // namespace symmem::detail
