#include "fused/piece_gather.hpp"

#include <cuda.h>

#include <string>
#include <vector>

#include "board/handshake.hpp"
#include "board/wait_word.hpp"
#include "comm/communicator_state.hpp"
#include "common/check.hpp"
#include "common/driver_api.hpp"
#include "common/stream_capture.hpp"
#include "fused/fused_problems.hpp"
#include "fused/side_streams.hpp"

namespace symmem::detail {
namespace {

void write_flag(const uint32_t* flag, cudaStream_t stream) {
  CUstreamBatchMemOpParams op = stream_write_op(flag, 1u);
  SYMMEM_CU_CHECK(DriverApi::get().stream_batch_mem_op(stream, 1, &op, 0));
}

// Copies of a peer's shard from `from` into `to` (both the shard's first row), piece by piece,
// each followed by the write of this rank's flag for the piece.
void enqueue_peer_copies(const PieceGather& g, int shard, const void* from, void* to, cudaStream_t stream) {
  for (const GatherCopy& piece : plan_gather_copies(shard, g.shard_rows, g.pieces)) {
    const size_t at = size_t(piece.first_row) * g.row_bytes;
    SYMMEM_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(to) + at, static_cast<const char*>(from) + at,
                                      size_t(piece.rows) * g.row_bytes, cudaMemcpyDeviceToDevice, stream));
    write_flag(g.flags + piece.chunk, stream);
  }
}

// The gather half (piece_gather.hpp): the own shard on `stream`, the rest forked from it onto
// `sides` (side stream 0 stays forked: the caller joins it after its consumer).
void enqueue_piece_gather(const PieceGather& g, const void* a_shard, const HostBoard& board, uint32_t signature,
                          SideStreams& sides, cudaStream_t stream) {
  const size_t shard_bytes = size_t(g.shard_rows) * g.row_bytes;
  char* gathered = static_cast<char*>(g.gathered.local);
  // The own shard, on SMs before the consumer takes them (copies within one GPU are kernels).
  if (!g.in_place)
    SYMMEM_CUDA_CHECK(cudaMemcpyAsync(gathered + size_t(g.rank) * shard_bytes, a_shard, shard_bytes,
                                      cudaMemcpyDeviceToDevice, stream));
  // Invariant (caller's stream): this rank's slot holds its shard.
  sides.fork_control();
  if (g.world == 1) return;
  cudaStream_t control = sides.control();
  enqueue_handshake(board, g.rank, g.world, WaitWord::kPhaseReady, signature, control);
  // Invariant: every peer's slot holds its shard of this call.
  const std::vector<cudaStream_t> lanes = sides.fork_lanes(g.world - 1);
  for (int i = 0; i < g.world - 1; ++i) {
    const int peer = (g.rank + 1 + i) % g.world;
    const size_t slot = size_t(peer) * shard_bytes;
    enqueue_peer_copies(g, peer, g.gathered.peer(peer, slot), gathered + slot, lanes[i % lanes.size()]);
  }
  sides.join_lanes();
  enqueue_handshake(board, g.rank, g.world, WaitWord::kPhaseDone, signature, control);
  // Invariant (control stream): every slot holds its shard; no peer reads this rank's slot any more.
}

}  // namespace

void gather_pieces_around(CommunicatorState& st, const PieceGather& g, const void* a_shard, uint32_t signature,
                          cudaStream_t stream, const char* op, const std::function<void()>& consume) {
  const bool capturing = stream_is_capturing(stream);
  const size_t flag_bytes = size_t(g.world) * g.pieces.pieces * sizeof(uint32_t);
  // Branches only where they cannot share a hardware queue in an order the call cannot choose:
  // under capture (fused_problems.hpp), and for ranks sharing a GPU (tests only) at all, whose
  // streams share its queues.
  const bool branch = capturing ? !captured_branches_may_share_a_queue(st) : st.ranks_on_gpu <= 1;
  SideStreams sides(*st.copy_engine, stream, branch);
  try {
    enqueue_piece_gather(g, a_shard, *st.board, signature, sides, stream);
    consume();
    sides.join_control();
    SYMMEM_CUDA_CHECK(cudaMemsetAsync(const_cast<uint32_t*>(g.flags), 0, flag_bytes, stream));
    // Invariant: this rank's flags are 0 again, before anything of the next call.
  } catch (const std::exception& e) {
    // Leave no side stream forked (a capture would fail to end) and no flag set.
    sides.unwind();
    SYMMEM_CUDA_CHECK_NOTHROW(cudaMemsetAsync(const_cast<uint32_t*>(g.flags), 0, flag_bytes, stream));
    // Eagerly, a handshake may have been enqueued without its partner: the sequence every rank
    // relies on is broken, so the communicator is unusable from here on, on every rank. Under
    // capture nothing ran (the graph is the caller's to discard).
    if (!capturing) st.poison(std::string(op) + " failed while enqueuing its work: " + e.what());
    throw;
  }
}

}  // namespace symmem::detail
