// matmul_reduce_scatter: one persistent GEMM computes every rank's rows of the partial product while
// the copy engines push the finished pieces to their owners; one kernel adds them up.
//
// DATA MOVEMENT (rank r of W, shard = m / W rows; workspace = P [m x n] float32, this rank's partial
// products, then R [W slots of shard x n] float32, slot s receiving rank s's partial products of
// this rank's rows; docs/fused.md has the diagram). Push: the copies write into the peers' R.
//   caller's stream: the persistent GEMM P = a b (fused/flagged_gemm.hpp), M bands from rank r+1's
//                   first tile on, its own shard last; after a tile's stores have landed it adds 1
//                   to done[] of every piece its rows touch (flag_waiting_scheduler.cuh).
//   side stream 0:  forked before the GEMM (eager) or after it (under capture: see below). The ready
//                   handshake (copy_engine_steps.hpp): every peer has made this call (signature),
//                   so it has finished its previous call, whose partial-sums kernel was the last
//                   reader of its R (stream order on the peer: that kernel, then the fork of this
//                   call, then its ready write). Then for peers d = r+1, r+2, ... on up to
//                   `streams` lanes, piece by piece: a stream wait until done[] of the piece
//                   reaches its tile count, then a copy of its rows of P into slot r of d's R over
//                   NVLink (copy engines, zero SMs). Then the done handshake: every peer's pushes
//                   into this rank's R have landed.
//   caller's stream: joins side stream 0; the partial sums c_shard = sum over s in rank order of
//                   (s == r ? P's rows of shard r : R slot s) (kernels/partial_sums.cu); done[]
//                   reset to 0.
// P is rewritten only by the next call's GEMM, which follows the join (every push of P is done).
// done[] lives in the control buffer's signal pad after all_gather_matmul's flags; only this rank
// writes it (its GEMM and its reset), and the reset follows the join, before the next call.
//
// WAITS. The counts are this rank's own GEMM's, which waits for nothing, so the stream waits on
// them end once the GEMM runs. Eagerly the GEMM is enqueued first: if streams share a hardware
// queue (CUDA_DEVICE_MAX_CONNECTIONS=1) the waits queue behind it. In a CUDA graph the driver
// orders independent nodes, and a wait placed before the GEMM in one queue would never end: so a
// captured call forks its side stream after the GEMM (its copies then wait for the whole GEMM: no
// overlap, but nothing can hang). The handshakes are watched by the copy-engine watchdog.
//
// FAILURE. A dead peer: the watchdog releases the handshakes and records kTimeout naming it; the
// error is raised on every rank at the next call or check(), and c_shard is undefined. Pushes
// released after an expiry write into the peer's R (as the copy-engine all-gather's push
// direction does): a peer slower than the deadline, not dead, may see its previous shard
// overwritten, and it raises the error at its next call or check() too. A CUDA error while
// enqueuing joins what was forked, resets done[] and poisons the communicator, then throws.

#include <cuda.h>

#include <algorithm>
#include <string>
#include <vector>

#include "collectives/call_signature.hpp"
#include "collectives/copy_engine_state.hpp"
#include "collectives/copy_engine_steps.hpp"
#include "collectives/operands.hpp"
#include "collectives/validate.hpp"
#include "comm/communicator_state.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "common/driver_api.hpp"
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
// done[] sits after all_gather_matmul's piece flags in the control buffer's signal pad.
constexpr size_t kDoneOffset = size_t(detail::kMaxWorld) * detail::kMaxGatherPieces;
static_assert(kDoneOffset + detail::kMaxWorld * detail::kMaxGatherPieces <= detail::kSignalFlagCount,
              "the tile counters must fit in the control buffer's signal pad");

struct Prepared {
  detail::Resolved workspace;
  int shard_rows = 0;
  size_t row_bytes = 0;    // of a partial-product row: n float32
  size_t shard_bytes = 0;  // of a shard of partial products
  size_t partials_bytes = 0;  // of P; R follows it
  int n_tiles = 0;
  detail::GatherPieces pieces;
  detail::CallDescriptor call;
  detail::FlaggedGemm gemm{};
};

