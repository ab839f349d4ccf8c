// All-reduce and reduce-scatter kernels on SMs.
//   one-shot: barrier -> every rank reads every input and reduces all elements -> barrier.
//   reduce-scatter pull: the one-shot kernel over this rank's slice of every input.
//   two-shot: barrier -> rank r reduces slice r of every input and writes it to every rank's
//             output (symmetric), or to its gather area, which every rank then reads -> barrier.
//   two-shot push: see all_reduce_two_shot_push below (stores only over NVLink).
//   one-shot push: see reduce_pushed below (stores only, one barrier).
// All read sources in rank order, so every rank's result is bit-identical.
// Every barrier flag carries the call's signature in the same 64-bit store as the epoch, so a
// peer that called something else fails the barrier as a mismatch instead of passing it
// (device/wait.cuh). Kernels on the call counter (reduce_pushed) reach call_end in every block,
// also after a failed barrier, or the counter would stop.
#include "device/call_counter.cuh"
#include "device/dependent_launch.cuh"
#include "device/reduce.cuh"
#include "device/wait.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"

namespace symmem::detail {
namespace {

// What this rank stores into one peer: `count` elements from `from` to `to`.
template <typename T>
struct Chunk {
  const T* from;
  T* to;
  size_t count;
};

// Stores chunk_for(p) into every peer p, next rank first (device::scatter: a few vectors per thread in flight).
template <typename T, bool kVector, typename ChunkFor>
__device__ __forceinline__ void send_to_peers(const SyncArgs& s, ChunkFor chunk_for) {
  const T* src[kMaxWorld];
  T* dst[kMaxWorld];
  size_t n[kMaxWorld];
#pragma unroll
  for (int k = 0; k < kMaxWorld; ++k) {
    const Chunk<T> c = chunk_for((s.rank + 1 + k) % s.world);
    src[k] = c.from;
    dst[k] = c.to;
    n[k] = k < s.world - 1 ? c.count : 0;
  }
  device::scatter<T, kVector>(src, dst, n, s.world - 1);
}

// One-shot all-reduce (peer_stride = 0) and reduce-scatter (peer_stride = count): this rank reads
// `count` elements from rank * peer_stride of every rank's input and reduces them into its output.
template <typename T, int kOp, bool kVector>
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_from_every_rank(ReduceFromEveryRankArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const uint32_t epoch = device::epoch_begin(s);
  if (!device::barrier(s, epoch, 0)) return;
  // Invariant: every rank's input holds this call's data.
  const T* src[kMaxWorld];
  T* dst[kMaxWorld];
#pragma unroll
  for (int r = 0; r < kMaxWorld; ++r) {
    src[r] = static_cast<const T*>(a.in_peers[r < s.world ? r : 0]) + size_t(s.rank) * a.peer_stride;
    dst[r] = static_cast<T*>(a.out);
  }
  device::reduce_range<T, kOp, kVector>(src, s.world, dst, 1, a.count);
  if (!device::barrier(s, epoch, 1)) return;
  // Invariant: no rank reads this rank's input any more.
  device::epoch_commit(s, epoch);
}

template <typename T, int kOp, bool kVector>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_two_shot(AllReduceTwoShotArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const uint32_t epoch = device::epoch_begin(s);
  if (!device::barrier(s, epoch, 0)) return;
  const size_t slice = two_shot_slice(a.count, s.world, sizeof(T));
  const bool push = a.results_to_peers;
  auto slice_begin = [&](int r) { return min(a.count, size_t(r) * slice); };
  auto slice_count = [&](int r) { return min(a.count, size_t(r + 1) * slice) - slice_begin(r); };

  const size_t mine = slice_begin(s.rank);
  const T* src[kMaxWorld];
  T* dst[kMaxWorld];
#pragma unroll
  for (int r = 0; r < kMaxWorld; ++r) {
    src[r] = static_cast<const T*>(a.in_peers[r < s.world ? r : 0]) + mine;
    // Push writes the reduced slice into every rank's output, starting with the next rank.
    const int to = (s.rank + 1 + r) % s.world;
    dst[r] = push ? static_cast<T*>(a.out_peers[to]) + mine : static_cast<T*>(a.gather_peers[s.rank]) + mine;
  }
  device::reduce_range<T, kOp, kVector>(src, s.world, dst, push ? s.world : 1, slice_count(s.rank));
  if (!push) {
    if (!device::barrier(s, epoch, 1)) return;
    // Invariant: every rank's gather area holds its reduced slice; gather them, next rank first.
    constexpr size_t kElems = 16 / sizeof(T);
    for (int k = 0; k < s.world; ++k) {
      const int r = (s.rank + k) % s.world;
      const T* from = static_cast<const T*>(a.gather_peers[r]) + slice_begin(r);
      T* to = static_cast<T*>(a.out) + slice_begin(r);
      const size_t n = slice_count(r);
      size_t done = 0;
      if constexpr (kVector) {
        const size_t nvec = n / kElems;
        for (size_t v = device::global_thread(); v < nvec; v += device::global_threads())
          reinterpret_cast<uint4*>(to)[v] = reinterpret_cast<const uint4*>(from)[v];
        done = nvec * kElems;
      }
      // The rest by the owner of each 16-byte group, the block that reduced it on rank r.
      const size_t groups = (n + kElems - 1) / kElems;
      for (size_t g = device::first_owned_group(done / kElems); g < groups; g += device::global_threads())
        for (size_t i = g * kElems; i < (g + 1) * kElems && i < n; ++i) to[i] = from[i];
    }
  }
  if (!device::barrier(s, epoch, 2)) return;
  // Invariant: every rank's output is complete and no rank reads this rank's buffers any more.
  device::epoch_commit(s, epoch);
}

// Write-only two-shot: every NVLink transfer is a store, every read is local.
//   phase 1: send slice p of this rank's input to rank p's receive area (slot = this rank)
//   barrier: every slice arrived; every rank is inside the call, so outputs may be written
//   phase 2: reduce slice `rank` from the local input and the receive area (rank order), store
//            the result into every rank's output
//   barrier: every output is complete
template <typename T, int kOp, bool kVector>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_two_shot_push(AllReduceTwoShotPushArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const uint32_t epoch = device::epoch_begin(s);
  const size_t slice = two_shot_slice(a.count, s.world, sizeof(T));
  auto slice_begin = [&](int r) { return min(a.count, size_t(r) * slice); };
  auto slice_count = [&](int r) { return min(a.count, size_t(r + 1) * slice) - slice_begin(r); };
  const T* in = static_cast<const T*>(a.in);
  send_to_peers<T, kVector>(s, [&](int p) {
    return Chunk<T>{in + slice_begin(p), static_cast<T*>(a.slot_peers[p]) + size_t(s.rank) * slice, slice_count(p)};
  });
  if (!device::barrier(s, epoch, 0)) return;
  // Invariant: this rank's receive area holds slice `rank` of every peer's input.
  const T* src[kMaxWorld];
  T* dst[kMaxWorld];
#pragma unroll
  for (int r = 0; r < kMaxWorld; ++r) {
    src[r] = r == s.rank ? in + slice_begin(s.rank) : static_cast<const T*>(a.slot_peers[s.rank]) + size_t(r) * slice;
    const int to = (s.rank + 1 + r) % s.world;
    dst[r] = static_cast<T*>(a.out_peers[to]) + slice_begin(s.rank);
  }
  device::reduce_range<T, kOp, kVector>(src, s.world, dst, s.world, slice_count(s.rank));
  if (!device::barrier(s, epoch, 1)) return;
  // Invariant: every rank's output is complete; receive areas may be reused.
  device::epoch_commit(s, epoch);
}

// One-shot push (all-reduce) and push reduce-scatter: one barrier, every NVLink transfer a store.
//   send: chunk p of this rank's input (all of it for all-reduce, slice p for reduce-scatter)
//         into slot `rank` of rank p's receive area, in the half of this call's parity
//   barrier: every chunk of this call arrived
//   reduce: the own chunk and the received ones, in rank order, into the local output
// No closing barrier: a peer's next store into the same half comes a whole call later, after this
// rank entered that call (docs/algorithms.md, "Why one barrier is enough").
template <typename T, int kOp, bool kVector>
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_pushed(ReducePushedArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const uint32_t call = device::call_begin(s);
  const uint32_t epoch = device::epoch_begin(s);
  const size_t half = (call & 1u) * a.receive_half;
  const T* in = static_cast<const T*>(a.in);
  send_to_peers<T, kVector>(s, [&](int p) {
    return Chunk<T>{in + size_t(p) * a.peer_stride,
                    static_cast<T*>(a.receive_peers[p]) + half + size_t(s.rank) * a.receive_slot, a.count};
  });
  if (device::barrier(s, epoch, 0)) {
    // Invariant: slot r of this half holds rank r's chunk of this call, for every peer r.
    const T* src[kMaxWorld];
    T* dst[kMaxWorld];
    const T* received = static_cast<const T*>(a.receive_peers[s.rank]) + half;
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r) {
      src[r] = r == s.rank ? in + size_t(s.rank) * a.peer_stride : received + size_t(r) * a.receive_slot;
      dst[r] = static_cast<T*>(a.out);
    }
    device::reduce_range<T, kOp, kVector>(src, s.world, dst, 1, a.count);
    device::epoch_commit(s, epoch);
  }
  device::call_end(s, call);
}

}  // namespace

