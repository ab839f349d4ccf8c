// all_reduce and reduce_scatter: one path. Validate -> plan (from values equal on every rank) ->
// sign -> per chunk: stage local operands peers must reach, launch.
#include <algorithm>
#include <cstdio>
#include <string>

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

namespace symmem::detail {
namespace {

struct PreparedReduction {
  ReducePlan plan;
  bool reduce_scatter = false;
  size_t count = 0;  // all-reduce: elements; reduce-scatter: elements per rank
  DataType type = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  bool in_place = false;
  Resolved in;
  Resolved out;
  CallDescriptor call;
};

// Reduce-scatter: in holds count * world elements, out count; all-reduce: both hold count. Launches
// nothing. `site`: where this rank's operand checks refuse the call (null: a describe query).
PreparedReduction prepare(Collective collective, const CallOperand& out, const CallOperand& in, size_t count,
                          DataType type, ReduceOp op, CommunicatorState& st, const CollectiveOptions& options,
                          const RefusalSite* site) {
  const bool reduce_scatter = collective == Collective::kReduceScatter;
  const char* name = collective_name(collective);
  if (type == DataType::kUInt8)
    throw Error(ErrorCode::kInvalidArgument, std::string(name) + ": uint8 is not reducible; use int32");
  if (op == ReduceOp::kAvg && type == DataType::kInt32)
    throw Error(ErrorCode::kInvalidArgument, std::string(name) + ": avg needs a floating type, not int32");
  PreparedReduction p;
  p.reduce_scatter = reduce_scatter;
  p.count = count;
  p.type = type;
  p.op = op;
  const size_t elem = dtype_size(type);
  own_arguments(site, [&] {
    const size_t out_bytes = count * elem;
    const size_t in_bytes = reduce_scatter ? out_bytes * st.world : out_bytes;
    p.in = resolve(in, in_bytes, "input", name, st);
    // In place: all-reduce with in == out; reduce-scatter with out = this rank's slice of in.
    const char* slice = static_cast<const char*>(p.in.local) + (reduce_scatter ? st.rank * out_bytes : 0);
    p.in_place = out.ptr() == slice;
    p.out = p.in_place ? shifted(p.in, reduce_scatter ? st.rank * out_bytes : 0)
                       : resolve(out, out_bytes, "output", name, st);
    require_no_partial_overlap(p.out.local, out_bytes, p.in.local, in_bytes, p.in_place, name);
  });

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

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Where one chunk's operands are for this rank and its peers, once staged.
struct ChunkOperands {
  const char* in = nullptr;              // this rank's input (rank r's range at r * peer_stride)
  const void* in_peers[kMaxWorld] = {};  // every rank's input, where the kernel reads peers
  size_t peer_stride = 0;                // elements
  char* out = nullptr;
};

ChunkOperands stage_chunk(const PreparedReduction& p, CommunicatorState& st, size_t begin, size_t n,
                          cudaStream_t stream) {
  const int world = st.world;
  const size_t elem = dtype_size(p.type);
  const Workspaces& ws = *st.workspaces;
  const ReducePlan& plan = p.plan;
  const bool rs = p.reduce_scatter;
  ChunkOperands c;
  c.out = static_cast<char*>(p.out.local) + begin * elem;
  // This chunk of rank r's input starts at in + begin (all-reduce) or in + r * count + begin
  // (reduce-scatter: peer_stride elements between the ranks' slices).
  c.in = static_cast<const char*>(p.in.local) + begin * elem;
  c.peer_stride = rs ? p.count : 0;
  if (plan.stage_input) {
    char* staged = static_cast<char*>(ws.staging_in()->ptr());
    if (rs) {
      SYMMEM_CUDA_CHECK(
          cudaMemcpy2DAsync(staged, n * elem, c.in, p.count * elem, n * elem, world, cudaMemcpyDeviceToDevice, stream));
      c.peer_stride = n;
    } else {
      SYMMEM_CUDA_CHECK(cudaMemcpyAsync(staged, c.in, n * elem, cudaMemcpyDeviceToDevice, stream));
    }
    c.in = staged;
    for (int r = 0; r < world; ++r) c.in_peers[r] = ws.staging_in()->peer_ptr(r);
  } else if (plan.reads_peer_inputs) {
    for (int r = 0; r < world; ++r) c.in_peers[r] = p.in.peer(r, begin * elem);
  } else if (plan.kernel == KernelId::kAllReduceLowLatency || plan.kernel == KernelId::kAllReduceLowLatencyTwoShot) {
    // The low-latency all-reduces read their input in 4-byte words: a misaligned local input is
    // first copied into this rank's staging area (peers never read it in these algorithms). A
    // local decision that changes nothing in the protocol.
    if (reinterpret_cast<uintptr_t>(c.in) % 4 != 0) {
      SYMMEM_CUDA_CHECK(cudaMemcpyAsync(ws.staging_in()->ptr(), c.in, n * elem, cudaMemcpyDeviceToDevice, stream));
      c.in = static_cast<const char*>(ws.staging_in()->ptr());
    }
  }
  return c;
}

void launch_chunk(const PreparedReduction& p, CommunicatorState& st, uint32_t signature, size_t begin, size_t n,
                  cudaStream_t stream) {
  const int world = st.world;
  const size_t elem = dtype_size(p.type);
  const Workspaces& ws = *st.workspaces;
  const ReducePlan& plan = p.plan;
  const bool rs = p.reduce_scatter;
  const ChunkOperands c = stage_chunk(p, st, begin, n, stream);
  const SyncArgs sync = st.sync_args(rs ? kOpReduceScatter : kOpAllReduce, signature);
  // 16-byte vectors where every address this rank touches allows them (peers' copies of a
  // symmetric or staged operand sit at the same offsets as this rank's).
  const bool vector = plan.vector && aligned16(c.out) && aligned16(c.in) && (!rs || (c.peer_stride * elem) % 16 == 0) &&
                      (!plan.reads_peer_inputs || aligned16(c.in_peers[st.rank]));
  const int blocks = plan.blocks;
  switch (plan.kernel) {
    case KernelId::kReduceFromEveryRank: {
      ReduceFromEveryRankArgs a{};
      for (int r = 0; r < world; ++r) a.in_peers[r] = c.in_peers[r];
      a.out = c.out;
      a.count = n;
      a.peer_stride = c.peer_stride;
      a.sync = sync;
      return launch_reduce_from_every_rank(p.type, p.op, vector, a, blocks, stream);
    }
    case KernelId::kReducePushed: {
      // Two parity halves at fixed places (calls alternate between them); a slot per sender in each.
      ReducePushedArgs a{};
      a.in = c.in;
      a.out = c.out;
      a.count = n;
      a.peer_stride = c.peer_stride;
      for (int r = 0; r < world; ++r) a.receive_peers[r] = ws.receive_area()->peer_ptr(r);
      a.receive_half = ws.receive_half_bytes() / elem;
      a.receive_slot = (n * elem + 255) / 256 * 256 / elem;
      a.sync = sync;
      return launch_reduce_pushed(p.type, p.op, vector, a, blocks, stream);
    }
    case KernelId::kAllReduceTwoShot: {
      // The reduced slices go into every rank's output when it is symmetric, else through the
      // ranks' staging_out, from which every rank gathers them.
      AllReduceTwoShotArgs a{};
      for (int r = 0; r < world; ++r) a.in_peers[r] = c.in_peers[r];
      a.out = c.out;
      a.count = n;
      a.results_to_peers = !plan.gather_via_staging;
      for (int r = 0; r < world; ++r) {
        if (plan.gather_via_staging)
          a.gather_peers[r] = ws.staging_out()->peer_ptr(r);
        else
          a.out_peers[r] = p.out.peer(r, begin * elem);
      }
      a.sync = sync;
      return launch_all_reduce_two_shot(p.type, p.op, vector, a, blocks, stream);
    }
    case KernelId::kAllReduceTwoShotPush: {
      AllReduceTwoShotPushArgs a{};
      a.in = c.in;
      a.count = n;
      for (int r = 0; r < world; ++r) {
        a.out_peers[r] = p.out.peer(r, begin * elem);
        a.slot_peers[r] = ws.push_slots()->peer_ptr(r);
      }
      a.sync = sync;
      return launch_all_reduce_two_shot_push(p.type, p.op, vector, a, blocks, stream);
    }
    case KernelId::kReducePipelined: {
      // One kernel for the whole call: the kernel lays out a reduce-scatter's slices by `count`,
      // and sizes its pieces for slots of staging_capacity() bytes in every one of the four areas.
      if (n != p.count || ws.receive_half_bytes() * 2 != ws.staging_capacity())
        SYMMEM_THROW(ErrorCode::kInternal, "reduce_pipelined: a chunk of the call or unequal workspace areas");
      ReducePipelinedArgs a{};
      a.in = c.in;
      a.out = c.out;
      a.count = n;
      a.gather = !rs;
      a.piece = plan.piece_elements;
      for (int r = 0; r < world; ++r) {
        a.send_slots[0][r] = ws.push_slots()->peer_ptr(r);
        a.send_slots[1][r] = ws.receive_area()->peer_ptr(r);
        a.result_slots[0][r] = ws.staging_out()->peer_ptr(r);
        a.result_slots[1][r] = ws.staging_in()->peer_ptr(r);
      }
      a.sync = sync;
      return launch_reduce_pipelined(p.type, p.op, vector, a, blocks, stream);
    }
    case KernelId::kAllReduceLowLatency:
    case KernelId::kAllReduceLowLatencyTwoShot:
    case KernelId::kReduceScatterLowLatency: {
      LowLatencyReduceArgs a{};
      a.in = c.in;
      a.out = c.out;
      a.count = n;
      a.peer_stride = c.peer_stride;
      a.lines = ws.low_latency_lines();
      a.sync = sync;
      if (plan.kernel == KernelId::kAllReduceLowLatency)
        return launch_all_reduce_low_latency(p.type, p.op, a, blocks, stream);
      if (plan.kernel == KernelId::kAllReduceLowLatencyTwoShot)
        return launch_all_reduce_low_latency_two_shot(p.type, p.op, a, blocks, stream);
      return launch_reduce_scatter_low_latency(p.type, p.op, a, blocks, stream);
    }
    default:
      SYMMEM_THROW(ErrorCode::kInternal, std::string(rs ? "reduce_scatter" : "all_reduce") + ": no launch for kernel " +
                                             kernel_name(plan.kernel));
  }
}

}  // namespace

void reduction_entry(Collective collective, const CallOperand& out, const CallOperand& in, size_t count,
                     DataType type, ReduceOp op, Communicator& comm, cudaStream_t stream,
                     const CollectiveOptions& options) {
  CommunicatorState& st = state_of(comm);
  const char* name = collective_name(collective);
  st.ensure_usable(name);
  st.require_one_node(name);
  if (count == 0) return;
  DeviceGuard guard(st.device);
  const RefusalSite site{st, collective == Collective::kReduceScatter ? kOpReduceScatter : kOpAllReduce, name, stream};
  const PreparedReduction p = prepare(collective, out, in, count, type, op, st, options, &site);
  EnqueueScope enqueue(st, stream);
  const uint32_t signature = st.sign_call(p.call);
  if (st.debug) std::fprintf(stderr, "symmem rank %d: %s %s\n", st.rank, name, describe(p.plan).c_str());
  for (const auto& chunk : plan_chunks(p.count, p.plan.chunk_elements))
    launch_chunk(p, st, signature, chunk.begin, chunk.count, stream);
}

std::string describe_reduction_entry(Collective collective, const CallOperand& out, const CallOperand& in,
                                     size_t count, DataType type, Communicator& comm,
                                     const CollectiveOptions& options) {
  CommunicatorState& st = state_of(comm);
  DeviceGuard guard(st.device);
  st.require_one_node(collective_name(collective));
  return describe(prepare(collective, out, in, count, type, ReduceOp::kSum, st, options, nullptr).plan);
}

}  // namespace symmem::detail

namespace symmem {

void all_reduce(Operand out, Operand in, size_t count, DataType type, ReduceOp op, Communicator& comm,
                cudaStream_t stream, const CollectiveOptions& options) {
  detail::reduction_entry(detail::Collective::kAllReduce, out, in, count, type, op, comm, stream, options);
}

void reduce_scatter(Operand out, Operand in, size_t count, DataType type, ReduceOp op, Communicator& comm,
                    cudaStream_t stream, const CollectiveOptions& options) {
  detail::reduction_entry(detail::Collective::kReduceScatter, out, in, count, type, op, comm, stream, options);
}

std::string describe_all_reduce(Operand out, Operand in, size_t count, DataType type, Communicator& comm,
                                const CollectiveOptions& options) {
  return detail::describe_reduction_entry(detail::Collective::kAllReduce, out, in, count, type, comm, options);
}

std::string describe_reduce_scatter(Operand out, Operand in, size_t count, DataType type, Communicator& comm,
                                    const CollectiveOptions& options) {
  return detail::describe_reduction_entry(detail::Collective::kReduceScatter, out, in, count, type, comm, options);
}

}  // namespace symmem
