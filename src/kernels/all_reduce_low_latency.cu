// Low-latency all-reduce for small messages, over the line protocol of device/low_latency.cuh
// (data and flag in one 8-byte store, parity halves, clear after read; no barrier round trip):
//
//   one-shot:  every rank sends its whole input to every peer; each rank reduces everything.
//   two-shot:  rank p receives slice p of every input, reduces it, and sends the result to every
//              rank (second half of the receive areas); each rank collects the other slices.
//
// Failure records name phase 0 for the input words and phase 1 for the two-shot's reduced slices.
// No shared early-exit flag (it raced), and every block reaches call_end, which advances the call
// counter.
#include "device/call_counter.cuh"
#include "device/dependent_launch.cuh"
#include "device/low_latency.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"

namespace symmem::detail {
namespace {

using device::collect_words;
using device::load_word;
using device::low_latency_slot;
using device::reduce_word;
using device::store_word;

template <typename T, int kOp>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_low_latency(LowLatencyReduceArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const uint32_t call = device::call_begin(s);
  const size_t bytes = a.count * sizeof(T);
  const size_t words = (bytes + 3) / 4;
  const void* in = a.in;
  auto slot = [&](uint64_t* area, int sender) { return low_latency_slot(area, call, sender, a.lines.slot_words); };
  const uint64_t tag = uint64_t(s.signature) << 32;

  // Send: this rank's words into its slot of every peer's receive area.
  for (size_t w = device::global_thread(); w < words; w += device::global_threads()) {
    const uint64_t line = tag | load_word(in, w, bytes);
    for (int k = 1; k < s.world; ++k) {
      const int peer = (s.rank + k) % s.world;
      device::st_relaxed_sys_u64(slot(a.lines.peers[peer], s.rank) + w, line);
    }
  }

  // Receive every peer's words (clearing their lines) and reduce them in rank order.
  uint64_t* slots = slot(a.lines.peers[s.rank], 0);
  const uint32_t every = (1u << s.world) - 1;
  for (size_t w = device::global_thread(); w < words; w += device::global_threads()) {
    uint32_t word[kMaxWorld];
    if (!collect_words(s, slots, a.lines.slot_words, w, every, load_word(in, w, bytes), 0, word)) break;
    store_word(static_cast<T*>(a.out), w, a.count, reduce_word<T, kOp>(word, s.world));
  }
  // Invariant (on success): every line addressed to this rank in this call was read and cleared.
  device::call_end(s, call);
}

template <typename T, int kOp>
__global__ void __launch_bounds__(kThreadsPerBlock) all_reduce_low_latency_two_shot(LowLatencyReduceArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const uint32_t call = device::call_begin(s);
  const size_t slice = two_shot_slice(a.count, s.world, sizeof(T));  // whole 16-byte vectors
  auto begin = [&](int r) { return min(a.count, size_t(r) * slice); };
  auto elems = [&](int r) { return min(a.count, size_t(r + 1) * slice) - begin(r); };
  auto words_of = [&](int r) { return (elems(r) * sizeof(T) + 3) / 4; };
  const size_t half = a.lines.slot_words / 2;  // results travel in the second half of each slot
  auto slot = [&](uint64_t* area, int sender) { return low_latency_slot(area, call, sender, a.lines.slot_words); };
  const T* in = static_cast<const T*>(a.in);
  T* out = static_cast<T*>(a.out);
  const uint64_t tag = uint64_t(s.signature) << 32;

  // Phase 1: word j of slice p goes to rank p.
  const size_t slice_words = slice * sizeof(T) / 4;
  for (size_t j = device::global_thread(); j < slice_words; j += device::global_threads()) {
    for (int k = 1; k < s.world; ++k) {
      const int p = (s.rank + k) % s.world;
      const size_t bytes = elems(p) * sizeof(T);
      if (j * 4 < bytes)
        device::st_relaxed_sys_u64(slot(a.lines.peers[p], s.rank) + j, tag | load_word(in + begin(p), j, bytes));
    }
  }
  // Phase 2: reduce this rank's slice (rank order, clearing the lines read), keep it, send it to
  // every peer. A thread whose wait failed skips the rest but still reaches call_end.
  bool ok = true;
  const size_t mine = words_of(s.rank);
  uint64_t* slots = slot(a.lines.peers[s.rank], 0);
  const uint32_t every = (1u << s.world) - 1;
  for (size_t j = device::global_thread(); j < mine; j += device::global_threads()) {
    uint32_t word[kMaxWorld];
    const uint32_t own = load_word(in + begin(s.rank), j, elems(s.rank) * sizeof(T));
    if (!collect_words(s, slots, a.lines.slot_words, j, every, own, 0, word)) {
      ok = false;
      break;
    }
    const uint32_t result = reduce_word<T, kOp>(word, s.world);
    store_word(out + begin(s.rank), j, elems(s.rank), result);
    for (int k = 1; k < s.world; ++k) {
      const int p = (s.rank + k) % s.world;
      device::st_relaxed_sys_u64(slot(a.lines.peers[p], s.rank) + half + j, tag | result);
    }
  }
  // Phase 3: every other rank's reduced slice (word j of each that has one), clearing the lines.
  for (size_t j = device::global_thread(); ok && j < slice_words; j += device::global_threads()) {
    uint32_t senders = 0;
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r)
      if (r < s.world && r != s.rank && j < words_of(r)) senders |= 1u << r;
    uint32_t word[kMaxWorld];
    if (!collect_words(s, slots + half, a.lines.slot_words, j, senders, 0, 1, word)) break;
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r)
      if (senders >> r & 1u) store_word(out + begin(r), j, elems(r), word[r]);
  }
  // Invariant (on success): every line addressed to this rank in this call (both halves of each
  // sender's slot) was read and cleared.
  device::call_end(s, call);
}

}  // namespace

void launch_all_reduce_low_latency(DataType type, ReduceOp op, const LowLatencyReduceArgs& args, int blocks,
                                   cudaStream_t stream) {
  dispatch_reduce(type, op, [&](auto t, auto o) {
    launch_kernel(all_reduce_low_latency<decltype(t), decltype(o)::value>, blocks, kThreadsPerBlock, 0, stream, args);
  });
}

void launch_all_reduce_low_latency_two_shot(DataType type, ReduceOp op, const LowLatencyReduceArgs& args, int blocks,
                                            cudaStream_t stream) {
  dispatch_reduce(type, op, [&](auto t, auto o) {
    launch_kernel(all_reduce_low_latency_two_shot<decltype(t), decltype(o)::value>, blocks, kThreadsPerBlock, 0, stream,
                  args);
  });
}

}  // namespace symmem::detail
