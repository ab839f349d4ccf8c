#include "board/handshake.hpp"

#include <string>

#include "board/wait_word.hpp"
#include "common/check.hpp"
#include "common/driver_api.hpp"

namespace symmem::detail {

// One handshake as one batch of stream memory operations, executed in order (handshake.hpp):
// tell every peer, publish this wait, wait for every peer, mark the wait passed, reset.
void enqueue_handshake(const HostBoard& board, int rank, int world, uint32_t phase, uint32_t signature,
                       cudaStream_t stream) {
  CUstreamBatchMemOpParams ops[3 * (kMaxWorld - 1) + 6] = {};
  unsigned count = 0;
  // Every write is the default one: preceded by a system-scope fence.
  auto write = [&](const uint32_t* address, uint32_t value) { ops[count++] = stream_write_op(address, value); };
  BoardPage* mine = board.device_page(rank);
  for (int k = 1; k < world; ++k) {
    const int p = (rank + k) % world;
    write(awaited_word(board.device_page(p), phase, 0, rank), signature);
  }
  enqueue_watched_wait(mine, rank, world, phase, BoardPage::kEveryPeer, 0, signature, ops, count);
  SYMMEM_CU_CHECK(DriverApi::get().stream_batch_mem_op(stream, count, ops, 0));
}

// The watched wait of one batch (handshake.hpp): publish which wait it is, mark it entered,
// wait for every awaited word, mark it passed, reset the words. A peer writes a word again only
// after this rank's next write to it, whose fence orders these resets first.
void enqueue_watched_wait(BoardPage* mine, int rank, int world, uint32_t phase, uint32_t wait_peer, uint32_t piece,
                          uint32_t signature, CUstreamBatchMemOpParams* ops, unsigned& count) {
  auto write = [&](const uint32_t* address, uint32_t value) { ops[count++] = stream_write_op(address, value); };
  write(&mine->ce_signature, signature);
  // After S (fenced): the watchdog that reads the 1 reads S and, in the same word, which wait.
  write(&mine->ce_wait_state, WaitWord::make(WaitWord::kEntered, phase, wait_peer, piece));
  for_each_awaited_peer(rank, world, wait_peer, [&](int p) {
    ops[count++] = stream_wait_op(awaited_word(mine, phase, piece, p), signature, CU_STREAM_WAIT_VALUE_EQ);
  });
  write(&mine->ce_wait_state, WaitWord::kPassed);
  for_each_awaited_peer(rank, world, wait_peer, [&](int p) { write(awaited_word(mine, phase, piece, p), 0); });
}

namespace {
void require_piece(int rank, int world, int peer, int piece) {
  if (peer < 0 || peer >= world || peer == rank || piece < 0 || piece >= BoardPage::kPieceSignals)
    throw Error(ErrorCode::kInternal,
                "piece signal: peer " + std::to_string(peer) + " or piece " + std::to_string(piece) + " out of range");
}
}  // namespace

void enqueue_piece_signal(const HostBoard& board, int rank, int peer, int piece, uint32_t signature,
                          const uint32_t* count, uint32_t at_least, cudaStream_t stream) {
  require_piece(rank, kMaxWorld, peer, piece);
  CUstreamBatchMemOpParams ops[2] = {
      stream_wait_op(count, at_least, CU_STREAM_WAIT_VALUE_GEQ),
      stream_write_op(awaited_word(board.device_page(peer), WaitWord::kPhasePiece, piece, rank), signature)};
  SYMMEM_CU_CHECK(DriverApi::get().stream_batch_mem_op(stream, 2, ops, 0));
}

void enqueue_piece_wait(const HostBoard& board, int rank, int world, int peer, int piece, uint32_t signature,
                        cudaStream_t stream) {
  require_piece(rank, world, peer, piece);
  CUstreamBatchMemOpParams ops[8] = {};
  unsigned count = 0;
  enqueue_watched_wait(board.device_page(rank), rank, world, WaitWord::kPhasePiece, uint32_t(peer), uint32_t(piece),
                       signature, ops, count);
  SYMMEM_CU_CHECK(DriverApi::get().stream_batch_mem_op(stream, count, ops, 0));
}

}  // namespace symmem::detail
