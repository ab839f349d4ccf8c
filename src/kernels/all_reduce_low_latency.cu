// Low-latency all-reduce for small messages: no barrier round trip. Every rank stores each 4-byte
// word of its input, packed with the call's signature as {signature << 32 | word} in one 8-byte
// store, into its slot of every peer's receive area; the receiver polls each line until the tag
// shows, so the flag and the data arrive together.
//
//   one-shot:  every rank sends its whole input to every peer; each rank reduces everything.
//   two-shot:  rank p receives slice p of every input, reduces it, and sends the result to every
//              rank (second half of the receive areas); each rank collects the other slices.
//
// Protocol. A receive area is two parity halves of kMaxWorld sender slots of 8-byte lines.
//   - A line is {tag << 32 | data}; tag 0 is an empty line. The heap zeroes the area, so a new
//     area is all empty lines: no reset is ever needed.
//   - The call's parity (the communicator's call counter, device/call_counter.cuh, the same on
//     every rank whatever the grid) picks the half.
//   - A sender stores each line of a call once, tagged with the call's signature (nonzero).
//   - The receiver takes a line whose tag is its own signature and then clears it (stores 0 into
//     its own area): every line stored in a call is consumed and cleared in that call, so no line
//     ever survives its call. A nonzero tag other than its signature means the sender is in a
//     different call: a mismatch, recorded with the sender and its signature (device/wait.cuh).
// Why the clear is safe (it never erases a newer line): a sender stores into the same half again
// only two calls later. To finish the call in between, it needs lines that exist only once this
// rank has sent its words of that call (one-shot: this rank's own lines; two-shot: this rank's
// phase-1 lines, directly, or through the reduced slice of a rank that needed them), and this
// rank sends them only from its next kernel, which starts after this kernel, clears included,
// has finished (stream order). The same chain keeps a sender at most one call ahead, so it never
// overwrites a line this rank has not read yet.
// Why the tag is the signature, and why clearing removes the wrap: the tag used to be the 32-bit
// call number, and a stale line left by an older, larger call could carry the current number
// again after 2^32 calls and be taken as fresh data. With clear-after-read there is no stale line
// to confuse, so the tag only has to tell this call's line from an empty one (0) and from another
// call's (a different signature); consecutive chunks of one call share their signature safely.
// After a failure the area may hold unconsumed lines; the communicator is unusable then anyway.
//
// Failure records name phase 0 for the input words and phase 1 for the two-shot's reduced slices.
// A thread whose wait fails stops; the others see the abort word (which every timeout or mismatch
// sets) within their next 256 spins. No shared early-exit flag (it raced), and every block
// reaches call_end, which advances the call counter.
#include "device/call_counter.cuh"
#include "device/dependent_launch.cuh"
#include "device/reduce.cuh"
#include "device/wait.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"

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
// its slot at slots + r * slot_words, and its line is cleared once taken. Each round loads the
// line of every peer still missing at once, so the waits for different peers overlap. The lines
// stay in registers until every one has come (static indices only: nothing goes to local
// memory). False on timeout, mismatch (`phase` names the wait in the record) or abort.
__device__ __forceinline__ bool collect_words(const SyncArgs& s, uint64_t* slots, size_t slot_words, size_t w,
                                              uint32_t senders, uint32_t own, int phase, uint32_t (&word)[kMaxWorld]) {
  uint32_t missing = senders & ~(1u << s.rank);
  uint64_t line[kMaxWorld] = {};
  const uint64_t start = device::global_timer_ns();
  for (uint32_t spins = 1; missing != 0; ++spins) {
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r)
      if (missing >> r & 1u) line[r] = device::ld_relaxed_sys_u64(slots + r * slot_words + w);
    int foreign = -1;  // a sender whose line carries another call's signature
    uint32_t foreign_tag = 0;
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r) {
      if (!(missing >> r & 1u)) continue;
      const uint32_t tag = static_cast<uint32_t>(line[r] >> 32);
      if (tag == s.signature) {
        missing &= ~(1u << r);
        // Consumed: empty again (after the load in this thread's order, so after the sender's store).
        device::st_relaxed_sys_u64(slots + r * slot_words + w, 0);
      } else if (tag != 0u) {
        foreign = r;
        foreign_tag = tag;
      }
    }
    if (foreign >= 0) {
      device::record_failure(s, kStatusMismatch, foreign, phase, foreign_tag);
      return false;
    }
    if (missing != 0 && (spins & 255u) == 0u && !device::keep_waiting(s, start, __ffs(missing) - 1, phase))
      return false;
  }
