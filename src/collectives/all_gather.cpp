// all_gather: validate -> plan -> stage (if a buffer is outside the heap) -> launch.
#include <cstdio>
#include <string>

#include "collectives/all_gather_paths.hpp"
#include "collectives/copy_engine_state.hpp"
#include "collectives/heap_view.hpp"
#include "collectives/validate.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "common/env.hpp"
#include "heap/communicator_impl.hpp"
#include "kernels/kernel_args.hpp"
#include "plan/plan.hpp"
#include "symmem/collectives.hpp"

namespace symmem {
namespace {

struct Prepared {
  detail::AllGatherPlan plan;
  size_t bytes = 0;
  bool in_place = false;
  Buffer* in_buffer = nullptr;
  Buffer* out_buffer = nullptr;
};

Prepared prepare(const void* out, const void* in, size_t count, DataType type, Communicator& comm,
                 const CollectiveOptions& options) {
  Communicator::Impl& impl = comm.impl();
  Prepared p;
  p.bytes = count * dtype_size(type);
  const size_t out_bytes = p.bytes * impl.world;
  p.in_place = in == static_cast<const char*>(out) + impl.rank * p.bytes;
  detail::require_device_pointer(out, out_bytes, "output", "all_gather", comm);
  detail::require_device_pointer(in, p.bytes, "input", "all_gather", comm);
  detail::require_no_partial_overlap(out, out_bytes, in, p.bytes, p.in_place, "all_gather");
  p.out_buffer = comm.find(out, out_bytes);
  p.in_buffer = p.in_place ? p.out_buffer : comm.find(in, p.bytes);

  detail::AllGatherRequest request;
  request.bytes_per_rank = p.bytes;
  request.world = impl.world;
  request.sm_count = impl.sm_count;
  request.options = options;
  request.forced = impl.forced_algo;
  request.forced_blocks = impl.forced_blocks;
  request.in_symmetric = p.in_buffer != nullptr;
  request.out_symmetric = p.out_buffer != nullptr;
  request.in_address = reinterpret_cast<uintptr_t>(in);
  request.out_address = reinterpret_cast<uintptr_t>(out);
  request.copy_engine_push = impl.copy_engine->push();
  request.push_bulk = impl.push_bulk;
  p.plan = detail::plan_all_gather(request, *impl.tuning);
  return p;
}

// Where every rank's input lies, as mapped here. In place, rank r's input is its own slot
// out + r * bytes, not this rank's slot.
void input_views(const Prepared& p, int world, Buffer* in_buffer, const void* in_local, const void* out_local,
                 const void* (&views)[detail::kMaxWorld]) {
  if (p.in_place && !p.plan.stage_input) {
    detail::peer_views(*p.out_buffer, out_local, world, views);
    for (int r = 0; r < world; ++r) views[r] = static_cast<const char*>(views[r]) + r * p.bytes;
  } else {
    detail::peer_views(*in_buffer, in_local, world, views);
  }
}

}  // namespace

std::string describe_all_gather(const void* out, const void* in, size_t count, DataType type, Communicator& comm,
                                const CollectiveOptions& options) {
  detail::DeviceGuard guard(comm.device());
  return detail::describe(prepare(out, in, count, type, comm, options).plan);
}

void all_gather(void* out, const void* in, size_t count, DataType type, Communicator& comm, cudaStream_t stream,
                const CollectiveOptions& options) {
  Communicator::Impl& impl = comm.impl();
  impl.ensure_usable("all_gather");
  detail::check_args_across_ranks(comm, "all_gather", count, type, options.algo);
  if (count == 0) return;
  detail::DeviceGuard guard(impl.device);
  const Prepared p = prepare(out, in, count, type, comm, options);
  if (impl.debug) std::fprintf(stderr, "symmem rank %d: %s\n", impl.rank, detail::describe(p.plan).c_str());
  const size_t bytes = p.bytes;
  const int world = impl.world;

  // Stage what the algorithm needs in the heap but the caller keeps elsewhere.
  const void* in_local = in;
  Buffer* in_buffer = p.in_buffer;
  void* out_local = out;
  Buffer* out_buffer = p.out_buffer;
  if (p.plan.stage_input) {
    in_buffer = impl.scratch_of(bytes, stream, "all_gather");
    SYMMEM_CUDA_CHECK(cudaMemcpyAsync(in_buffer->ptr(), in, bytes, cudaMemcpyDeviceToDevice, stream));
    in_local = in_buffer->ptr();
  }
  if (p.plan.stage_output) {
    out_buffer = impl.scratch_of(bytes * world, stream, "all_gather");
    out_local = out_buffer->ptr();
  }
  // In place, the own slot already holds the data (also when only the input was staged, its
  // source is the output itself).
  const bool copy_own = !p.in_place || p.plan.stage_output;

  if (p.plan.algo == Algo::kCopyEngine) {
    const void* in_peers[detail::kMaxWorld];
    void* out_peers[detail::kMaxWorld];
    if (p.plan.copy_engine_push)
      detail::peer_views(*out_buffer, out_local, world, out_peers);
    else
      input_views(p, world, in_buffer, in_local, out_local, in_peers);
    detail::all_gather_copy_engine(impl, out_local, in_local, bytes, in_peers,
                                   p.plan.copy_engine_push ? out_peers : nullptr, !p.in_place, stream);
  } else {
    detail::AllGatherKernelArgs args{};
    args.in = in_local;
    args.out = out_local;
    args.bytes = bytes;
    args.copy_own = copy_own;
    args.local_warps = p.plan.local_warps;
    args.sync = impl.sync_args(detail::kOpAllGather);
    if (in_buffer) input_views(p, world, in_buffer, in_local, out_local, args.in_peers);
    if (out_buffer) detail::peer_views(*out_buffer, out_local, world, args.out_peers);
    if (p.plan.bulk) {
      detail::launch_all_gather_push_bulk(args, p.plan.blocks, stream);
    } else {
      const auto kernel = p.plan.algo == Algo::kPull ? detail::AllGatherKernel::kPull : detail::AllGatherKernel::kPush;
      detail::launch_all_gather(kernel, p.plan.vector_bytes, args, p.plan.blocks, stream);
    }
  }
  if (p.plan.stage_output)
    SYMMEM_CUDA_CHECK(cudaMemcpyAsync(out, out_local, bytes * world, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace symmem
