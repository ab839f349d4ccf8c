// all_reduce, and the reduction path it shares with reduce_scatter: validate -> plan (from values
// equal on every rank) -> sign -> per chunk: stage local operands peers must reach, launch.
#include <algorithm>
#include <cstdio>
#include <string>

#include "collectives/reduction_launch.hpp"
#include "collectives/validate.hpp"
#include "comm/communicator_state.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "kernels/kernel_args.hpp"
#include "symmem/collectives.hpp"

namespace symmem::detail {

PreparedReduction prepare_reduction(bool reduce_scatter, const Operand& out, const Operand& in, size_t count,
                                    DataType type, ReduceOp op, CommunicatorState& st,
                                    const CollectiveOptions& options) {
  const char* name = reduce_scatter ? "reduce_scatter" : "all_reduce";
  st.require_one_node(name);
  if (type == DataType::kUInt8)
    throw Error(ErrorCode::kInvalidArgument, std::string(name) + ": uint8 is not reducible; use int32");
  PreparedReduction p;
  p.reduce_scatter = reduce_scatter;
  p.count = count;
  p.type = type;
  p.op = op;
  const size_t elem = dtype_size(type);
  const size_t out_bytes = count * elem;
  const size_t in_bytes = reduce_scatter ? out_bytes * st.world : out_bytes;
  p.in = resolve(in, in_bytes, "input", name, st);
  // In place: all-reduce with in == out; reduce-scatter with out = this rank's slice of in.
  const char* slice = static_cast<const char*>(p.in.local) + (reduce_scatter ? st.rank * out_bytes : 0);
  p.in_place = out.ptr() == slice;
  p.out = p.in_place ? shifted(p.in, reduce_scatter ? st.rank * out_bytes : 0)
                     : resolve(out, out_bytes, "output", name, st);
  require_no_partial_overlap(p.out.local, out_bytes, p.in.local, in_bytes, p.in_place, name);

  ReduceRequest request;
  request.reduce_scatter = reduce_scatter;
  request.count = count;
  request.elem_bytes = elem;
  fill_agreed_request(request, st, options, p.in, p.out);
  request.low_latency_capacity = Workspaces::kLowLatencySlotBytes;
  request.in_place = p.in_place;
  p.plan = plan_reduce(request, *st.tuning);

  p.call = make_call_descriptor(reduce_scatter ? kOpReduceScatter : kOpAllReduce, type, op, count, p.plan.algo,
                                p.plan.blocks, p.in_place, p.in.symmetric, p.in.heap_offset, p.out.symmetric,
                                p.in_place ? 0 : p.out.heap_offset);
  return p;
}

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

void launch_chunk(const PreparedReduction& p, CommunicatorState& st, uint32_t signature, size_t begin, size_t n,
                  cudaStream_t stream) {
  const int world = st.world;
  const int rank = st.rank;
  const size_t elem = dtype_size(p.type);
  const Workspaces& ws = *st.workspaces;
  const ReducePlan& plan = p.plan;
  const bool rs = p.reduce_scatter;
  const bool low_latency = plan.algo == Algo::kLowLatency || plan.algo == Algo::kLowLatencyTwoShot;

  ReduceKernelArgs a{};
  a.out = static_cast<char*>(p.out.local) + begin * elem;
  a.count = n;
  a.sync = st.sync_args(rs ? kOpReduceScatter : kOpAllReduce, signature);
  a.ll_slot_words = Workspaces::kLowLatencySlotBytes / 4;

  // This chunk of rank r's input starts at in + begin (all-reduce) or in + r * count + begin
  // (reduce-scatter: a.peer_stride elements between the ranks' slices).
  const char* in_local = static_cast<const char*>(p.in.local) + begin * elem;
  a.peer_stride = rs ? p.count : 0;
  if (plan.stage_input) {
    char* staged = static_cast<char*>(ws.staging_in()->ptr());
    if (rs) {
      SYMMEM_CUDA_CHECK(cudaMemcpy2DAsync(staged, n * elem, in_local, p.count * elem, n * elem, world,
                                          cudaMemcpyDeviceToDevice, stream));
      a.peer_stride = n;
    } else {
      SYMMEM_CUDA_CHECK(cudaMemcpyAsync(staged, in_local, n * elem, cudaMemcpyDeviceToDevice, stream));
    }
    in_local = staged;
    for (int r = 0; r < world; ++r) a.in_peers[r] = ws.staging_in()->peer_ptr(r);
  } else if (plan.reads_peer_inputs) {
    for (int r = 0; r < world; ++r) a.in_peers[r] = p.in.peer(r, begin * elem);
  } else {
    // Low latency reads its input in 4-byte words: a misaligned local input is first copied into
    // this rank's staging area (peers never read it in these algorithms). A local decision that
    // changes nothing in the protocol.
    // (The low-latency reduce-scatter reads slices at any alignment.)
    if (low_latency && !rs && reinterpret_cast<uintptr_t>(in_local) % 4 != 0) {
      SYMMEM_CUDA_CHECK(cudaMemcpyAsync(ws.staging_in()->ptr(), in_local, n * elem, cudaMemcpyDeviceToDevice, stream));
      in_local = static_cast<const char*>(ws.staging_in()->ptr());
    }
    a.in_peers[rank] = in_local;
  }
  if (low_latency)
    for (int r = 0; r < world; ++r) a.ll_peers[r] = static_cast<uint64_t*>(ws.low_latency()->peer_ptr(r));
  if (plan.receive_area) {
    // Two parity halves at fixed places (calls alternate between them); a slot per sender in each.
    const size_t slot_bytes = (n * elem + 255) / 256 * 256;
    for (int r = 0; r < world; ++r) a.receive_peers[r] = ws.receive_area()->peer_ptr(r);
    a.receive_half = ws.receive_half_bytes() / elem;
    a.receive_slot = slot_bytes / elem;
  }
  if (plan.algo == Algo::kTwoShotPush && !rs)
    for (int r = 0; r < world; ++r) a.scratch_peers[r] = ws.push_slots()->peer_ptr(r);
  if (plan.gather_via_scratch)
    for (int r = 0; r < world; ++r) a.scratch_peers[r] = ws.staging_out()->peer_ptr(r);
  // Two-shot stores its results into every rank's output when the output is symmetric.
  if (p.out.symmetric && !rs && !plan.gather_via_scratch) {
    a.results_to_peers = true;
    for (int r = 0; r < world; ++r) a.out_peers[r] = p.out.peer(r, begin * elem);
  }

  // 16-byte vectors where every address this rank touches allows them (peers' copies of a
  // symmetric or staged operand sit at the same offsets as this rank's).
  const bool vector = plan.vector && aligned16(a.out) && aligned16(in_local) &&
                      (!rs || (a.peer_stride * elem) % 16 == 0) &&
                      (!plan.reads_peer_inputs || aligned16(a.in_peers[rank]));
  const int blocks = plan.blocks;
  switch (plan.algo) {
    case Algo::kOneShot:
    case Algo::kTwoShot:
      if (rs) return launch_all_reduce(AllReduceKernel::kOneShot, p.type, p.op, vector, a, blocks, stream);
      return launch_all_reduce(plan.algo == Algo::kOneShot ? AllReduceKernel::kOneShot : AllReduceKernel::kTwoShot,
                               p.type, p.op, vector, a, blocks, stream);
    case Algo::kOneShotPush:
      return launch_all_reduce(AllReduceKernel::kOneShotPush, p.type, p.op, vector, a, blocks, stream);
    case Algo::kTwoShotPush:
      // Reduce-scatter two_shot_push is the first half of one-shot push (peers store their slices).
      return launch_all_reduce(rs ? AllReduceKernel::kOneShotPush : AllReduceKernel::kTwoShotPush, p.type, p.op, vector,
                               a, blocks, stream);
    case Algo::kLowLatency:
      if (rs) return launch_reduce_scatter_low_latency(p.type, p.op, a, blocks, stream);
      return launch_all_reduce_low_latency(false, p.type, p.op, a, blocks, stream);
    case Algo::kLowLatencyTwoShot: return launch_all_reduce_low_latency(true, p.type, p.op, a, blocks, stream);
    default:
      SYMMEM_THROW(ErrorCode::kInternal,
                   std::string(rs ? "reduce_scatter" : "all_reduce") + ": no launch for " + algo_name(plan.algo));
  }
}

}  // namespace