#pragma unroll
  for (int r = 0; r < kMaxWorld; ++r) word[r] = r == s.rank ? own : static_cast<uint32_t>(line[r]);
  return true;
}

template <typename T, int kOp>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_low_latency(ReduceKernelArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const uint32_t call = device::call_begin(s);
  const size_t bytes = a.count * sizeof(T);
  const size_t words = (bytes + 3) / 4;
  const size_t parity = call & 1u;
  const void* in = a.in_peers[s.rank];
  auto slot = [&](uint64_t* area, int sender) { return area + (parity * kMaxWorld + sender) * a.ll_slot_words; };
  const uint64_t tag = uint64_t(s.signature) << 32;

  // Send: this rank's words into its slot of every peer's receive area.
  for (size_t w = device::global_thread(); w < words; w += device::global_threads()) {
    const uint64_t line = tag | load_word(in, w, bytes);
    for (int k = 1; k < s.world; ++k) {
      const int peer = (s.rank + k) % s.world;
      device::st_relaxed_sys_u64(slot(a.ll_peers[peer], s.rank) + w, line);
    }
  }

  // Receive every peer's words (clearing their lines) and reduce them in rank order.
  uint64_t* slots = slot(a.ll_peers[s.rank], 0);
  const uint32_t every = (1u << s.world) - 1;
  for (size_t w = device::global_thread(); w < words; w += device::global_threads()) {
    uint32_t word[kMaxWorld];
    if (!collect_words(s, slots, a.ll_slot_words, w, every, load_word(in, w, bytes), 0, word)) break;
    store_word(static_cast<T*>(a.out), w, a.count, reduce_word<T, kOp>(word, s.world));
  }
  // Invariant (on success): every line addressed to this rank in this call was read and cleared.
  device::call_end(s, call);
}

template <typename T, int kOp>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_low_latency_two_shot(ReduceKernelArgs a) {
  device::enter_kernel();
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
  const uint64_t tag = uint64_t(s.signature) << 32;

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
  // Phase 2: reduce this rank's slice (rank order, clearing the lines read), keep it, send it to
  // every peer. A thread whose wait failed skips the rest but still reaches call_end.
  bool ok = true;
  const size_t mine = words_of(s.rank);
  uint64_t* slots = slot(a.ll_peers[s.rank], 0);
  const uint32_t every = (1u << s.world) - 1;
  for (size_t j = device::global_thread(); j < mine; j += device::global_threads()) {
    uint32_t word[kMaxWorld];
    const uint32_t own = load_word(in + begin(s.rank), j, elems(s.rank) * sizeof(T));
    if (!collect_words(s, slots, a.ll_slot_words, j, every, own, 0, word)) {
      ok = false;
      break;
    }
    const uint32_t result = reduce_word<T, kOp>(word, s.world);
    store_word(out + begin(s.rank), j, elems(s.rank), result);
    for (int k = 1; k < s.world; ++k) {
      const int p = (s.rank + k) % s.world;
      device::st_relaxed_sys_u64(slot(a.ll_peers[p], s.rank) + half + j, tag | result);
    }
  }
  // Phase 3: every other rank's reduced slice (word j of each that has one), clearing the lines.
  for (size_t j = device::global_thread(); ok && j < slice_words; j += device::global_threads()) {
    uint32_t senders = 0;
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r)
      if (r < s.world && r != s.rank && j < words_of(r)) senders |= 1u << r;
    uint32_t word[kMaxWorld];
    if (!collect_words(s, slots + half, a.ll_slot_words, j, senders, 0, 1, word)) break;
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r)
      if (senders >> r & 1u) store_word(out + begin(r), j, elems(r), word[r]);
  }
  // Invariant (on success): every line addressed to this rank in this call (both halves of each
  // sender's slot) was read and cleared.
  device::call_end(s, call);
}

}  // namespace

void launch_all_reduce_low_latency(bool two_shot, DataType type, ReduceOp op, const ReduceKernelArgs& args, int blocks,
                                   cudaStream_t stream) {
  dispatch_reduce(type, op, [&](auto t, auto o) {
    using T = decltype(t);
    constexpr int kOp = decltype(o)::value;
    if (two_shot)
      launch_kernel(all_reduce_low_latency_two_shot<T, kOp>, blocks, kThreadsPerBlock, 0, stream, args);
    else
      launch_kernel(all_reduce_low_latency<T, kOp>, blocks, kThreadsPerBlock, 0, stream, args);
  });
}

}  // namespace symmem::detail
