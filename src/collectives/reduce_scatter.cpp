// reduce_scatter: the same preparation as all_reduce (reduction_launch.hpp), then the kernel.
#include "collectives/reduction_launch.hpp"
#include "collectives/validate.hpp"
#include "common/device_guard.hpp"
#include "heap/communicator_impl.hpp"
#include "symmem/collectives.hpp"

namespace symmem {

std::string describe_reduce_scatter(const void* out, const void* in, size_t count, DataType type, Communicator& comm,
                                    const CollectiveOptions& options) {
  detail::DeviceGuard guard(comm.device());
  return detail::describe(detail::prepare_reduction(true, const_cast<void*>(out), in, count, type, ReduceOp::kSum, comm,
                                                    nullptr, options, false)
                              .plan);
}

void reduce_scatter(void* out, const void* in, size_t count, DataType type, ReduceOp op, Communicator& comm,
                    cudaStream_t stream, const CollectiveOptions& options) {
  Communicator::Impl& impl = comm.impl();
  impl.ensure_usable("reduce_scatter");
  detail::check_args_across_ranks(comm, "reduce_scatter", count, type, options.algo);
  if (count == 0) return;
  detail::DeviceGuard guard(impl.device);
  const auto p = detail::prepare_reduction(true, out, in, count, type, op, comm, stream, options, true);
  // Reduce-scatter is a one-shot kernel over this rank's slice (from element rank * count): reading
  // the peers' slices (two_shot), or receiving them in the receive area (two_shot_push).
  const auto kernel = p.plan.receive_area ? detail::AllReduceKernel::kOneShotPush : detail::AllReduceKernel::kOneShot;
  detail::launch_all_reduce(kernel, type, op, p.plan.vector, p.args, p.plan.blocks, stream);
}

}  // namespace symmem