// Calls f(kernel<T, op, vector>) for the element type, reduction and vector width of a call.
#define SYMMEM_LAUNCH_REDUCTION(kernel, type, op, vector, args, blocks, stream)        \
  dispatch_reduce(type, op, [&](auto t, auto o) {                                      \
    using T = decltype(t);                                                             \
    constexpr int kOp = decltype(o)::value;                                            \
    if (vector)                                                                        \
      launch_kernel(kernel<T, kOp, true>, blocks, kThreadsPerBlock, 0, stream, args);  \
    else                                                                               \
      launch_kernel(kernel<T, kOp, false>, blocks, kThreadsPerBlock, 0, stream, args); \
  })

void launch_reduce_from_every_rank(DataType type, ReduceOp op, bool vector, const ReduceFromEveryRankArgs& args,
                                   int blocks, cudaStream_t stream) {
  SYMMEM_LAUNCH_REDUCTION(reduce_from_every_rank, type, op, vector, args, blocks, stream);
}

void launch_reduce_pushed(DataType type, ReduceOp op, bool vector, const ReducePushedArgs& args, int blocks,
                          cudaStream_t stream) {
  SYMMEM_LAUNCH_REDUCTION(reduce_pushed, type, op, vector, args, blocks, stream);
}

void launch_all_reduce_two_shot(DataType type, ReduceOp op, bool vector, const AllReduceTwoShotArgs& args, int blocks,
                                cudaStream_t stream) {
  SYMMEM_LAUNCH_REDUCTION(all_reduce_two_shot, type, op, vector, args, blocks, stream);
}

void launch_all_reduce_two_shot_push(DataType type, ReduceOp op, bool vector, const AllReduceTwoShotPushArgs& args,
                                     int blocks, cudaStream_t stream) {
  SYMMEM_LAUNCH_REDUCTION(all_reduce_two_shot_push, type, op, vector, args, blocks, stream);
}

#undef SYMMEM_LAUNCH_REDUCTION

}  // namespace symmem::detail
