// all_gather_matmul: the shards of A arrive by copy engine while one persistent GEMM computes.
//
// DATA MOVEMENT (rank r of W, shard = m / W rows; docs/fused.md has the diagram).
//   side stream 1:  own shard -> gathered_a slot r, piece by piece, each followed by a stream
//                   write of its flag (skipped when a_shard already is slot r). Needs no handshake:
//                   the last reader of this rank's gathered_a, its previous GEMM, precedes the fork.
//   side stream 0:  ready handshake (copy_engine_steps.hpp): every peer is in this call, so its
//                   previous GEMM finished reading its gathered_a, and our calls match (signature).
//                   Then this rank PUSHES its shard into every peer's slot r, piece by piece, each
//                   piece followed by a stream write of the peer's flag for it (over NVLink; the
//                   write's fence orders it after the copy). Peers in the order they need the
//                   shard: rank r - 1 first (it computes shard r right after its own).
//                   Then the done handshake: every peer finished pushing into this rank.
//   caller's stream: the persistent GEMM (fused/flagged_gemm.hpp), own shard's tiles first, each
//                   tile waiting for the flags of its rows; then it joins side stream 0 and resets
//                   the flags to 0.
// Push reads a_shard where it is, so nothing is staged.
//
// WHY THE FLAGS ARE RIGHT. A peer sets this rank's flags of call n only after passing call n's
// ready handshake, which needs this rank's ready write of call n, issued (side stream forked from
// the caller's stream) after this rank's reset of call n - 1's flags; and this rank resets only
// after its done handshake of call n, which needs every peer's done write, issued after that
// peer's pushes and flag writes of call n. So a flag is 0 when a call starts, and set exactly
// when its rows hold this call's data. The same holds for graph replays (the order is in the
// graph), and the handshakes carry the call's signature, so a peer in another call is a
// kMismatch, not a wrong product.
//
// ORDER OF ENQUEUE. All side-stream work is enqueued before the GEMM: streams may share a hardware
// queue (more streams than connections, CUDA_DEVICE_MAX_CONNECTIONS=1), and a GEMM queued ahead
// of the copies it waits for would wait for its own deadline.
//
// FAILURE. Every wait is bounded: the handshakes by the copy-engine watchdog, the GEMM's flag waits
// by the communicator's deadline and abort word (flag_waiting_scheduler.cuh). After a failure the
// GEMM completes on whatever rows it has and the error is raised at the next call or check().
#include "symmem/fused.hpp"

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
#include "plan/fused_plan.hpp"

static_assert(symmem::detail::kMaxWorld * symmem::detail::kMaxGatherPieces <= symmem::detail::kSignalFlagCount,
              "the piece flags must fit in the control buffer's signal pad");

namespace symmem {
namespace {

using detail::CommunicatorState;

constexpr const char* kOp = "all_gather_matmul";

// What the arguments are, before anything is resolved: the reason they cannot run, or "".
std::string shape_problem(int64_t m, int64_t n, int64_t k, DataType type, int world) {
  if (type != DataType::kFloat16 && type != DataType::kBFloat16)
    return std::string("all_gather_matmul: type ") + dtype_name(type) + " is not supported (float16, bfloat16)";
  if (m <= 0 || n <= 0 || k <= 0)
    return "all_gather_matmul: m, n and k must be positive (m=" + std::to_string(m) + ", n=" + std::to_string(n) +
           ", k=" + std::to_string(k) + ")";
  if (m % world != 0)
    return "all_gather_matmul: m=" + std::to_string(m) + " is not a multiple of the " + std::to_string(world) +
           " ranks (every shard has m / world rows)";
  if (k % 8 != 0 || n % 8 != 0)
    return "all_gather_matmul: k=" + std::to_string(k) + " and n=" + std::to_string(n) +
           " must be multiples of 8 (16-byte rows for the tensor-memory loads)";
  constexpr int64_t kMaxExtent = int64_t(1) << 30;
  if (m > kMaxExtent || n > kMaxExtent || k > kMaxExtent)
    return "all_gather_matmul: extents above 2^30 are not supported";
  return {};
}

std::string build_problem(CommunicatorState& st) {
  if (st.layout.spans_nodes())
    return "all_gather_matmul: the communicator spans " + std::to_string(st.layout.nodes) +
           " nodes; the fused GEMM runs inside one node";
  int major = 0;
  SYMMEM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, st.device));
  if (major != 9) return "all_gather_matmul: the fused GEMM needs an sm_90 GPU (Hopper)";
  std::string why;
  detail::FlaggedGemm probe{};
  if (!detail::flagged_gemm_supported(probe, &why)) return "all_gather_matmul: " + why;
  return {};
}

