// Reduce-scatter on SMs: barrier -> rank r reads slice r of every rank's input (rank order) and
// writes the reduced slice to its output -> barrier (no rank reads this rank's input any more).
#include "device/reduce.cuh"
#include "device/wait.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernel_args.hpp"

namespace symmem::detail {
namespace {

template <typename T, int kOp, bool kVector>
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_scatter_kernel(ReduceKernelArgs a) {
  const SyncArgs& s = a.sync;
  const uint32_t epoch = device::epoch_begin(s);
  if (!device::barrier(s, epoch, 0)) return;
  // Invariant: every rank's input holds this call's data.
  const T* src[kMaxWorld];
  T* dst[kMaxWorld];
#pragma unroll
  for (int r = 0; r < kMaxWorld; ++r) {
    src[r] = static_cast<const T*>(a.in_peers[r < s.world ? r : 0]) + s.rank * a.count;
    dst[r] = static_cast<T*>(a.out);
  }
  device::reduce_range<T, kOp, kVector>(src, s.world, dst, 1, a.count);
  if (!device::barrier(s, epoch, 1)) return;
  device::epoch_commit(s, epoch);
}

}  // namespace

void launch_reduce_scatter(DataType type, ReduceOp op, bool vector, const ReduceKernelArgs& args,
                           int blocks, cudaStream_t stream) {
  dispatch_reduce(type, op, [&](auto t, auto o) {
    using T = decltype(t);
    constexpr int kOp = decltype(o)::value;
    if (vector) reduce_scatter_kernel<T, kOp, true><<<blocks, kThreadsPerBlock, 0, stream>>>(args);
    else reduce_scatter_kernel<T, kOp, false><<<blocks, kThreadsPerBlock, 0, stream>>>(args);
    SYMMEM_LAUNCH_CHECK();
  });
}

}  // namespace symmem::detail
