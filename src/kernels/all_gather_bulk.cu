// Push all-gather with Hopper bulk copies: one thread per block streams chunks of this rank's
// input into shared memory (cp.async.bulk, tracked by an mbarrier per stage) and writes each chunk
// to every peer's output with bulk stores. The TMA engine issues large NVLink writes, so a few
// SMs carry what per-thread 16-byte stores need many for.
//   barrier -> pipelined chunks (load stage i while stages i-1.. are being stored) -> wait for all
//   stores -> proxy fence -> barrier.
// Needs 16-byte aligned pointers, and a byte count and slot stride (rank r's slot starts at
// r * slot_stride) that are multiples of 16 (the planner checks). The barrier flags carry the
// call's signature with the epoch in one 64-bit store (device/wait.cuh): a peer in another call
// fails the barrier as a mismatch.
#include "common/check.hpp"
#include "device/dependent_launch.cuh"
#include "device/ptx.cuh"
#include "device/wait.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"

namespace symmem::detail {
namespace {

constexpr int kBulkThreads = 32;
constexpr uint32_t kChunkBytes = 32 << 10;
constexpr int kStages = 4;
constexpr size_t kSharedBytes = size_t(kStages) * kChunkBytes + kStages * sizeof(uint64_t);

__global__ void __launch_bounds__(kBulkThreads) all_gather_push_bulk(AllGatherArgs a) {
  device::enter_kernel();
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + size_t(kStages) * kChunkBytes);
  const SyncArgs& s = a.sync;
  const uint32_t epoch = device::epoch_begin(s);
  const char* src = static_cast<const char*>(a.in);
  const size_t chunks = (a.bytes + kChunkBytes - 1) / kChunkBytes;
  // Chunk j of this block is global chunk blockIdx.x + j * gridDim.x.
  auto chunk_bytes = [&](size_t c) {
    return static_cast<uint32_t>(min(size_t(kChunkBytes), a.bytes - c * kChunkBytes));
  };
  auto load = [&](uint32_t j) {
    const size_t c = blockIdx.x + size_t(j) * gridDim.x;
    const int stage = j % kStages;
    device::mbarrier_arrive_expect_tx(&bars[stage], chunk_bytes(c));
    device::bulk_load_shared(smem + size_t(stage) * kChunkBytes, src + c * kChunkBytes, chunk_bytes(c), &bars[stage]);
  };
  const uint32_t mine = blockIdx.x < chunks ? static_cast<uint32_t>((chunks - 1 - blockIdx.x) / gridDim.x + 1) : 0;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) device::mbarrier_init(&bars[i], 1);
    device::fence_mbarrier_init();
    // The input is this rank's own and ready: fill the stages while the barrier is in flight.
    for (uint32_t j = 0; j < mine && j < kStages; ++j) load(j);
  }
  if (!device::barrier(s, epoch, 0)) {
    if (threadIdx.x == 0)  // leave no bulk load writing into shared memory of an exited block
      for (uint32_t j = 0; j < mine && j < kStages; ++j)
        while (!device::mbarrier_try_wait_parity(&bars[j], 0)) {
        }
    return;
  }
  // Invariant: every peer's output may be overwritten.
  if (threadIdx.x == 0) {
    char* dst[kMaxWorld];
    const int ndst = s.world - 1 + (a.copy_own ? 1 : 0);
    for (int k = 0; k < kMaxWorld; ++k) {
      const int r = (s.rank + 1 + k) % s.world;
      dst[k] = static_cast<char*>(a.out_peers[r]) + size_t(s.rank) * a.slot_stride;
    }
    for (uint32_t j = 0; j < mine; ++j) {
      const int stage = j % kStages;
      if (j >= kStages) {
        // The stage's previous chunk must be read out by its stores before it is refilled.
        device::bulk_wait_group_read<kStages - 1>();
        load(j);
      }
      // A local load always completes; this wait needs no deadline.
      while (!device::mbarrier_try_wait_parity(&bars[stage], (j / kStages) & 1u)) {
      }
      const size_t c = blockIdx.x + size_t(j) * gridDim.x;
      for (int k = 0; k < ndst; ++k)
        device::bulk_store_global(dst[k] + c * kChunkBytes, smem + size_t(stage) * kChunkBytes, chunk_bytes(c));
      device::bulk_commit_group();
    }
    device::bulk_wait_all();
    device::fence_proxy_async_global();
  }
  if (!device::barrier(s, epoch, 1)) return;
  // Invariant: every peer's block wrote its chunks of this rank's output.
  device::epoch_commit(s, epoch);
}

}  // namespace

void launch_all_gather_push_bulk(const AllGatherArgs& args, int blocks, cudaStream_t stream) {
  static DynamicSharedLimit limit;
  limit.raise(all_gather_push_bulk, kSharedBytes);
  launch_kernel(all_gather_push_bulk, blocks, kBulkThreads, kSharedBytes, stream, args);
}

}  // namespace symmem::detail
