// The hierarchical all-gather: NCCL between nodes, the copy engines inside each node, every byte
// straight to its final offset, zero SMs. Its schedule (which bytes move where, and why in that
// order) is plan_hierarchical_all_gather's (src/plan/hierarchical_plan.hpp); this file enqueues it.
//
// Streams. The network steps run on the between-nodes stream, forked from the caller's stream at
// the start, so piece k + 1 crosses the network while the caller's stream broadcasts piece k. The
// caller's stream runs, in order:
//   ready, the own node's copies, done              (beside the network from the start)
//   per piece k: wait for piece k's network event; ready, piece k's broadcast copies, done
// The ready handshake of piece k tells every local peer that this rank's piece k has landed (its
// stream waited for the event first); the done handshake that every peer finished reading it.
// Ready and done alternate, as the handshake's flag argument needs (board/handshake.hpp). The
// caller's stream ends after the last piece's event, so nothing of the call outlives it.
//
// Reuse. Within a call every copy writes a different range. The next call's network steps fork
// after this call's last done handshake, so no rank receives into a range a local peer still
// reads; the staged output of a chunked call is copied out on the caller's stream before the next
// chunk forks.
#include <algorithm>
#include <string>
#include <vector>

#include "collectives/all_gather_paths.hpp"
#include "board/handshake.hpp"
#include "board/wait_word.hpp"
#include "collectives/copy_engine_copies.hpp"
#include "comm/copy_engine_streams.hpp"
#include "comm/communicator_state.hpp"
#include "common/check.hpp"
#include "common/stream_capture.hpp"
#include "net/between_nodes.hpp"
#include "plan/hierarchical_plan.hpp"

namespace symmem::detail {
namespace {

std::vector<EngineCopy> engine_copies(const std::vector<HierCopy>& copies, const CopyEngineCall& call,
                                      const EngineCopy** own, EngineCopy* own_storage) {
  std::vector<EngineCopy> side;
  *own = nullptr;
  for (const HierCopy& c : copies) {
    char* dst = static_cast<char*>(call.out) + c.dst_offset;
    switch (c.source) {
      case HierCopy::kOwnInput:
        *own_storage = {dst, static_cast<const char*>(call.in) + c.src_offset, c.bytes, 0};
        *own = own_storage;
        break;
      case HierCopy::kLocalInput:
        side.push_back({dst, static_cast<const char*>(call.in_peers[c.peer]) + c.src_offset, c.bytes,
                        static_cast<int>(side.size())});
        break;
      case HierCopy::kLocalOutput:
        side.push_back({dst, static_cast<const char*>(call.out_peers[c.peer]) + c.src_offset, c.bytes,
                        static_cast<int>(side.size())});
        break;
    }
  }
  return side;
}

}  // namespace

void all_gather_hierarchical(CommunicatorState& st, const CopyEngineCall& call, cudaStream_t stream) {
  if (!st.copy_engine || !st.board)
    throw Error(ErrorCode::kInternal, "all_gather(hierarchical): the copy-engine state is missing");
  if (call.signature == 0)
    throw Error(ErrorCode::kInternal, "all_gather(hierarchical): signature 0 cannot be told from an empty flag");
  if (call.bytes == 0) return;
  const NodeLayout& layout = st.layout;
  const bool local_peers = st.world > 1;
  for (int p = 0; p < st.world; ++p)
    if (p != st.rank && (!call.in_peers[p] || !call.out_peers[p]))
      throw Error(ErrorCode::kInternal, "all_gather(hierarchical): no heap address of local rank " + std::to_string(p));
  if (layout.spans_nodes() && !st.between_nodes)
    throw Error(ErrorCode::kInternal, "all_gather(hierarchical): the communicator between nodes is missing");

  const HierarchicalSchedule schedule =
      plan_hierarchical_all_gather(layout, call.bytes, call.slot_stride, call.copy_own);
  CopyEngineStreams& ce = *st.copy_engine;
  const HostBoard& board = *st.board;
  const bool batchable = ce.batch() && !stream_is_capturing(stream);

  // Network first: the between-nodes stream runs ahead through every piece.
  BetweenNodes* net = st.between_nodes.get();
  if (!schedule.pieces.empty()) {
    net->fork_from(stream);
    try {
      if (schedule.network_all_gather) {
        net->all_gather(call.in, call.out, call.bytes, call.signature);
      } else {
        for (size_t k = 0; k < schedule.pieces.size(); ++k)
          net->exchange(schedule.pieces[k], static_cast<int>(k), call.in, call.out, call.signature);
      }
    } catch (const Error&) {
      // A failed step recorded the failure (BetweenNodes::fail) before throwing: join the network
      // stream, then raise the record as every collective raises one, naming the failed rank, so
      // that later calls find the communicator aborted; NCCL's own text stays in the record.
      net->join_all(stream);
      st.ensure_usable("all_gather");
      throw;
    }
  }

  auto copy_step = [&](const std::vector<HierCopy>& copies) {
    EngineCopy own_storage{};
    const EngineCopy* own = nullptr;
    const std::vector<EngineCopy> side = engine_copies(copies, call, &own, &own_storage);
    if (local_peers) enqueue_handshake(board, st.rank, st.world, WaitWord::kPhaseReady, call.signature, stream);
    enqueue_copies(ce, side, own, batchable, stream);
    if (local_peers) enqueue_handshake(board, st.rank, st.world, WaitWord::kPhaseDone, call.signature, stream);
  };
  // The own node's shards, beside the network.
  if (!schedule.own_node.empty()) copy_step(schedule.own_node);
  // Invariant: this rank's output holds its node's shards; no local peer reads this rank's input.
  for (size_t k = 0; k < schedule.pieces.size(); ++k) {
    net->join_piece(static_cast<int>(k), stream);
    if (!schedule.pieces[k].broadcast.empty()) copy_step(schedule.pieces[k].broadcast);
  }
  // Invariant: every slot of this rank's output holds its rank's data; every network step of the
  // call is ordered before what follows on `stream`.
}

}  // namespace symmem::detail
