// SM all-gather kernels: pull (every rank reads its peers' inputs) and push (every rank writes its
// input into its peers' outputs). Each kernel: barrier (inputs ready, outputs free) -> copy ->
// barrier (every peer done with my input, everything addressed to me arrived).
// Ranks visit peers in rotated order (rank + 1, rank + 2, ...) so that at any moment each GPU's
// NVLink egress serves one reader per step and the switch load is even.
// Rank r's slot of an output starts at r * slot_stride (the host keeps slot_stride a multiple of
// the vector width); `bytes` is the data of one slot. The barrier flags carry the call's
// signature in the same 64-bit store as the epoch, so a peer in another call is a mismatch
// error, not a silent pass (device/wait.cuh).
#include "common/check.hpp"
#include "device/copy.cuh"
#include "device/dependent_launch.cuh"
#include "device/wait.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"

namespace symmem::detail {
namespace {

using device::CopyTask;

// Loads in flight per thread in the pull kernel: 16 x 16 B x 512 threads = 128 KiB per block, as
// many as the registers hold (128 per thread). Measured on 2 x H200 at 16 blocks, 512 MiB per
// rank: 8 loads give 218 GB/s, 16 give 305 (before the own-slot warps, see pull_local_warps).
constexpr int kPullUnroll = 16;

// Pull: barrier (inputs ready) -> copy every peer's input into my output (element-major over
// the peers, see copy_tasks); out of place, a.local_warps warps of each block copy my own slot
// while the others read NVLink, so that local loads, which return sooner, do not take NVLink's
// share of the loads in flight -> barrier (every peer done with my input).
template <typename V>
__global__ void __launch_bounds__(kThreadsPerBlock) all_gather_pull(AllGatherArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  __shared__ CopyTask<V> tasks[kMaxWorld];
  const size_t n = a.bytes / sizeof(V);
  auto slot = [&](int r) { return reinterpret_cast<V*>(static_cast<char*>(a.out) + size_t(r) * a.slot_stride); };
  if (threadIdx.x < s.world) {
    const int k = threadIdx.x;  // peers in rotated order, the own slot last
    const int r = (s.rank + 1 + k) % s.world;
    tasks[k] = {static_cast<const V*>(k == s.world - 1 ? a.in : a.in_peers[r]), slot(r), n};
  }
  const uint32_t epoch = device::epoch_begin(s);  // its __syncthreads publishes the tasks
  if (!device::barrier(s, epoch, 0)) return;
  // Invariant: every peer's input holds this call's data.
  const int peers = s.world - 1;
  const int local_threads = a.copy_own ? min(a.local_warps * 32, int(blockDim.x) - 32) : 0;
  if (local_threads == 0) {
    device::copy_tasks<V, kPullUnroll>(tasks, peers + (a.copy_own ? 1 : 0), n, device::global_thread(),
                                       device::global_threads());
  } else if (int(threadIdx.x) < local_threads) {
    device::copy_tasks<V, kPullUnroll>(tasks + peers, 1, n, size_t(blockIdx.x) * local_threads + threadIdx.x,
                                       size_t(gridDim.x) * local_threads);
  } else {
    const int remote_threads = blockDim.x - local_threads;
    device::copy_tasks<V, kPullUnroll>(tasks, peers, n,
                                       size_t(blockIdx.x) * remote_threads + threadIdx.x - local_threads,
                                       size_t(gridDim.x) * remote_threads);
  }
  if (!device::barrier(s, epoch, 1)) return;
  // Invariant: no peer reads this rank's input any more.
  device::epoch_commit(s, epoch);
}

template <typename V>
__global__ void __launch_bounds__(kThreadsPerBlock) all_gather_push(AllGatherArgs a) {
  device::enter_kernel();
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
    dst[k] = reinterpret_cast<V*>(static_cast<char*>(a.out_peers[r]) + size_t(s.rank) * a.slot_stride);
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

// Calls f(V{}) with V the vector type of `vector_bytes`.
template <typename F>
void dispatch_vector(int vector_bytes, F&& f) {
  switch (vector_bytes) {
    case 16: return f(uint4{});
    case 8: return f(uint2{});
    case 4: return f(uint32_t{});
    case 2: return f(uint16_t{});
    case 1: return f(uint8_t{});
    default:
      SYMMEM_THROW(ErrorCode::kInternal, "all_gather: no kernel for " + std::to_string(vector_bytes) + "-byte vectors");
  }
}

}  // namespace

void launch_all_gather_pull(int vector_bytes, const AllGatherArgs& args, int blocks, cudaStream_t stream) {
  dispatch_vector(vector_bytes, [&](auto v) {
    launch_kernel(all_gather_pull<decltype(v)>, blocks, kThreadsPerBlock, 0, stream, args);
  });
}

void launch_all_gather_push(int vector_bytes, const AllGatherArgs& args, int blocks, cudaStream_t stream) {
  dispatch_vector(vector_bytes, [&](auto v) {
    launch_kernel(all_gather_push<decltype(v)>, blocks, kThreadsPerBlock, 0, stream, args);
  });
}

}  // namespace symmem::detail
