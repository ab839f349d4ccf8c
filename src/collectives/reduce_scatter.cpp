// reduce_scatter: the same preparation and launch as all_reduce (reduction_launch.hpp).
#include "collectives/reduction_launch.hpp"
#include "comm/communicator_state.hpp"
#include "comm/refusal.hpp"
#include "common/device_guard.hpp"
#include "symmem/collectives.hpp"

namespace symmem {

std::string describe_reduce_scatter(Operand out, Operand in, size_t count, DataType type, Communicator& comm,
                                    const CollectiveOptions& options) {
  detail::CommunicatorState& st = detail::state_of(comm);
  detail::DeviceGuard guard(st.device);
  return detail::describe(
      detail::prepare_reduction(true, out, in, count, type, ReduceOp::kSum, st, options, nullptr).plan);
}

void reduce_scatter(Operand out, Operand in, size_t count, DataType type, ReduceOp op, Communicator& comm,
                    cudaStream_t stream, const CollectiveOptions& options) {
  detail::CommunicatorState& st = detail::state_of(comm);
  st.ensure_usable("reduce_scatter");
  st.require_one_node("reduce_scatter");
  if (count == 0) return;
  detail::DeviceGuard guard(st.device);
  const detail::RefusalSite site{st, detail::kOpReduceScatter, "reduce_scatter", stream};
  detail::run_reduction(detail::prepare_reduction(true, out, in, count, type, op, st, options, &site), st, stream);
}

}  // namespace symmem
