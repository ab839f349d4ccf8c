// Low-latency all-reduce for small messages: no barrier round trip. Every rank stores each 4-byte
// word of its input, packed with the call's epoch as {epoch << 32 | word} in one 8-byte store,
// into its slot of every peer's receive area; the receiver polls each word until the epoch shows,
// so the flag and the data arrive together. Receive areas alternate by epoch parity: a peer can
// only be one call ahead (it needs this rank's next words to finish its next call), so it never
// overwrites words this rank is still reading, and no area ever needs resetting.
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

__device__ __forceinline__ bool wait_line(const uint64_t* line, uint32_t epoch, const SyncArgs& s,
                                          int peer, uint32_t* word) {
  const uint64_t start = device::global_timer_ns();
  for (uint32_t spins = 1;; ++spins) {
    const uint64_t v = device::ld_relaxed_sys_u64(line);
    if (static_cast<uint32_t>(v >> 32) == epoch) {
      *word = static_cast<uint32_t>(v);
      return true;
    }
    if ((spins & 255u) == 0u) {
      if (device::ld_volatile_u32(&s.status->code) != 0u) return false;
      if (device::global_timer_ns() - start > s.timeout_ns) {
        device::record_timeout(s, peer, 3);
        return false;
      }
    }
  }
}

template <typename T, int kOp>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_low_latency(ReduceKernelArgs a) {
  const SyncArgs& s = a.sync;
  const uint32_t epoch = device::epoch_begin(s);
  const size_t bytes = a.count * sizeof(T);
  const size_t words = (bytes + 3) / 4;
  const size_t parity = epoch & 1u;
  const void* in = a.in_peers[s.rank];
  auto slot = [&](uint64_t* area, int sender) {
    return area + (parity * kMaxWorld + sender) * a.ll_slot_words;
  };

  // Send: this rank's words into its slot of every peer's receive area.
  for (size_t w = device::global_thread(); w < words; w += device::global_threads()) {
    const uint64_t line = (uint64_t(epoch) << 32) | load_word(in, w, bytes);
    for (int k = 1; k < s.world; ++k) {
      const int peer = (s.rank + k) % s.world;
      device::st_relaxed_sys_u64(slot(a.ll_peers[peer], s.rank) + w, line);
    }
  }

  // Receive and reduce the same words (same thread mapping, so the same block's epoch).
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  constexpr int kPerWord = 4 / sizeof(T);
  using A = typename device::Accum<T>::type;
  for (size_t w = device::global_thread(); w < words && !failed; w += device::global_threads()) {
    uint32_t word[kMaxWorld];
    bool ok = true;
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r) {
      if (r >= s.world) break;
      if (r == s.rank) word[r] = load_word(in, w, bytes);
      else ok = ok && wait_line(slot(a.ll_peers[s.rank], r) + w, epoch, s, r, &word[r]);
    }
    if (!ok) {
      failed = 1;
      break;
    }
    T* out = static_cast<T*>(a.out);
#pragma unroll
    for (int e = 0; e < kPerWord; ++e) {
      const size_t i = w * kPerWord + e;
      if (i >= a.count) break;
      A acc = device::to_accum(reinterpret_cast<const T*>(&word[0])[e]);
#pragma unroll
      for (int r = 1; r < kMaxWorld; ++r)
        if (r < s.world) acc = device::combine<kOp>(acc, device::to_accum(reinterpret_cast<const T*>(&word[r])[e]));
      out[i] = device::from_accum<T>(acc);
    }
  }
  __syncthreads();
  if (!failed) device::epoch_commit(s, epoch);
}

}  // namespace

void launch_all_reduce_low_latency(DataType type, ReduceOp op, const ReduceKernelArgs& args,
                                   int blocks, cudaStream_t stream) {
  dispatch_reduce(type, op, [&](auto t, auto o) {
    using T = decltype(t);
    all_reduce_low_latency<T, decltype(o)::value><<<blocks, kThreadsPerBlock, 0, stream>>>(args);
    SYMMEM_LAUNCH_CHECK();
  });
}

}  // namespace symmem::detail