Prepared prepare(void* c_shard, Operand workspace, const void* a, const void* b, int64_t m, int64_t n, int64_t k,
                 DataType type, CommunicatorState& st, Communicator& comm) {
  std::string why = detail::fused_build_problem(kOp, st);
  if (!why.empty()) throw Error(ErrorCode::kUnsupported, why);
  why = detail::fused_shape_problem(kOp, m, n, k, type, st.world);
  if (!why.empty()) throw Error(ErrorCode::kInvalidArgument, why);
  if (!workspace.symmetric())
    throw Error(ErrorCode::kInvalidArgument,
                "matmul_reduce_scatter: workspace must be a symmetric operand (a heap Buffer and offset): the peers "
                "write their partial sums into it");
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
  // The GEMM reads a and b while it writes P and the peers write R; the sums write c_shard.
  detail::require_no_partial_overlap(c_shard, c_bytes, a, a_bytes, false, kOp);
  detail::require_no_partial_overlap(c_shard, c_bytes, b, b_bytes, false, kOp);
  detail::require_no_partial_overlap(c_shard, c_bytes, p.workspace.local, ws_bytes, false, kOp);
  detail::require_no_partial_overlap(a, a_bytes, p.workspace.local, ws_bytes, false, kOp);
  detail::require_no_partial_overlap(b, b_bytes, p.workspace.local, ws_bytes, false, kOp);
  for (const auto& [ptr, what] : {std::pair<const void*, const char*>{p.workspace.local, "workspace"},
                                  {a, "a"}, {b, "b"}, {c_shard, "c_shard"}}) {
    if (detail::address_alignment(ptr) < 16)
      throw Error(ErrorCode::kInvalidArgument, std::string("matmul_reduce_scatter: ") + what + " must be 16-byte aligned");
  }
  p.pieces = detail::plan_gather_pieces(p.shard_rows, p.row_bytes, detail::kFlaggedGemmTileRows);
  p.call = detail::make_call_descriptor(detail::kOpMatmulReduceScatter, type, ReduceOp::kSum, size_t(m) * size_t(n),
                                        Algo::kCopyEngine, 0, false, false, 0, true, p.workspace.heap_offset);
  p.call.n = n;
  p.call.k = k;

  detail::FlaggedGemm& g = p.gemm;
  g.a = a;
  g.b = b;
  g.c = p.workspace.local;
  g.m = static_cast<int>(m);
  g.n = static_cast<int>(n);
  g.k = static_cast<int>(k);
  g.type = type;
  g.float_out = true;
  g.sm_count = st.sm_count;
  g.tile_n = detail::flagged_gemm_tile_n(g.m, g.n, g.sm_count);  // the copies count its tiles
  p.n_tiles = (g.n + g.tile_n - 1) / g.tile_n;
  detail::ChunkFlags& chunks = g.chunks;
  chunks.flags = nullptr;  // every row of a is local: no tile waits
  chunks.done = st.workspaces->gather_flags()->signal_pad() + kDoneOffset;
  chunks.rows = g.m;
  chunks.shard_rows = p.shard_rows;
  chunks.piece_rows = p.pieces.piece_rows;
  chunks.pieces = p.pieces.pieces;
  chunks.tile_rows = detail::kFlaggedGemmTileRows;
  chunks.tiles = (g.m + chunks.tile_rows - 1) / chunks.tile_rows;
  // The next rank's rows first (its pushes start earliest), the own shard last (rounded down: a
  // tile shared with the previous shard is computed first, which that shard needs early too).
  chunks.first_tile = static_cast<int>(int64_t((st.rank + 1) % st.world) * p.shard_rows / chunks.tile_rows);
  why = detail::flagged_gemm_problem(g);
  if (!why.empty()) throw Error(ErrorCode::kInvalidArgument, std::string(kOp) + ": " + why);
  return p;
}

