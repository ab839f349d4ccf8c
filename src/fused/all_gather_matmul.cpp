// all_gather_matmul: the shards of A arrive by copy engine while one persistent GEMM computes.
//
// DATA MOVEMENT (rank r of W, shard = m / W rows; docs/fused.md has the diagram). Pull: every
// copy writes only this rank's memory.
//   caller's stream: own shard -> gathered_a slot r in one copy (skipped when a_shard already is
//                   slot r); its flags are neither written nor waited for (ChunkFlags::ready_shard:
//                   the copy precedes the GEMM on this stream; a stream write each cost
//                   microseconds before the GEMM could start). This copy runs on
//                   SMs: the driver copies within one GPU with a kernel, whatever the API
//                   (cudaMemcpyAsync, cuMemcpyBatchAsync, cudaMemcpyPeerAsync: measured on an
//                   H200), and a kernel queued beside the persistent GEMM
//                   that waits for it gets no SM: a deadlock until the deadline. So it precedes
//                   the GEMM in stream order. Needs no handshake: the peers finished reading slot r
//                   of the previous call (its done handshake precedes this call on this stream).
//   side stream 0:  forked after the own copy (fused/piece_gather.hpp enqueues both, and the
//                   steps below up to the done handshake): the ready handshake (board/handshake.hpp): every
//                   peer's slot holds its shard of this call, and our calls match (the signature).
//                   Then this rank PULLS every peer's slot into its own over NVLink (copy engines,
//                   zero SMs), piece by piece, on up to `streams` lanes (peers r+1, r+2, ...
//                   first: the GEMM needs them in that order), each piece followed by a stream
//                   write of this rank's flag for it. Then the done handshake: no peer reads this
//                   rank's slot any more.
//   caller's stream: the persistent GEMM (fused/flagged_gemm.hpp), own shard's tiles first, each
//                   tile waiting for the flags of its rows; then it joins side stream 0 and resets
//                   the flags to 0.
// Every flag is this rank's and written by this rank's streams only, so the reset after the join
// cannot race with anything, and the next call's writes follow it in stream order (graph replays
// included). After a failure the watchdog releases the handshakes; the pulls that follow read
// peers' memory and write only this rank's, which the error declares undefined.
//
// ORDER OF ENQUEUE. All side-stream work is enqueued before the GEMM: streams may share a hardware
// queue (more streams than connections, CUDA_DEVICE_MAX_CONNECTIONS=1), and a GEMM queued ahead
// of the copies it waits for would wait for its deadline. Inside a CUDA graph only dependencies
// order the nodes, and the driver maps the branches onto hardware queues as it likes: the GEMM
// node can land ahead of the copy branch in one queue, where it spins until its deadline while
// the copies (and this rank's ready write, which every peer awaits) stay queued behind it. Where
// that can happen a captured call does not branch: its handshakes and copies run on the caller's
// stream ahead of the GEMM (no overlap in that graph). It can with CUDA_DEVICE_MAX_CONNECTIONS=1 (as
// read when the call is made), and when ranks share the GPU (tests only: 8 ranks' streams and
// their graphs' branches in one process outnumber the hardware queues; on one H100 the ready
// handshake of the 8-rank test timed out in 4 of 4 runs). Otherwise the graph's branches are
// trusted to run concurrently; if they did not, the GEMM's bounded wait would end the call with an
// error, never a hang. Consecutive calls must be ordered on the caller's stream (as
// for every collective): the handshakes' argument assumes it. Nor may another kernel that holds
// every SM until something on a peer happens (a second fused call on another stream or
// communicator) run beside it: each rank's GEMM would keep the other's own copy from starting.
//
// FAILURE. Every wait is bounded: the handshakes by the copy-engine watchdog, the GEMM's flag waits
// by twice the communicator's deadline (so that the watchdog, which knows which peer is missing,
// records the failure first) and the abort word (flag_waiting_scheduler.cuh). After a failure the
// GEMM completes on whatever rows it has; C is undefined and the error is raised at the next call
// or check(). A CUDA error while enqueuing joins what was forked, resets the flags and poisons the
// communicator (the handshake sequence may be broken), then throws.