void run_reduction(const PreparedReduction& p, CommunicatorState& st, cudaStream_t stream) {
  EnqueueScope enqueue(st, stream);
  const uint32_t signature = signature_of(p.call);
  st.record_call(signature, p.call);
  if (st.debug)
    std::fprintf(stderr, "symmem rank %d: %s %s\n", st.rank, p.reduce_scatter ? "reduce_scatter" : "all_reduce",
                 describe(p.plan).c_str());
  const size_t elem = dtype_size(p.type);
  const size_t limit = reduce_chunk_elements(p.plan, p.reduce_scatter, elem, st.world, st.workspaces->limits());
  for (const auto& chunk : plan_chunks(p.count, limit))
    launch_chunk(p, st, signature, chunk.begin, chunk.count, stream);
}

}  // namespace symmem::detail

namespace symmem {

std::string describe_all_reduce(Operand out, Operand in, size_t count, DataType type, Communicator& comm,
                                const CollectiveOptions& options) {
  detail::CommunicatorState& st = detail::state_of(comm);
  detail::DeviceGuard guard(st.device);
  return detail::describe(detail::prepare_reduction(false, out, in, count, type, ReduceOp::kSum, st, options).plan);
}

void all_reduce(Operand out, Operand in, size_t count, DataType type, ReduceOp op, Communicator& comm,
                cudaStream_t stream, const CollectiveOptions& options) {
  detail::CommunicatorState& st = detail::state_of(comm);
  st.ensure_usable("all_reduce");
  st.require_one_node("all_reduce");
  if (count == 0) return;
  detail::DeviceGuard guard(st.device);
  detail::run_reduction(detail::prepare_reduction(false, out, in, count, type, op, st, options), st, stream);
}

}  // namespace symmem
