#include "fused/piece_gather.hpp"

#include <cuda.h>

#include <vector>

#include "collectives/copy_engine_state.hpp"
#include "collectives/copy_engine_steps.hpp"
#include "common/check.hpp"
#include "common/driver_api.hpp"

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

}  // namespace

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
  enqueue_handshake(board, g.rank, g.world, CopyEngineState::kPhaseReady, signature, control);
  // Invariant: every peer's slot holds its shard of this call.
  const std::vector<cudaStream_t> lanes = sides.fork_lanes(g.world - 1);
  for (int i = 0; i < g.world - 1; ++i) {
    const int peer = (g.rank + 1 + i) % g.world;
    const size_t slot = size_t(peer) * shard_bytes;
    enqueue_peer_copies(g, peer, g.gathered.peer(peer, slot), gathered + slot, lanes[i % lanes.size()]);
  }
  sides.join_lanes();
  enqueue_handshake(board, g.rank, g.world, CopyEngineState::kPhaseDone, signature, control);
  // Invariant (control stream): every slot holds its shard; no peer reads this rank's slot any more.
}

}  // namespace symmem::detail
