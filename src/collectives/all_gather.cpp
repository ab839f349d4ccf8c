// all_gather: validate -> plan (from values equal on every rank) -> sign -> per chunk: stage what
// the algorithm needs peers to reach, launch, copy out.
#include <algorithm>
#include <cstdio>
#include <string>

#include "collectives/all_gather_paths.hpp"
#include "board/call_signature.hpp"
#include "collectives/entry_points.hpp"
#include "collectives/operands.hpp"
#include "collectives/validate.hpp"
#include "comm/communicator_state.hpp"
#include "comm/refusal.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "kernels/kernel_args.hpp"
#include "plan/plan.hpp"
#include "symmem/collectives.hpp"

namespace symmem {
namespace {

using detail::CallOperand;
using detail::CommunicatorState;
using detail::Resolved;

struct Prepared {
  detail::AllGatherPlan plan;
  size_t bytes = 0;  // per rank
  bool in_place = false;
  Resolved in;
  Resolved out;
  detail::CallDescriptor call;
};

// `site`: where this rank's operand checks refuse the call (null: describe_all_gather).
Prepared prepare(const CallOperand& out, const CallOperand& in, size_t count, DataType type, CommunicatorState& st,
                 const CollectiveOptions& options, const detail::RefusalSite* site) {
  Prepared p;
  p.bytes = count * dtype_size(type);
  detail::own_arguments(site, [&] {
    // The output has a slot per rank of the job (of its nodes, when it spans several).
    const size_t out_bytes = p.bytes * st.layout.world;
    const size_t own_slot = st.layout.rank * p.bytes;
    p.out = detail::resolve(out, out_bytes, "output", "all_gather", st);
    // In place: the input is this rank's slot of the output; it is then whatever the output is.
    p.in_place = in.ptr() == static_cast<char*>(p.out.local) + own_slot;
    p.in = p.in_place ? detail::shifted(p.out, own_slot) : detail::resolve(in, p.bytes, "input", "all_gather", st);
    detail::require_no_partial_overlap(p.out.local, out_bytes, p.in.local, p.bytes, p.in_place, "all_gather");
  });

  detail::AllGatherRequest request;
  request.bytes_per_rank = p.bytes;
  request.elem_bytes = dtype_size(type);
  detail::fill_agreed_request(request, st, options, p.in, p.out);
  request.copy_engine_push = st.settings.copy_engine_push;
  request.push_bulk = st.settings.push_bulk;
  request.low_latency_capacity = detail::Workspaces::kLowLatencySlotBytes;
  request.nodes = st.layout.nodes;
  p.plan = detail::plan_all_gather(request, *st.tuning);

  p.call = detail::make_call_descriptor(detail::kOpAllGather, type, ReduceOp::kSum, count, p.plan.algo, p.plan.blocks,
                                        p.in_place, p.in.symmetric, p.in_place ? 0 : p.in.heap_offset, p.out.symmetric,
                                        p.out.heap_offset);
  return p;
}

void run_chunk(const Prepared& p, CommunicatorState& st, uint32_t signature, size_t begin, size_t bytes,
               cudaStream_t stream) {
  const int world = st.world;
  const detail::Workspaces& ws = *st.workspaces;
  const detail::AllGatherPlan& plan = p.plan;

  // Where this chunk's input lies for the peers, and where its output slots are.
  const char* in_local = static_cast<const char*>(p.in.local) + begin;
  const void* in_peers[kMaxWorld] = {};
  if (plan.stage_input) {
    SYMMEM_CUDA_CHECK(cudaMemcpyAsync(ws.staging_in()->ptr(), in_local, bytes, cudaMemcpyDeviceToDevice, stream));
    in_local = static_cast<const char*>(ws.staging_in()->ptr());
    for (int r = 0; r < world; ++r) in_peers[r] = ws.staging_in()->peer_ptr(r);
  } else if (p.in.symmetric) {
    // In place, local rank r's input is its own slot of the output, not this rank's slot.
    for (int r = 0; r < world; ++r)
      in_peers[r] = p.in_place ? p.out.peer(r, st.job_rank(r) * p.bytes + begin) : p.in.peer(r, begin);
  }
  char* out_local = static_cast<char*>(p.out.local) + begin;
  size_t stride = p.bytes;
  void* out_peers[kMaxWorld] = {};
  if (plan.stage_output) {
    out_local = static_cast<char*>(ws.staging_out()->ptr());
    stride = bytes;
    for (int r = 0; r < world; ++r) out_peers[r] = ws.staging_out()->peer_ptr(r);
  } else if (p.out.symmetric) {
    for (int r = 0; r < world; ++r) out_peers[r] = p.out.peer(r, begin);
  }
  // In place the own slot already holds the data, unless the output is staged.
  const bool copy_own = !p.in_place || plan.stage_output;

  switch (plan.kernel) {
    case detail::KernelId::kAllGatherCopyEngine:
    case detail::KernelId::kAllGatherHierarchical: {
      detail::CopyEngineCall call{};
      call.out = out_local;
      call.slot_stride = stride;
      call.in = in_local;
      call.bytes = bytes;
      for (int r = 0; r < kMaxWorld; ++r) {
        call.in_peers[r] = in_peers[r];
        call.out_peers[r] = out_peers[r];
      }
      call.push = plan.copy_engine_push;
      call.copy_own = copy_own;
      call.signature = signature;
      if (plan.kernel == detail::KernelId::kAllGatherHierarchical)
        detail::all_gather_hierarchical(st, call, stream);
      else
        detail::all_gather_copy_engine(st, call, stream);
      break;
    }
    case detail::KernelId::kAllGatherLowLatency: {
      detail::LowLatencyGatherArgs args{};
      args.in = in_local;
      args.out = out_local;
      args.bytes = bytes;
      args.slot_stride = stride;
      args.copy_own = copy_own;
      args.lines = ws.low_latency_lines();
      args.sync = st.sync_args(detail::kOpAllGather, signature);
      detail::launch_all_gather_low_latency(args, plan.blocks, stream);
      break;
    }
    case detail::KernelId::kAllGatherPull:
    case detail::KernelId::kAllGatherPush:
    case detail::KernelId::kAllGatherPushBulk: {
      detail::AllGatherArgs args{};
      args.in = in_local;
      args.out = out_local;
      args.bytes = bytes;
      args.slot_stride = stride;
      args.copy_own = copy_own;
      args.local_warps = plan.local_warps;
      args.sync = st.sync_args(detail::kOpAllGather, signature);
      for (int r = 0; r < kMaxWorld; ++r) {
        args.in_peers[r] = in_peers[r];
        args.out_peers[r] = out_peers[r];
      }
      // The kernel touches this rank's input and output directly: their addresses may narrow the
      // vector (and so the kernel of the protocol); peers' addresses are the plan's.
      const int vector = detail::launch_vector(plan.vector_bytes, {in_local, out_local}, {stride, bytes});
      switch (detail::narrowed_kernel(plan, vector)) {
        case detail::KernelId::kAllGatherPull: detail::launch_all_gather_pull(vector, args, plan.blocks, stream); break;
        case detail::KernelId::kAllGatherPush: detail::launch_all_gather_push(vector, args, plan.blocks, stream); break;
        default: detail::launch_all_gather_push_bulk(args, plan.blocks, stream); break;
      }
      break;
    }
    default:
      SYMMEM_THROW(ErrorCode::kInternal,
                   std::string("all_gather: no launch for kernel ") + detail::kernel_name(plan.kernel));
  }
  if (plan.stage_output)
    SYMMEM_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(p.out.local) + begin, p.bytes, out_local, bytes, bytes,
                                        st.layout.world, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace

void detail::all_gather_entry(const CallOperand& out, const CallOperand& in, size_t count, DataType type,
                              Communicator& comm, cudaStream_t stream, const CollectiveOptions& options) {
  CommunicatorState& st = detail::state_of(comm);
  st.ensure_usable("all_gather");
  if (count == 0) return;
  detail::DeviceGuard guard(st.device);
  const detail::RefusalSite site{st, detail::kOpAllGather, "all_gather", stream};
  const Prepared p = prepare(out, in, count, type, st, options, &site);
  detail::EnqueueScope enqueue(st, stream);
  const uint32_t signature = st.sign_call(p.call);
  if (st.debug) std::fprintf(stderr, "symmem rank %d: %s\n", st.layout.rank, detail::describe(p.plan).c_str());
  const size_t elem = dtype_size(type);
  for (const auto& chunk : detail::plan_chunks(count, p.plan.chunk_elements))
    run_chunk(p, st, signature, chunk.begin * elem, chunk.count * elem, stream);
}

std::string detail::describe_all_gather_entry(const CallOperand& out, const CallOperand& in, size_t count,
                                              DataType type, Communicator& comm, const CollectiveOptions& options) {
  CommunicatorState& st = detail::state_of(comm);
  detail::DeviceGuard guard(st.device);
  return detail::describe(prepare(out, in, count, type, st, options, nullptr).plan);
}

void all_gather(Operand out, Operand in, size_t count, DataType type, Communicator& comm, cudaStream_t stream,
                const CollectiveOptions& options) {
  detail::all_gather_entry(out, in, count, type, comm, stream, options);
}

std::string describe_all_gather(Operand out, Operand in, size_t count, DataType type, Communicator& comm,
                                const CollectiveOptions& options) {
  return detail::describe_all_gather_entry(out, in, count, type, comm, options);
}

}  // namespace symmem
