// all_gather_pieces (include/symmem/all_gather_pieces.hpp): the gather half of all_gather_matmul
// (fused/piece_gather.hpp) around a consumer of the caller's, with the same ordering, signing,
// failure handling and flag reset as all_gather_matmul.
#include "symmem/all_gather_pieces.hpp"

#include <string>

#include "board/call_signature.hpp"
#include "collectives/operands.hpp"
#include "collectives/validate.hpp"
#include "comm/communicator_state.hpp"
#include "comm/refusal.hpp"
#include "common/device_guard.hpp"
#include "fused/piece_gather.hpp"
#include "plan/fused_plan.hpp"

namespace symmem {

namespace {
constexpr const char* kOp = "all_gather_pieces";
}

void all_gather_pieces(Operand gathered, const void* shard, int64_t m, size_t row_bytes, int tile_rows,
                       Communicator& comm, cudaStream_t stream,
                       const std::function<void(const GatheredPieces&)>& consume) {
  detail::CommunicatorState& st = detail::state_of(comm);
  st.ensure_usable(kOp);
  st.require_one_node(kOp);
  detail::DeviceGuard guard(st.device);
  const int rank = st.rank, world = st.world;
  if (m <= 0 || m % world != 0 || row_bytes == 0 || tile_rows <= 0)
    throw Error(ErrorCode::kInvalidArgument, std::string(kOp) + ": m = " + std::to_string(m) +
                                                 " rows must be a positive multiple of the " + std::to_string(world) +
                                                 " ranks, row_bytes (" + std::to_string(row_bytes) +
                                                 ") and tile_rows (" + std::to_string(tile_rows) + ") positive");
  if (!st.copy_engine || !st.board) throw Error(ErrorCode::kInternal, std::string(kOp) + ": no copy-engine state");
  // The shape above is every rank's alike (a plain error); the operands are this rank's own (refused).
  detail::PieceGather g = detail::checked_or_refused(st, detail::kOpAllGatherPieces, kOp, stream, [&] {
    if (!gathered.symmetric())
      throw Error(ErrorCode::kInvalidArgument, std::string(kOp) +
                                                   ": gathered must be a symmetric operand (a heap Buffer and "
                                                   "offset): the peers read their shards from it");
    detail::PieceGather checked;
    checked.rank = rank;
    checked.world = world;
    checked.shard_rows = static_cast<int>(m / world);
    checked.row_bytes = row_bytes;
    const size_t shard_bytes = size_t(checked.shard_rows) * row_bytes;
    checked.gathered = detail::resolve(gathered, size_t(m) * row_bytes, "gathered", kOp, st);
    char* own_slot = static_cast<char*>(checked.gathered.local) + size_t(rank) * shard_bytes;
    checked.in_place = shard == own_slot;
    if (!checked.in_place) {
      detail::require_device_pointer(shard, shard_bytes, "shard", kOp, comm);
      detail::require_no_partial_overlap(checked.gathered.local, size_t(m) * row_bytes, shard, shard_bytes, false,
                                         kOp);
    }
    return checked;
  });
  g.pieces = detail::plan_gather_pieces(g.shard_rows, row_bytes, tile_rows);
  g.flags = st.workspaces->fused_flags();  // all_gather_matmul's piece flags: one fused call at a time
  // Signed with everything the ranks must agree on (in place is this rank's own affair).
  const detail::CallDescriptor call = detail::make_gather_pieces_descriptor(m, row_bytes, tile_rows,
                                                                            g.gathered.heap_offset);

  detail::EnqueueScope enqueue(st, stream);
  const uint32_t signature = st.sign_call(call);
  detail::gather_pieces_around(st, g, shard, signature, stream, kOp, [&] {
    consume(GatheredPieces{g.flags, g.pieces.pieces, g.pieces.piece_rows, g.shard_rows, rank, world});
  });
}

}  // namespace symmem