struct Prepared {
  detail::Resolved gathered;
  bool in_place = false;
  int shard_rows = 0;
  size_t row_bytes = 0;
  detail::GatherPieces pieces;
  detail::CallDescriptor call;
};

Prepared prepare(void* c, Operand gathered_a, const void* a_shard, const void* b, int64_t m, int64_t n, int64_t k,
                 DataType type, CommunicatorState& st, Communicator& comm) {
  std::string why = build_problem(st);
  if (!why.empty()) throw Error(ErrorCode::kUnsupported, why);
  why = shape_problem(m, n, k, type, st.world);
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
  if (detail::address_alignment(p.gathered.local) < 16)
    throw Error(ErrorCode::kInvalidArgument, "all_gather_matmul: gathered_a must be 16-byte aligned");
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
  detail::require_no_partial_overlap(c, c_bytes, p.gathered.local, a_bytes, false, kOp);
  detail::require_no_partial_overlap(c, c_bytes, b, b_bytes, false, kOp);
  for (const auto& [ptr, what] : {std::pair<const void*, const char*>{b, "b"}, {c, "c"}, {a_shard, "a_shard"}}) {
    if (detail::address_alignment(ptr) < 16)
      throw Error(ErrorCode::kInvalidArgument, std::string("all_gather_matmul: ") + what + " must be 16-byte aligned");
  }
  p.pieces = detail::plan_gather_pieces(p.shard_rows, p.row_bytes, detail::flagged_gemm_tile_rows());
  p.call = detail::make_call_descriptor(detail::kOpAllGatherMatmul, type, ReduceOp::kSum, size_t(m) * size_t(k),
                                        Algo::kCopyEngine, 0, p.in_place, false, 0, true, p.gathered.heap_offset);
  p.call.n = n;
  p.call.k = k;
  return p;
}

void write_flag(const uint32_t* flag, cudaStream_t stream) {
  CUstreamBatchMemOpParams op = detail::stream_write_op(flag, 1u);
  SYMMEM_CU_CHECK(detail::DriverApi::get().stream_batch_mem_op(stream, 1, &op, 0));
}

// Copies of this rank's shard into `slot` (rank `dst`'s gathered_a slot of this rank, as mapped
// here), each followed by the write of `flags` (rank dst's flags, as mapped here).
void enqueue_shard_copies(const Prepared& p, int rank, const void* a_shard, char* slot, const uint32_t* flags,
                          bool copy, cudaStream_t stream) {
  for (const detail::GatherCopy& piece : detail::plan_gather_copies(rank, p.shard_rows, p.pieces)) {
    const size_t at = size_t(piece.first_row) * p.row_bytes;
    if (copy)
      SYMMEM_CUDA_CHECK(cudaMemcpyAsync(slot + at, static_cast<const char*>(a_shard) + at,
                                        size_t(piece.rows) * p.row_bytes, cudaMemcpyDeviceToDevice, stream));
    write_flag(flags + piece.chunk, stream);
  }
}

}  // namespace

std::string all_gather_matmul_unsupported(Operand gathered_a, int64_t m, int64_t n, int64_t k, DataType type,
                                          Communicator& comm) {
  CommunicatorState& st = detail::state_of(comm);
  detail::DeviceGuard guard(st.device);
  std::string why = build_problem(st);
  if (why.empty()) why = shape_problem(m, n, k, type, st.world);
  if (why.empty() && !gathered_a.symmetric()) why = "all_gather_matmul: gathered_a must be a symmetric operand";
  if (why.empty()) {
    try {
      detail::resolve(gathered_a, size_t(m) * size_t(k) * dtype_size(type), "gathered_a", kOp, st);
    } catch (const Error& e) {
      why = e.what();
    }
  }
  return why;
}

