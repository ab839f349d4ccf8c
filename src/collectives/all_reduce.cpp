// all_reduce and the reduction preparation it shares with reduce_scatter:
// validate -> plan -> stage the input when it lives outside the heap -> launch.
#include <cstdio>
#include <string>

#include "collectives/heap_view.hpp"
#include "collectives/reduction_launch.hpp"
#include "collectives/validate.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "common/env.hpp"
#include "heap/communicator_impl.hpp"
#include "symmem/collectives.hpp"

namespace symmem {
namespace detail {

PreparedReduction prepare_reduction(bool reduce_scatter, void* out, const void* in, size_t count, DataType type,
                                    ReduceOp op, Communicator& comm, cudaStream_t stream,
                                    const CollectiveOptions& options, bool launch) {
  (void)op;  // chosen at launch; the plan does not depend on it
  Communicator::Impl& impl = comm.impl();
  const char* name = reduce_scatter ? "reduce_scatter" : "all_reduce";
  if (type == DataType::kUInt8)
    throw Error(ErrorCode::kInvalidArgument, std::string(name) + ": uint8 is not reducible; use int32");
  const size_t elem = dtype_size(type);
  const size_t out_bytes = count * elem;
  const size_t in_bytes = reduce_scatter ? out_bytes * impl.world : out_bytes;
  const bool in_place = reduce_scatter ? in == static_cast<const char*>(out) - impl.rank * out_bytes : in == out;
  require_device_pointer(out, out_bytes, "output", name, comm);
  require_device_pointer(in, in_bytes, "input", name, comm);
  // All-reduce in place is supported; reduce-scatter's output may be the rank's slice of its input.
  require_no_partial_overlap(out, out_bytes, in, in_bytes, in_place, name);
  Buffer* in_buffer = comm.find(in, in_bytes);
  Buffer* out_buffer = comm.find(out, out_bytes);

  ReduceRequest request;
  request.reduce_scatter = reduce_scatter;
  request.count = count;
  request.elem_bytes = elem;
  request.world = impl.world;
  request.sm_count = impl.sm_count;
  request.options = options;
  request.forced = impl.forced_algo;
  request.forced_blocks = impl.forced_blocks;
  request.in_symmetric = in_buffer != nullptr;
  request.out_symmetric = out_buffer != nullptr;
  request.in_address = reinterpret_cast<uintptr_t>(in);
  request.out_address = reinterpret_cast<uintptr_t>(out);
  request.low_latency_capacity = Communicator::Impl::kLowLatencySlotBytes;
  request.in_place = in_place;

  PreparedReduction p;
  p.plan = plan_reduce(request, *impl.tuning);
  if (!launch) return p;

  ReduceKernelArgs& a = p.args;
  a.out = out;
  a.count = count;
  a.peer_stride = reduce_scatter ? count : 0;
  a.sync = impl.sync_args(reduce_scatter ? kOpReduceScatter : kOpAllReduce);
  a.ll_slot_words = Communicator::Impl::kLowLatencySlotBytes / 4;
  // Scratch layout: [staged input | two-shot results, or two-shot push receive slots].
  const size_t staged = p.plan.stage_input ? (in_bytes + 255) / 256 * 256 : 0;
  const bool push_slots = p.plan.algo == Algo::kTwoShotPush && !p.plan.receive_area;
  const size_t results = push_slots ? two_shot_slice(count, impl.world, elem) * elem * impl.world : out_bytes;
  Buffer* scratch = nullptr;
  if (staged || p.plan.gather_via_scratch || push_slots) scratch = impl.scratch_of(staged + results, stream, name);
  const void* in_local = in;
  if (p.plan.stage_input) {
    SYMMEM_CUDA_CHECK(cudaMemcpyAsync(scratch->ptr(), in, in_bytes, cudaMemcpyDeviceToDevice, stream));
    in_local = scratch->ptr();
    in_buffer = scratch;
  }
  if (p.plan.reads_peer_inputs) {
    peer_views(*in_buffer, in_local, impl.world, a.in_peers);
  } else {
    for (int r = 0; r < kMaxWorld; ++r) a.in_peers[r] = r == impl.rank ? in_local : nullptr;
  }
  if (p.plan.algo == Algo::kLowLatency || p.plan.algo == Algo::kLowLatencyTwoShot)
    peer_views(*impl.low_latency, impl.low_latency->ptr(), impl.world, a.ll_peers);
  if (p.plan.receive_area) {
    // Two halves at fixed places (calls alternate between them); a slot per sender in each.
    const size_t slot_bytes = (out_bytes + 255) / 256 * 256;
    Buffer* area = impl.receive_area_of(2 * slot_bytes * impl.world, stream, name);
    peer_views(*area, area->ptr(), impl.world, a.receive_peers);
    a.receive_half = area->size() / 2 / elem;
    a.receive_slot = slot_bytes / elem;
  }
  if (p.plan.gather_via_scratch || push_slots)
    peer_views(*scratch, static_cast<char*>(scratch->ptr()) + staged, impl.world, a.scratch_peers);
  // Two-shot stores its results into every rank's output when the output is in the heap.
  if (out_buffer && !reduce_scatter && !p.plan.gather_via_scratch)
    peer_views(*out_buffer, out, impl.world, a.out_peers);
  if (impl.debug) std::fprintf(stderr, "symmem rank %d: %s %s\n", impl.rank, name, describe(p.plan).c_str());
  return p;
}

}  // namespace detail

std::string describe_all_reduce(const void* out, const void* in, size_t count, DataType type, Communicator& comm,
                                const CollectiveOptions& options) {
  detail::DeviceGuard guard(comm.device());
  return detail::describe(detail::prepare_reduction(false, const_cast<void*>(out), in, count, type, ReduceOp::kSum,
                                                    comm, nullptr, options, false)
                              .plan);
}

void all_reduce(void* out, const void* in, size_t count, DataType type, ReduceOp op, Communicator& comm,
                cudaStream_t stream, const CollectiveOptions& options) {
  Communicator::Impl& impl = comm.impl();
  impl.ensure_usable("all_reduce");
  detail::check_args_across_ranks(comm, "all_reduce", count, type, options.algo);
  if (count == 0) return;
  detail::DeviceGuard guard(impl.device);
  const auto p = detail::prepare_reduction(false, out, in, count, type, op, comm, stream, options, true);
  switch (p.plan.algo) {
    case Algo::kOneShot:
      return detail::launch_all_reduce(detail::AllReduceKernel::kOneShot, type, op, p.plan.vector, p.args,
                                       p.plan.blocks, stream);
    case Algo::kTwoShot:
      return detail::launch_all_reduce(detail::AllReduceKernel::kTwoShot, type, op, p.plan.vector, p.args,
                                       p.plan.blocks, stream);
    case Algo::kOneShotPush:
      return detail::launch_all_reduce(detail::AllReduceKernel::kOneShotPush, type, op, p.plan.vector, p.args,
                                       p.plan.blocks, stream);
    case Algo::kTwoShotPush:
      return detail::launch_all_reduce(detail::AllReduceKernel::kTwoShotPush, type, op, p.plan.vector, p.args,
                                       p.plan.blocks, stream);
    case Algo::kLowLatency:
      return detail::launch_all_reduce_low_latency(false, type, op, p.args, p.plan.blocks, stream);
    case Algo::kLowLatencyTwoShot:
      return detail::launch_all_reduce_low_latency(true, type, op, p.args, p.plan.blocks, stream);
    default: SYMMEM_THROW(ErrorCode::kInternal, std::string("all_reduce: planner chose ") + algo_name(p.plan.algo));
  }
}

}  // namespace symmem
