// Low-latency all-reduce for small messages: no barrier round trip. Every rank stores each 4-byte
// word of its input, packed with the call's number as {call << 32 | word} in one 8-byte store,
// into its slot of every peer's receive area; the receiver polls each word until the number shows,
// so the flag and the data arrive together. Receive areas alternate by call parity: a peer can
// only be one call ahead (it needs this rank's next words to finish its next call), so it never
// overwrites words this rank is still reading, and no area ever needs resetting.
//
// The call number is the communicator's call counter (device/call_counter.cuh), which tells a
// fresh line from a stale one whatever the grid.
//
//   one-shot:  every rank sends its whole input to every peer; each rank reduces everything.
//   two-shot:  rank p receives slice p of every input, reduces it, and sends the result to every
//              rank (second half of the receive areas); each rank collects the other slices.
#include "device/call_counter.cuh"
#include "device/reduce.cuh"
#include "device/wait.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernel_args.hpp"

namespace symmem::detail {
namespace {

// Word w of a buffer of `bytes` bytes, zero-padded past the end (the pointer is 4-byte aligned).
__device__ __forceinline__ uint32_t load_word(const void* p, size_t w, size_t bytes) {
  if ((w + 1) * 4 <= bytes) return static_cast<const uint32_t*>(p)[w];
  uint32_t word = 0;
  const uint8_t* b = static_cast<const uint8_t*>(p);
  for (size_t i = w * 4; i < bytes; ++i) word |= uint32_t(b[i]) << (8 * (i - w * 4));
  return word;
}

template <typename T, int kOp>
__device__ __forceinline__ uint32_t reduce_word(const uint32_t (&word)[kMaxWorld], int world) {
  constexpr int kPerWord = 4 / sizeof(T);
  using A = typename device::Accum<T>::type;
  uint32_t result = 0;
#pragma unroll
  for (int e = 0; e < kPerWord; ++e) {
    A acc = device::to_accum(reinterpret_cast<const T*>(&word[0])[e]);
#pragma unroll
    for (int r = 1; r < kMaxWorld; ++r)
      if (r < world) acc = device::combine<kOp>(acc, device::to_accum(reinterpret_cast<const T*>(&word[r])[e]));
    reinterpret_cast<T*>(&result)[e] = device::from_accum<T>(acc);
  }
  return result;
}

// Stores the elements of `word` (word index w of a range of `count` elements) that exist.
template <typename T>
__device__ __forceinline__ void store_word(T* out, size_t w, size_t count, uint32_t word) {
  constexpr int kPerWord = 4 / sizeof(T);
#pragma unroll
  for (int e = 0; e < kPerWord; ++e)
    if (w * kPerWord + e < count) out[w * kPerWord + e] = reinterpret_cast<const T*>(&word)[e];
}

// Word w of the ranks in `senders` (a bit per rank): this rank's is `own`; sender r's comes from
// its slot at slots + r * slot_words. Each round loads the line of every peer still missing at
// once, so the waits for different peers overlap. False on timeout or an earlier failure.
__device__ __forceinline__ bool collect_words(const SyncArgs& s, const uint64_t* slots, size_t slot_words, size_t w,
                                              uint32_t call, uint32_t senders, uint32_t own,
                                              uint32_t (&word)[kMaxWorld]) {
  if (senders >> s.rank & 1u) word[s.rank] = own;
  uint32_t missing = senders & ~(1u << s.rank);
  const uint64_t start = device::global_timer_ns();
  for (uint32_t spins = 1; missing != 0; ++spins) {
    uint64_t line[kMaxWorld];
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r)
      if (missing >> r & 1u) line[r] = device::ld_relaxed_sys_u64(slots + r * slot_words + w);
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r) {
      if ((missing >> r & 1u) && static_cast<uint32_t>(line[r] >> 32) == call) {
        word[r] = static_cast<uint32_t>(line[r]);
        missing &= ~(1u << r);
      }
    }
    if (missing != 0 && (spins & 255u) == 0u) {
      if (device::ld_volatile_u32(&s.status->code) != 0u) return false;
      if (device::global_timer_ns() - start > s.timeout_ns) {
        device::record_timeout(s, __ffs(missing) - 1, 3);
        return false;
      }
    }
  }
  return true;
}

