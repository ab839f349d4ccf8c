// matmul_reduce_scatter: one persistent GEMM computes every rank's rows of the partial product while
// the copy engines pull each finished piece to its owner; one kernel adds them up.
//
// DATA MOVEMENT (rank r of W, shard = m / W rows; workspace = P [m x n] float32, this rank's partial
// products, then R [W slots of shard x n] float32, slot s receiving rank s's partial products of
// this rank's rows; docs/fused.md has the diagram). Pull: every copy writes only this rank's memory.
//   caller's stream: the persistent GEMM P = a b (fused/flagged_gemm.hpp), M bands from rank r+1's
//                   first tile on, its own shard last; after a tile's stores have landed it adds 1
//                   to done[] of every piece its rows touch (flag_waiting_scheduler.cuh).
//   side stream 0:  forked before the GEMM (eagerly) or after it (under capture: see WAITS). The ready
//                   handshake (board/handshake.hpp): every peer made this call (signature).
//   side stream 1:  forked from side stream 0 after it: for peers d = r+1, r+2, ..., piece by piece,
//                   a stream wait until done[] of the piece reaches its tile count, then a piece
//                   signal into d's board page (board/handshake.hpp, PIECES): d may read it.
//   side stream 0:  for peers p = r-1, r-2, ... (the order they compute this rank's rows in), piece
//                   by piece: a watched wait for p's signal, then a pull of the piece from p's P into
//                   slot p of this rank's R over NVLink (copy engines, zero SMs). Joins side stream
//                   1, then the done handshake: no peer reads this rank's P any more.
//   caller's stream: joins side stream 0; the partial sums c_shard = sum over s in rank order of
//                   (s == r ? P's rows of shard r : R slot s) (kernels/partial_sums.cu); done[]
//                   reset to 0.
// P is rewritten only by the next call's GEMM, after the join, i.e. after the done handshake, which
// every peer enters after its last pull. R is written by this rank's pulls and read by its sums,
// in stream order. done[] lives in the fused ops' flags (workspaces.hpp) after all_gather_matmul's
// flags; only this rank writes it (its GEMM and the reset after the join).
//
// WAITS. The piece signals and handshakes are watched waits on the host board: a dead or stalled
// peer is kTimeout (naming it) within the deadline, never a hang. done[] counts this rank's own
// GEMM's tiles, and that GEMM waits for nothing, so a wait on it ends once the GEMM runs. Eagerly
// the GEMM is enqueued first, so streams sharing one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1)
// hold the waits behind it; side stream 1's signals are enqueued before side stream 0's piece waits
// for the same reason. In a CUDA graph nothing but dependencies orders the nodes, and a wait on
// done[] placed ahead of the GEMM in one queue would never end: a captured call forks its side
// streams after the GEMM (no overlap in graphs, nothing can hang), and its signals precede its
// piece waits on side stream 0 (as with CUDA_DEVICE_MAX_CONNECTIONS=1). Ranks sharing a GPU (tests
// only) share its hardware queues, where a side stream of one rank may queue behind a peer's wait
// for it: there every step runs on the caller's stream, in the order above.
//
// FAILURE. After a released wait (dead peer, mismatch, abort) the pulls that follow read a peer's
// memory, which stays mapped, and write only this rank's R; the error is raised on every rank at
// the next call or check(), and c_shard is undefined. Nothing is ever written into a peer's memory
// but its board words. A CUDA error while enqueuing joins what was forked, resets done[] and
// poisons the communicator, then throws.

#include <cuda.h>

#include <string>
#include <vector>

#include "board/call_signature.hpp"
#include "board/handshake.hpp"
#include "board/wait_word.hpp"
#include "collectives/operands.hpp"
#include "collectives/validate.hpp"
#include "comm/communicator_state.hpp"
#include "comm/refusal.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "common/driver_api.hpp"
#include "common/stream_capture.hpp"
#include "fused/flagged_gemm.hpp"
#include "fused/fused_problems.hpp"
#include "fused/side_streams.hpp"
#include "kernels/kernel_args.hpp"
#include "plan/fused_plan.hpp"
#include "symmem/fused.hpp"

