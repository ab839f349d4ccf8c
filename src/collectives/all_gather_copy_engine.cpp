// All-gather by the copy engines: zero SMs. A ready handshake, the copies, a done handshake
// (board/handshake.hpp says the protocol and why it cannot lose a flag; board/copy_engine_watchdog.hpp
// how a dead, slow or mismatched peer fails instead of hanging).
#include <string>
#include <vector>

#include "board/handshake.hpp"
#include "board/wait_word.hpp"
#include "collectives/all_gather_paths.hpp"
#include "collectives/copy_engine_copies.hpp"
#include "comm/communicator_state.hpp"
#include "common/check.hpp"
#include "common/stream_capture.hpp"
#include "plan/copy_engine_pieces.hpp"

namespace symmem::detail {

void all_gather_copy_engine(CommunicatorState& state, const CopyEngineCall& call, cudaStream_t stream) {
  if (!state.copy_engine || !state.board)
    throw Error(ErrorCode::kInternal, "all_gather(copy_engine): the copy-engine state is missing");
  if (call.signature == 0)
    throw Error(ErrorCode::kInternal, "all_gather(copy_engine): signature 0 cannot be told from an empty flag");
  CopyEngineStreams& ce = *state.copy_engine;
  const HostBoard& board = *state.board;
  const int world = state.world;
  const int rank = state.rank;
  if (call.bytes == 0) return;  // equal on every rank (the signature covers the count): nothing to order
  for (int p = 0; p < world; ++p) {
    if (p != rank && (call.push ? call.out_peers[p] == nullptr : call.in_peers[p] == nullptr))
      throw Error(ErrorCode::kInternal, std::string("all_gather(copy_engine): no ") + (call.push ? "output" : "input") +
                                            " address of rank " + std::to_string(p));
  }

  const bool capturing = stream_is_capturing(stream);

  if (world > 1) enqueue_handshake(board, rank, world, WaitWord::kPhaseReady, call.signature, stream);
  // Invariant: every peer's input holds this call's data and its output may be overwritten.

  // Batched copies cannot be captured; a batch of one copy (two ranks) only adds the batch call's
  // cost (2 x H200, 1 MiB per rank: 27.3 us batched, 25.8 plain).
  const bool batchable = ce.batch() && !capturing;
  const auto pieces = plan_copy_engine(rank, world, call.bytes, batchable ? 1 : ce.streams(), ce.piece_bytes());
  // Pull (the default) writes only this rank's output; push writes this rank's slot of every
  // peer's output (board/copy_engine_watchdog.hpp says what that risks after a timeout).
  char* out = static_cast<char*>(call.out);
  const char* in = static_cast<const char*>(call.in);
  const size_t stride = call.slot_stride;
  std::vector<EngineCopy> copies;
  copies.reserve(pieces.size());
  for (const auto& piece : pieces) {
    if (call.push)
      copies.push_back({static_cast<char*>(call.out_peers[piece.peer]) + size_t(rank) * stride + piece.offset,
                        in + piece.offset, piece.bytes, piece.stream});
    else
      copies.push_back({out + size_t(piece.peer) * stride + piece.offset,
                        static_cast<const char*>(call.in_peers[piece.peer]) + piece.offset, piece.bytes, piece.stream});
  }
  const EngineCopy own{out + size_t(rank) * stride, in, call.bytes, 0};
  enqueue_copies(ce, copies, call.copy_own ? &own : nullptr, batchable, stream);

  if (world > 1) enqueue_handshake(board, rank, world, WaitWord::kPhaseDone, call.signature, stream);
  // Invariant: no peer reads this rank's input any more (pull); every slot of this rank's output
  // arrived (push: the peers' done writes follow their copies).
}

}  // namespace symmem::detail