template <typename T, int kOp>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_low_latency(ReduceKernelArgs a) {
  const SyncArgs& s = a.sync;
  const uint32_t call = device::call_begin(s);
  const size_t bytes = a.count * sizeof(T);
  const size_t words = (bytes + 3) / 4;
  const size_t parity = call & 1u;
  const void* in = a.in_peers[s.rank];
  auto slot = [&](uint64_t* area, int sender) { return area + (parity * kMaxWorld + sender) * a.ll_slot_words; };

  // Send: this rank's words into its slot of every peer's receive area.
  for (size_t w = device::global_thread(); w < words; w += device::global_threads()) {
    const uint64_t line = (uint64_t(call) << 32) | load_word(in, w, bytes);
    for (int k = 1; k < s.world; ++k) {
      const int peer = (s.rank + k) % s.world;
      device::st_relaxed_sys_u64(slot(a.ll_peers[peer], s.rank) + w, line);
    }
  }

  // Receive every peer's words and reduce them in rank order.
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  const uint64_t* slots = slot(a.ll_peers[s.rank], 0);
  const uint32_t every = (1u << s.world) - 1;
  for (size_t w = device::global_thread(); w < words && !failed; w += device::global_threads()) {
    uint32_t word[kMaxWorld];
    if (!collect_words(s, slots, a.ll_slot_words, w, call, every, load_word(in, w, bytes), word)) {
      failed = 1;
      break;
    }
    store_word(static_cast<T*>(a.out), w, a.count, reduce_word<T, kOp>(word, s.world));
  }
  device::call_end(s, call);
}

template <typename T, int kOp>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_low_latency_two_shot(ReduceKernelArgs a) {
  const SyncArgs& s = a.sync;
  const uint32_t call = device::call_begin(s);
  const size_t parity = call & 1u;
  const size_t slice = two_shot_slice(a.count, s.world, sizeof(T));  // whole 16-byte vectors
  auto begin = [&](int r) { return min(a.count, size_t(r) * slice); };
  auto elems = [&](int r) { return min(a.count, size_t(r + 1) * slice) - begin(r); };
  auto words_of = [&](int r) { return (elems(r) * sizeof(T) + 3) / 4; };
  const size_t half = a.ll_slot_words / 2;  // results travel in the second half of each slot
  auto slot = [&](uint64_t* area, int sender) { return area + (parity * kMaxWorld + sender) * a.ll_slot_words; };
  const T* in = static_cast<const T*>(a.in_peers[s.rank]);
  T* out = static_cast<T*>(a.out);
  const uint64_t tag = uint64_t(call) << 32;

  // Phase 1: word j of slice p goes to rank p.
  const size_t slice_words = slice * sizeof(T) / 4;
  for (size_t j = device::global_thread(); j < slice_words; j += device::global_threads()) {
    for (int k = 1; k < s.world; ++k) {
      const int p = (s.rank + k) % s.world;
      const size_t bytes = elems(p) * sizeof(T);
      if (j * 4 < bytes)
        device::st_relaxed_sys_u64(slot(a.ll_peers[p], s.rank) + j, tag | load_word(in + begin(p), j, bytes));
    }
  }
  // Phase 2: reduce this rank's slice (rank order), keep it, send it to every peer.
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  const size_t mine = words_of(s.rank);
  const uint64_t* slots = slot(a.ll_peers[s.rank], 0);
  const uint32_t every = (1u << s.world) - 1;
  for (size_t j = device::global_thread(); j < mine && !failed; j += device::global_threads()) {
    uint32_t word[kMaxWorld];
    const uint32_t own = load_word(in + begin(s.rank), j, elems(s.rank) * sizeof(T));
    if (!collect_words(s, slots, a.ll_slot_words, j, call, every, own, word)) {
      failed = 1;
      break;
    }
    const uint32_t result = reduce_word<T, kOp>(word, s.world);
    store_word(out + begin(s.rank), j, elems(s.rank), result);
    for (int k = 1; k < s.world; ++k) {
      const int p = (s.rank + k) % s.world;
      device::st_relaxed_sys_u64(slot(a.ll_peers[p], s.rank) + half + j, tag | result);
    }
  }
  // Phase 3: every other rank's reduced slice (word j of each that has one).
  for (size_t j = device::global_thread(); j < slice_words && !failed; j += device::global_threads()) {
    uint32_t senders = 0;
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r)
      if (r < s.world && r != s.rank && j < words_of(r)) senders |= 1u << r;
    uint32_t word[kMaxWorld];
    if (!collect_words(s, slots + half, a.ll_slot_words, j, call, senders, 0, word)) {
      failed = 1;
      break;
    }
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r)
      if (senders >> r & 1u) store_word(out + begin(r), j, elems(r), word[r]);
  }
  device::call_end(s, call);
}

}  // namespace

void launch_all_reduce_low_latency(bool two_shot, DataType type, ReduceOp op, const ReduceKernelArgs& args, int blocks,
                                   cudaStream_t stream) {
  dispatch_reduce(type, op, [&](auto t, auto o) {
    using T = decltype(t);
    constexpr int kOp = decltype(o)::value;
    if (two_shot)
      all_reduce_low_latency_two_shot<T, kOp><<<blocks, kThreadsPerBlock, 0, stream>>>(args);
    else
      all_reduce_low_latency<T, kOp><<<blocks, kThreadsPerBlock, 0, stream>>>(args);
    SYMMEM_LAUNCH_CHECK();
  });
}

}  // namespace symmem::detail
