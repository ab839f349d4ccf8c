// A standalone device barrier among all ranks: one block, the same flags as the collectives,
// carrying the signature of the barrier call (SyncArgs::signature): a rank whose block 0 is in a
// collective instead fails the barrier as a mismatch (device/wait.cuh).
#include "common/check.hpp"
#include "device/dependent_launch.cuh"
#include "device/wait.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"

namespace symmem::detail {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) barrier_kernel(SyncArgs s) {
  device::enter_kernel();
  const uint32_t epoch = device::epoch_begin(s);
  if (device::barrier(s, epoch, 0)) device::epoch_commit(s, epoch);
}

}  // namespace

void launch_barrier(const SyncArgs& sync, cudaStream_t stream) {
  launch_kernel(barrier_kernel, 1, 32, 0, stream, sync);
}

}  // namespace symmem::detail
