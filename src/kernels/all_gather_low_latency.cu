// Low-latency all-gather for small messages, over the line protocol of device/low_latency.cuh
// (data and flag in one 8-byte store, parity halves, clear after read): every rank stores the
// words of its input into its slot of every peer's receive area, and writes the words it receives
// into its own output. No barrier round trip and no reset between calls. Peers touch neither this
// rank's input nor its output, so any operands (local or symmetric, any alignment, in place or
// not) serve without staging.
//
// Failure records name phase 0. Every block reaches call_end, which advances the call counter.
#include "device/call_counter.cuh"
#include "device/dependent_launch.cuh"
#include "device/low_latency.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"

namespace symmem::detail {
namespace {

__global__ void __launch_bounds__(kThreadsPerBlock) all_gather_low_latency(LowLatencyGatherArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const uint32_t call = device::call_begin(s);
  const size_t words = (a.bytes + 3) / 4;
  auto slot = [&](uint64_t* area, int sender) {
    return device::low_latency_slot(area, call, sender, a.lines.slot_words);
  };
  auto out_slot = [&](int r) { return static_cast<char*>(a.out) + size_t(r) * a.slot_stride; };
  const uint64_t tag = uint64_t(s.signature) << 32;

  // Send: this rank's words into its slot of every peer's receive area (and its own output slot).
  for (size_t w = device::global_thread(); w < words; w += device::global_threads()) {
    const uint32_t mine = device::load_word(a.in, w, a.bytes);
    for (int k = 1; k < s.world; ++k) {
      const int peer = (s.rank + k) % s.world;
      device::st_relaxed_sys_u64(slot(a.lines.peers[peer], s.rank) + w, tag | mine);
    }
    if (a.copy_own) device::store_word_bytes(out_slot(s.rank), w, a.bytes, mine);
  }

  // Receive every peer's words (clearing their lines) into their output slots.
  uint64_t* slots = slot(a.lines.peers[s.rank], 0);
  const uint32_t every = (1u << s.world) - 1;
  for (size_t w = device::global_thread(); w < words; w += device::global_threads()) {
    uint32_t word[kMaxWorld];
    if (!device::collect_words(s, slots, a.lines.slot_words, w, every, 0, 0, word)) break;
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r)
      if (r < s.world && r != s.rank) device::store_word_bytes(out_slot(r), w, a.bytes, word[r]);
  }
  // Invariant (on success): every line addressed to this rank in this call was read and cleared.
  device::call_end(s, call);
}

}  // namespace

void launch_all_gather_low_latency(const LowLatencyGatherArgs& args, int blocks, cudaStream_t stream) {
  launch_kernel(all_gather_low_latency, blocks, kThreadsPerBlock, 0, stream, args);
}

}  // namespace symmem::detail