// Pushes of this rank's partial products of shard `peer` into the peer's R slot `rank`, piece by
// piece, each after the GEMM has announced every tile of the piece.
void enqueue_pushes(const Prepared& p, int rank, int peer, cudaStream_t stream) {
  const char* partials = static_cast<const char*>(p.workspace.local) + size_t(peer) * p.shard_bytes;
  for (const detail::GatherCopy& piece : detail::plan_gather_copies(peer, p.shard_rows, p.pieces)) {
    const int first_row = peer * p.shard_rows + piece.first_row;
    const uint32_t tiles =
        uint32_t(detail::tiles_over_rows(first_row, piece.rows, detail::kFlaggedGemmTileRows)) * uint32_t(p.n_tiles);
    CUstreamBatchMemOpParams wait = detail::stream_wait_at_least_op(p.gemm.chunks.done + piece.chunk, tiles);
    SYMMEM_CU_CHECK(detail::DriverApi::get().stream_batch_mem_op(stream, 1, &wait, 0));
    const size_t at = size_t(piece.first_row) * p.row_bytes;
    void* to = p.workspace.peer(peer, p.partials_bytes + size_t(rank) * p.shard_bytes + at);
    SYMMEM_CUDA_CHECK(
        cudaMemcpyAsync(to, partials + at, size_t(piece.rows) * p.row_bytes, cudaMemcpyDeviceToDevice, stream));
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
  CommunicatorState& st = detail::state_of(comm);
  detail::DeviceGuard guard(st.device);
  std::string why = detail::fused_build_problem(kOp, st);
  if (why.empty()) why = detail::fused_shape_problem(kOp, m, n, k, type, st.world);
  if (why.empty() && !workspace.symmetric()) why = "matmul_reduce_scatter: workspace must be a symmetric operand";
  if (why.empty()) {
    try {
      detail::resolve(workspace, matmul_reduce_scatter_workspace_bytes(m, n), "workspace", kOp, st);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  return why;
}

void matmul_reduce_scatter(void* c_shard, Operand workspace, const void* a, const void* b, int64_t m, int64_t n,
                           int64_t k, DataType type, Communicator& comm, cudaStream_t stream) {
  CommunicatorState& st = detail::state_of(comm);
  st.ensure_usable(kOp);
  detail::DeviceGuard guard(st.device);
  Prepared p = prepare(c_shard, workspace, a, b, m, n, k, type, st, comm);
  if (!st.copy_engine || !st.board) throw Error(ErrorCode::kInternal, "matmul_reduce_scatter: no copy-engine state");
  const uint32_t signature = detail::signature_of(p.call);
  st.record_call(signature, p.call);
  p.gemm.chunks.sync = st.sync_args(detail::kOpMatmulReduceScatter, signature);  // (nothing waits in the GEMM)

  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SYMMEM_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  const bool capturing = capture != cudaStreamCaptureStatusNone;

  const int rank = st.rank, world = st.world;
  uint32_t* done = p.gemm.chunks.done;
  const size_t done_bytes = size_t(world) * p.pieces.pieces * sizeof(uint32_t);
  detail::SideStreams sides(*st.copy_engine, stream);
  try {
    // Eagerly the side stream forks before the GEMM, so its pushes overlap it; under capture after it.
    if (!capturing) sides.fork_control();
    detail::run_flagged_gemm(p.gemm, stream);
    if (capturing) sides.fork_control();

    if (world > 1) {
      cudaStream_t control = sides.control();
      detail::enqueue_handshake(*st.board, rank, world, detail::CopyEngineState::kPhaseReady, signature, control);
      // Invariant: every peer's R may be written (its previous call's sums have read it).
      const std::vector<cudaStream_t> lanes = sides.fork_lanes(world - 1);
      for (int i = 0; i < world - 1; ++i) enqueue_pushes(p, rank, (rank + 1 + i) % world, lanes[i % lanes.size()]);
      sides.join_lanes();
      detail::enqueue_handshake(*st.board, rank, world, detail::CopyEngineState::kPhaseDone, signature, control);
      // Invariant (control stream): every peer's partial sums of this rank's rows are in R.
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