void all_gather_matmul(void* c, Operand gathered_a, const void* a_shard, const void* b, int64_t m, int64_t n,
                       int64_t k, DataType type, Communicator& comm, cudaStream_t stream) {
  CommunicatorState& st = detail::state_of(comm);
  st.ensure_usable(kOp);
  detail::DeviceGuard guard(st.device);
  const Prepared p = prepare(c, gathered_a, a_shard, b, m, n, k, type, st, comm);
  if (!st.copy_engine || !st.board) throw Error(ErrorCode::kInternal, "all_gather_matmul: no copy-engine state");
  const uint32_t signature = detail::signature_of(p.call);
  st.record_call(signature, p.call);

  const int rank = st.rank, world = st.world;
  detail::CopyEngineState& ce = *st.copy_engine;
  Buffer* flag_area = st.workspaces->gather_flags();
  const Buffer::DeviceHandle flags = flag_area->device_handle();
  const size_t shard_bytes = size_t(p.shard_rows) * p.row_bytes;
  const int streams = ce.streams();
  cudaStream_t control = ce.side_stream(0);
  cudaStream_t own_stream = streams > 1 ? ce.side_stream(1) : control;

  SYMMEM_CUDA_CHECK(cudaEventRecord(ce.fork_event(), stream));
  SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(control, ce.fork_event(), 0));
  if (own_stream != control) SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(own_stream, ce.fork_event(), 0));

  // The own shard (no handshake: see the top of the file).
  char* own_slot = static_cast<char*>(p.gathered.local) + size_t(rank) * shard_bytes;
  enqueue_shard_copies(p, rank, a_shard, own_slot, flags.signal_pad, !p.in_place, own_stream);

  // The peers' slots.
  std::vector<int> used{0};
  if (own_stream != control) used.push_back(1);
  if (world > 1) {
    detail::enqueue_handshake(*st.board, rank, world, detail::CopyEngineState::kPhaseReady, signature, control);
    // Invariant: every peer is in this call and may be written.
    std::vector<cudaStream_t> push_streams{control};
    for (int s = 2; s < streams; ++s) push_streams.push_back(ce.side_stream(s));
    if (push_streams.size() > 1) SYMMEM_CUDA_CHECK(cudaEventRecord(ce.fork_event(), control));
    for (int k_back = world - 1, i = 0; k_back >= 1; --k_back, ++i) {
      const int peer = (rank + k_back) % world;
      const int s = i % static_cast<int>(push_streams.size());
      if (s > 0 && i < static_cast<int>(push_streams.size())) {
        SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(push_streams[s], ce.fork_event(), 0));
        used.push_back(s + 1);
      }
      char* peer_slot = static_cast<char*>(p.gathered.peer(peer)) + size_t(rank) * shard_bytes;
      enqueue_shard_copies(p, rank, a_shard, peer_slot, flags.peer_signal_pads[peer], true, push_streams[s]);
    }
  }
  for (int s : used) {
    if (s == 0) continue;
    SYMMEM_CUDA_CHECK(cudaEventRecord(ce.join_event(s), ce.side_stream(s)));
    SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(control, ce.join_event(s), 0));
  }
  if (world > 1)
    detail::enqueue_handshake(*st.board, rank, world, detail::CopyEngineState::kPhaseDone, signature, control);
  // Invariant (control stream): every copy into and out of this rank is complete.

  detail::FlaggedGemm gemm{};
  gemm.a = p.gathered.local;
  gemm.b = b;
  gemm.c = c;
  gemm.m = static_cast<int>(m);
  gemm.n = static_cast<int>(n);
  gemm.k = static_cast<int>(k);
  gemm.type = type;
  gemm.sm_count = st.sm_count;
  detail::ChunkFlags& chunks = gemm.chunks;
  chunks.flags = flags.signal_pad;
  chunks.rows = gemm.m;
  chunks.shard_rows = p.shard_rows;
  chunks.piece_rows = p.pieces.piece_rows;
  chunks.pieces = p.pieces.pieces;
  chunks.tile_rows = detail::flagged_gemm_tile_rows();
  chunks.tiles = (gemm.m + chunks.tile_rows - 1) / chunks.tile_rows;
  chunks.first_tile = static_cast<int>(int64_t(rank) * p.shard_rows / chunks.tile_rows);
  chunks.sync = st.sync_args(detail::kOpAllGatherMatmul, signature);
  detail::run_flagged_gemm(gemm, stream);

  SYMMEM_CUDA_CHECK(cudaEventRecord(ce.join_event(0), control));
  SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(stream, ce.join_event(0), 0));
  SYMMEM_CUDA_CHECK(cudaMemsetAsync(flags.signal_pad, 0, size_t(world) * p.pieces.pieces * sizeof(uint32_t), stream));
  // Invariant: this rank's flags are 0 again; no peer writes them before this rank's next ready.
}

}  // namespace symmem