#include "symmem/fused.hpp"

#include <string>

#include "board/call_signature.hpp"
#include "collectives/operands.hpp"
#include "collectives/validate.hpp"
#include "comm/communicator_state.hpp"
#include "comm/refusal.hpp"
#include "common/device_guard.hpp"
#include "fused/flagged_gemm.hpp"
#include "fused/fused_problems.hpp"
#include "fused/piece_gather.hpp"
#include "plan/fused_plan.hpp"

static_assert(symmem::kMaxWorld * symmem::detail::kMaxGatherPieces <= symmem::detail::Workspaces::kFusedFlagWords,
              "the piece flags must fit in the fused ops' flags");

namespace symmem {
namespace {

using detail::CommunicatorState;

constexpr const char* kOp = "all_gather_matmul";

struct Prepared {
  detail::Resolved gathered;
  bool in_place = false;
  int shard_rows = 0;
  size_t row_bytes = 0;
  detail::GatherPieces pieces;
  detail::CallDescriptor call;
  detail::FlaggedGemm gemm{};  // everything but chunks.sync (needs the signature)
};

Prepared prepare(void* c, Operand gathered_a, const void* a_shard, const void* b, int64_t m, int64_t n, int64_t k,
                 DataType type, MatrixLayout b_layout, CommunicatorState& st, Communicator& comm) {
  std::string why = detail::fused_build_problem(kOp, st);
  if (!why.empty()) throw Error(ErrorCode::kUnsupported, why);
  why = detail::fused_shape_problem(kOp, m, n, k, type, st.world);
  if (why.empty()) why = detail::fused_b_layout_problem(kOp, b_layout);
  if (!why.empty()) throw Error(ErrorCode::kInvalidArgument, why);
  if (!gathered_a.symmetric())
    throw Error(ErrorCode::kInvalidArgument,
                "all_gather_matmul: gathered_a must be a symmetric operand (a heap Buffer and offset): the peers "
                "write their shards into it");
  Prepared p;
  const size_t elem = dtype_size(type);
  p.row_bytes = size_t(k) * elem;
  p.shard_rows = static_cast<int>(m / st.world);
  const size_t shard_bytes = size_t(p.shard_rows) * p.row_bytes;
  const size_t a_bytes = size_t(m) * p.row_bytes;
  p.gathered = detail::resolve(gathered_a, a_bytes, "gathered_a", kOp, st);
  char* own_slot = static_cast<char*>(p.gathered.local) + size_t(st.rank) * shard_bytes;
  p.in_place = a_shard == own_slot;
  if (!p.in_place) {
    detail::require_device_pointer(a_shard, shard_bytes, "a_shard", kOp, comm);
    detail::require_no_partial_overlap(p.gathered.local, a_bytes, a_shard, shard_bytes, false, kOp);
  }
  const size_t b_bytes = size_t(k) * size_t(n) * elem;
  const size_t c_bytes = size_t(m) * size_t(n) * elem;
  detail::require_device_pointer(b, b_bytes, "b", kOp, comm);
  detail::require_device_pointer(c, c_bytes, "c", kOp, comm);
  // C is written while the copies read a_shard and the GEMM reads A and b; b is read while A fills.
  detail::require_no_partial_overlap(c, c_bytes, p.gathered.local, a_bytes, false, kOp);
  detail::require_no_partial_overlap(c, c_bytes, b, b_bytes, false, kOp);
  detail::require_no_partial_overlap(c, c_bytes, a_shard, shard_bytes, false, kOp);
  detail::require_no_partial_overlap(b, b_bytes, p.gathered.local, a_bytes, false, kOp);
  detail::require_16_byte_aligned(kOp, {{p.gathered.local, "gathered_a"}, {b, "b"}, {c, "c"}, {a_shard, "a_shard"}});
  p.pieces = detail::plan_gather_pieces(p.shard_rows, p.row_bytes, detail::kFlaggedGemmTileRows);
  p.call = detail::make_call_descriptor(detail::kOpAllGatherMatmul, type, ReduceOp::kSum, size_t(m) * size_t(k),
                                        Algo::kCopyEngine, 0, false, false, 0, true, p.gathered.heap_offset);
  // (in place or not is this rank's own affair: it changes no peer's work, so it is not signed)
  p.call.n = n;
  p.call.k = k;

  p.gemm = detail::flagged_gemm_of(p.gathered.local, b, c, static_cast<int>(m), static_cast<int>(n),
                                   static_cast<int>(k), type, st.sm_count, p.shard_rows, p.pieces);
  detail::FlaggedGemm& g = p.gemm;
  g.b_column_major = b_layout == MatrixLayout::kColumnMajor;
  detail::ChunkFlags& chunks = g.chunks;
  chunks.flags = st.workspaces->fused_flags();
  chunks.ready_shard = st.rank;
  // The first tile wholly inside the own shard (rounded down, it would hold the previous shard's
  // tail, which arrives last).
  chunks.first_tile = static_cast<int>((int64_t(st.rank) * p.shard_rows + chunks.tile_rows - 1) / chunks.tile_rows) %
                      chunks.tiles;
  why = detail::flagged_gemm_problem(g);
  if (!why.empty()) throw Error(ErrorCode::kInvalidArgument, "all_gather_matmul: " + why);
  return p;
}

}  // namespace

std::string all_gather_matmul_unsupported(Operand gathered_a, int64_t m, int64_t n, int64_t k, DataType type,
                                          Communicator& comm) {
  const size_t bytes = m > 0 && k > 0 ? size_t(m) * size_t(k) * dtype_size(type) : 0;
  return detail::fused_unsupported(kOp, comm, gathered_a, "gathered_a", bytes, m, n, k, type);
}

void all_gather_matmul(void* c, Operand gathered_a, const void* a_shard, const void* b, int64_t m, int64_t n,
                       int64_t k, DataType type, Communicator& comm, cudaStream_t stream, MatrixLayout b_layout) {
  CommunicatorState& st = detail::state_of(comm);
  st.ensure_usable(kOp);
  detail::DeviceGuard guard(st.device);
  // The shape is every rank's alike (a plain error); the rest is this rank's own (refused).
  const std::string shape = detail::fused_shape_problem(kOp, m, n, k, type, st.world);
  if (!shape.empty()) throw Error(ErrorCode::kInvalidArgument, shape);
  Prepared p = detail::checked_or_refused(st, detail::kOpAllGatherMatmul, kOp, stream, [&] {
    return prepare(c, gathered_a, a_shard, b, m, n, k, type, b_layout, st, comm);
  });
  if (!st.copy_engine || !st.board) throw Error(ErrorCode::kInternal, "all_gather_matmul: no copy-engine state");
  detail::EnqueueScope enqueue(st, stream);
  const uint32_t signature = st.sign_call(p.call);
  detail::ChunkFlags& chunks = p.gemm.chunks;
  chunks.sync = st.sync_args(detail::kOpAllGatherMatmul, signature);
  chunks.sync.timeout_ns = 2 * chunks.sync.timeout_ns + 1'000'000'000ull;

  // The own shard, the handshakes and the pulls (see the top of the file), then the GEMM.
  const detail::PieceGather gather{p.gathered, st.rank, st.world, p.shard_rows, p.row_bytes, p.pieces, chunks.flags,
                                   p.in_place};
  detail::gather_pieces_around(st, gather, a_shard, signature, stream, kOp,
                               [&] { detail::run_flagged_gemm(p.gemm, stream); });
}

}  // namespace symmem
