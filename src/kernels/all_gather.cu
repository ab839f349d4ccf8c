// SM all-gather kernels: pull (every rank reads its peers' inputs) and push (every rank writes its
// input into its peers' outputs). Each kernel: barrier (inputs ready, outputs free) -> copy ->
// barrier (every peer done with my input, everything addressed to me arrived).
// Ranks visit peers in rotated order (rank + 1, rank + 2, ...) so that at any moment each GPU's
// NVLink egress serves one reader per step and the switch load is even.
#include "common/check.hpp"
#include "device/copy.cuh"
#include "device/wait.cuh"
#include "kernels/kernel_args.hpp"

namespace symmem::detail {
namespace {

template <typename V>
__global__ void __launch_bounds__(kThreadsPerBlock) all_gather_pull(AllGatherKernelArgs a) {
  const SyncArgs& s = a.sync;
  const uint32_t epoch = device::epoch_begin(s);
  if (!device::barrier(s, epoch, 0)) return;
  // Invariant: every peer's input holds this call's data.
  const V* src[kMaxWorld];
  V* dst[kMaxWorld];
#pragma unroll
  for (int k = 0; k < kMaxWorld; ++k) {
    const int r = (s.rank + 1 + k) % s.world;  // k == world - 1 is this rank itself
    src[k] = static_cast<const V*>(k == s.world - 1 ? a.in : a.in_peers[r]);
    dst[k] = reinterpret_cast<V*>(static_cast<char*>(a.out) + r * a.bytes);
  }
  const int nsrc = s.world - 1 + (a.copy_own ? 1 : 0);
  device::copy_many<V, 2>(src, dst, nsrc, a.bytes / sizeof(V));
  if (!device::barrier(s, epoch, 1)) return;
  // Invariant: no peer reads this rank's input any more.
  device::epoch_commit(s, epoch);
}

template <typename V>
__global__ void __launch_bounds__(kThreadsPerBlock) all_gather_push(AllGatherKernelArgs a) {
  constexpr int kUnroll = 4;
  const SyncArgs& s = a.sync;
  const uint32_t epoch = device::epoch_begin(s);
  const V* src = static_cast<const V*>(a.in);
  const size_t n = a.bytes / sizeof(V);
  const size_t stride = device::global_threads();
  size_t base = device::global_thread();
  // The input is this rank's own and ready (stream order): load the first batch while the
  // barrier's round trip is in flight.
  V v[kUnroll];
  device::load_batch<V, kUnroll>(src, base, stride, n, v);
  if (!device::barrier(s, epoch, 0)) return;
  // Invariant: every peer's output may be overwritten.
  V* dst[kMaxWorld];
#pragma unroll
  for (int k = 0; k < kMaxWorld; ++k) {
    const int r = (s.rank + 1 + k) % s.world;
    dst[k] = reinterpret_cast<V*>(static_cast<char*>(a.out_peers[r]) + s.rank * a.bytes);
  }
  const int ndst = s.world - 1 + (a.copy_own ? 1 : 0);
  for (; base < n; base += stride * kUnroll) {
    device::store_batch<V, kUnroll>(dst, ndst, base, stride, n, v);
    device::load_batch<V, kUnroll>(src, base + stride * kUnroll, stride, n, v);
  }
  if (!device::barrier(s, epoch, 1)) return;
  // Invariant: every peer's block wrote its slice of this rank's output.
  device::epoch_commit(s, epoch);
}

template <typename V>
void launch(AllGatherKernel kernel, const AllGatherKernelArgs& args, int blocks, cudaStream_t stream) {
  if (kernel == AllGatherKernel::kPull)
    all_gather_pull<V><<<blocks, kThreadsPerBlock, 0, stream>>>(args);
  else
    all_gather_push<V><<<blocks, kThreadsPerBlock, 0, stream>>>(args);
  SYMMEM_LAUNCH_CHECK();
}

}  // namespace

void launch_all_gather(AllGatherKernel kernel, int vector_bytes, const AllGatherKernelArgs& args, int blocks,
                       cudaStream_t stream) {
  switch (vector_bytes) {
    case 16: return launch<uint4>(kernel, args, blocks, stream);
    case 8: return launch<uint2>(kernel, args, blocks, stream);
    case 4: return launch<uint32_t>(kernel, args, blocks, stream);
    case 2: return launch<uint16_t>(kernel, args, blocks, stream);
    case 1: return launch<uint8_t>(kernel, args, blocks, stream);
    default:
      SYMMEM_THROW(ErrorCode::kInternal, "all_gather: no kernel for " + std::to_string(vector_bytes) + "-byte vectors");
  }
}

}  // namespace symmem::detail