namespace symmem {
namespace {

using detail::CommunicatorState;

constexpr const char* kOp = "matmul_reduce_scatter";
// done[] sits after all_gather_matmul's piece flags in the fused ops' flags (workspaces.hpp).
constexpr size_t kDoneOffset = size_t(kMaxWorld) * detail::kMaxGatherPieces;
static_assert(kDoneOffset + kMaxWorld * detail::kMaxGatherPieces <= detail::Workspaces::kFusedFlagWords,
              "the tile counters must fit in the fused ops' flags");
static_assert(detail::kMaxGatherPieces <= detail::BoardPage::kPieceSignals, "a piece signal per piece");

struct Prepared {
  detail::Resolved workspace;
  int shard_rows = 0;
  size_t row_bytes = 0;    // of a partial-product row: n float32
  size_t shard_bytes = 0;  // of a shard of partial products
  size_t partials_bytes = 0;  // of P; R follows it
  detail::GatherPieces pieces;
  detail::CallDescriptor call;
  detail::FlaggedGemm gemm{};
};

Prepared prepare(void* c_shard, Operand workspace, const void* a, const void* b, int64_t m, int64_t n, int64_t k,
                 DataType type, MatrixLayout b_layout, CommunicatorState& st, Communicator& comm) {
  std::string why = detail::fused_build_problem(kOp, st);
  if (!why.empty()) throw Error(ErrorCode::kUnsupported, why);
  why = detail::fused_shape_problem(kOp, m, n, k, type, st.world);
  if (why.empty()) why = detail::fused_b_layout_problem(kOp, b_layout);
  if (!why.empty()) throw Error(ErrorCode::kInvalidArgument, why);
  if (!workspace.symmetric())
    throw Error(ErrorCode::kInvalidArgument,
                "matmul_reduce_scatter: workspace must be a symmetric operand (a heap Buffer and offset): the peers "
                "read their partial sums of this rank's rows from it");
  Prepared p;
  const size_t elem = dtype_size(type);
  p.shard_rows = static_cast<int>(m / st.world);
  p.row_bytes = size_t(n) * sizeof(float);
  p.shard_bytes = size_t(p.shard_rows) * p.row_bytes;
  p.partials_bytes = size_t(m) * p.row_bytes;
  p.workspace = detail::resolve(workspace, matmul_reduce_scatter_workspace_bytes(m, n), "workspace", kOp, st);
  const size_t ws_bytes = 2 * p.partials_bytes;
  const size_t a_bytes = size_t(m) * size_t(k) * elem;
  const size_t b_bytes = size_t(k) * size_t(n) * elem;
  const size_t c_bytes = size_t(p.shard_rows) * size_t(n) * elem;
  detail::require_device_pointer(a, a_bytes, "a", kOp, comm);
  detail::require_device_pointer(b, b_bytes, "b", kOp, comm);
  detail::require_device_pointer(c_shard, c_bytes, "c_shard", kOp, comm);
  // The GEMM reads a and b while it writes P and this rank's pulls write R; the sums write c_shard.
  detail::require_no_partial_overlap(c_shard, c_bytes, a, a_bytes, false, kOp);
  detail::require_no_partial_overlap(c_shard, c_bytes, b, b_bytes, false, kOp);
  detail::require_no_partial_overlap(c_shard, c_bytes, p.workspace.local, ws_bytes, false, kOp);
  detail::require_no_partial_overlap(a, a_bytes, p.workspace.local, ws_bytes, false, kOp);
  detail::require_no_partial_overlap(b, b_bytes, p.workspace.local, ws_bytes, false, kOp);
  detail::require_16_byte_aligned(kOp, {{p.workspace.local, "workspace"}, {a, "a"}, {b, "b"}, {c_shard, "c_shard"}});
  p.pieces = detail::plan_gather_pieces(p.shard_rows, p.row_bytes, detail::kFlaggedGemmTileRows);
  p.call = detail::make_call_descriptor(detail::kOpMatmulReduceScatter, type, ReduceOp::kSum, size_t(m) * size_t(n),
                                        Algo::kCopyEngine, 0, false, false, 0, true, p.workspace.heap_offset);
  p.call.n = n;
  p.call.k = k;

  p.gemm = detail::flagged_gemm_of(a, b, p.workspace.local, static_cast<int>(m), static_cast<int>(n),
                                   static_cast<int>(k), type, st.sm_count, p.shard_rows, p.pieces);
  detail::FlaggedGemm& g = p.gemm;
  g.float_out = true;
  g.b_column_major = b_layout == MatrixLayout::kColumnMajor;
  g.tile_n = detail::flagged_gemm_tile_n(g.m, g.n, g.sm_count);  // the copies count its tiles
  detail::ChunkFlags& chunks = g.chunks;
  chunks.flags = nullptr;  // every row of a is local: no tile waits
  chunks.done = st.workspaces->fused_flags() + kDoneOffset;
  // The next rank's rows first (its pulls can start earliest), the own shard last (rounded down: a
  // tile shared with the previous shard is computed first, which that shard needs early too).
  chunks.first_tile = static_cast<int>(int64_t((st.rank + 1) % st.world) * p.shard_rows / chunks.tile_rows);
  chunks.n_tiles = (g.n + g.tile_n - 1) / g.tile_n;
  why = detail::flagged_gemm_problem(g);
  if (!why.empty()) throw Error(ErrorCode::kInvalidArgument, std::string(kOp) + ": " + why);
  return p;
}

// Signals to `peer` of every piece of its rows in this rank's P, each once the GEMM has announced
// all of the piece's tiles.
void enqueue_signals(const Prepared& p, const detail::HostBoard& board, int rank, int peer, uint32_t signature,
                     cudaStream_t stream) {
  for (const detail::GatherCopy& piece : detail::plan_gather_copies(peer, p.shard_rows, p.pieces)) {
    detail::enqueue_piece_signal(board, rank, peer, piece.chunk - peer * p.pieces.pieces, signature,
                                 p.gemm.chunks.done + piece.chunk,
                                 detail::piece_tile_count(peer, p.shard_rows, piece, p.gemm.chunks.tile_rows,
                                                          p.gemm.chunks.n_tiles),
                                 stream);
  }
}

// Pulls of `peer`'s partial products of this rank's rows into slot `peer` of R, each piece after
// the peer's signal.
void enqueue_pulls(const Prepared& p, const detail::HostBoard& board, int rank, int world, int peer,
                   uint32_t signature, cudaStream_t stream) {
  char* slot = static_cast<char*>(p.workspace.local) + p.partials_bytes + size_t(peer) * p.shard_bytes;
  const size_t from = size_t(rank) * p.shard_bytes;  // this rank's rows in the peer's P
  for (const detail::GatherCopy& piece : detail::plan_gather_copies(rank, p.shard_rows, p.pieces)) {
    detail::enqueue_piece_wait(board, rank, world, peer, piece.chunk - rank * p.pieces.pieces, signature, stream);
    const size_t at = size_t(piece.first_row) * p.row_bytes;
    SYMMEM_CUDA_CHECK(cudaMemcpyAsync(slot + at, p.workspace.peer(peer, from + at), size_t(piece.rows) * p.row_bytes,
                                      cudaMemcpyDeviceToDevice, stream));
  }
}

void enqueue_partial_sums(const Prepared& p, void* c_shard, DataType type, int rank, int world, int sm_count,
                          cudaStream_t stream) {
  detail::PartialSumsArgs args{};
  const char* base = static_cast<const char*>(p.workspace.local);
  for (int s = 0; s < world; ++s) {
    const size_t at = s == rank ? size_t(rank) * p.shard_bytes : p.partials_bytes + size_t(s) * p.shard_bytes;
    args.sources[s] = reinterpret_cast<const float*>(base + at);
  }
  args.out = c_shard;
  args.count = size_t(p.shard_rows) * size_t(p.gemm.n);
  args.world = world;
  detail::launch_partial_sums(type, args, sm_count, stream);
}

}  // namespace

size_t matmul_reduce_scatter_workspace_bytes(int64_t m, int64_t n) {
  if (m <= 0 || n <= 0) return 0;
  return 2 * size_t(m) * size_t(n) * sizeof(float);
}

std::string matmul_reduce_scatter_unsupported(Operand workspace, int64_t m, int64_t n, int64_t k, DataType type,
                                              Communicator& comm) {
  return detail::fused_unsupported(kOp, comm, workspace, "workspace", matmul_reduce_scatter_workspace_bytes(m, n), m,
                                   n, k, type);
}

void matmul_reduce_scatter(void* c_shard, Operand workspace, const void* a, const void* b, int64_t m, int64_t n,
                           int64_t k, DataType type, Communicator& comm, cudaStream_t stream, MatrixLayout b_layout) {
  CommunicatorState& st = detail::state_of(comm);
  st.ensure_usable(kOp);
  detail::DeviceGuard guard(st.device);
  // The shape is every rank's alike (a plain error); the rest is this rank's own (refused).
  const std::string shape = detail::fused_shape_problem(kOp, m, n, k, type, st.world);
  if (!shape.empty()) throw Error(ErrorCode::kInvalidArgument, shape);
  Prepared p = detail::checked_or_refused(st, detail::kOpMatmulReduceScatter, kOp, stream, [&] {
    return prepare(c_shard, workspace, a, b, m, n, k, type, b_layout, st, comm);
  });
  if (!st.copy_engine || !st.board) throw Error(ErrorCode::kInternal, "matmul_reduce_scatter: no copy-engine state");
  detail::EnqueueScope enqueue(st, stream);
  const uint32_t signature = st.sign_call(p.call);
  p.gemm.chunks.sync = st.sync_args(detail::kOpMatmulReduceScatter, signature);  // (nothing waits in the GEMM)

  const bool capturing = detail::stream_is_capturing(stream);

  const int rank = st.rank, world = st.world;
  uint32_t* done = p.gemm.chunks.done;
  const size_t done_bytes = size_t(world) * p.pieces.pieces * sizeof(uint32_t);
  // Ranks sharing a GPU (tests only) share its hardware queues too, in an order no call chooses: a
  // side stream of one rank can queue behind another rank's wait for it. There nothing branches
  // (SideStreams without branches: every stream below is the caller's): the GEMM, the ready
  // handshake, the signals, the pulls, the done handshake and the sums, in that order.
  detail::SideStreams sides(*st.copy_engine, stream, /*branch=*/st.ranks_on_gpu == 1);
  try {
    // Eagerly the side streams fork before the GEMM, so the copies overlap it; under capture after it.
    if (!capturing) sides.fork_control();
    detail::run_flagged_gemm(p.gemm, stream);
    if (capturing) sides.fork_control();

    if (world > 1) {
      const detail::HostBoard& board = *st.board;
      cudaStream_t control = sides.control();
      detail::enqueue_handshake(board, rank, world, detail::WaitWord::kPhaseReady, signature, control);
      // Invariant: every peer made this call.
      // The signals go on a lane of their own, enqueued before the piece waits (see WAITS). In a
      // graph, or with one hardware queue, they go ahead of the piece waits on side stream 0
      // instead: there nothing but stream order keeps a rank's piece wait from being queued
      // before its own signals (seen on an H100: graph branches queue in capture order), and
      // under capture the GEMM they wait for has finished anyway. Also when the communicator has
      // one side stream.
      const bool one_queue = capturing || detail::single_hardware_queue();
      const std::vector<cudaStream_t> lanes = sides.fork_lanes(one_queue ? 1 : 2);
      cudaStream_t signals = lanes.back();
      for (int i = 1; i < world; ++i) enqueue_signals(p, board, rank, (rank + i) % world, signature, signals);
      for (int i = 1; i < world; ++i) enqueue_pulls(p, board, rank, world, (rank - i + world) % world, signature, control);
      sides.join_lanes();
      detail::enqueue_handshake(board, rank, world, detail::WaitWord::kPhaseDone, signature, control);
      // Invariant (control stream): every peer's partial sums of this rank's rows are in R, and no
      // peer reads this rank's P any more.
    }
    sides.join_control();
    enqueue_partial_sums(p, c_shard, type, rank, world, st.sm_count, stream);
    SYMMEM_CUDA_CHECK(cudaMemsetAsync(done, 0, done_bytes, stream));
    // Invariant: done[] is 0 again, before anything of the next call.
  } catch (const std::exception& e) {
    sides.unwind();
    SYMMEM_CUDA_CHECK_NOTHROW(cudaMemsetAsync(done, 0, done_bytes, stream));
    if (!capturing) st.poison(std::string("matmul_reduce_scatter failed while enqueuing its work: ") + e.what());
    throw;
  }
}

}  // namespace symmem
