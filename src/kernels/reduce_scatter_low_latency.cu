// Low-latency reduce-scatter for small messages, over the line protocol of device/low_latency.cuh
// (data and flag in one 8-byte store, parity halves, clear after read): every rank stores the
// words of slice p of its input into its slot of rank p's receive area, and reduces the slices it
// receives, with its own, in rank order into its output. No barrier round trip and no reset
// between calls. Peers touch neither this rank's input nor its output, so any operands serve
// without staging (slices need not be 4-byte aligned: load_word reads such a slice by bytes).
//
// Failure records name phase 0. Every block reaches call_end, which advances the call counter.
#include "device/call_counter.cuh"
#include "device/dependent_launch.cuh"
#include "device/low_latency.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"

namespace symmem::detail {
namespace {

template <typename T, int kOp>
__global__ void __launch_bounds__(kThreadsPerBlock) reduce_scatter_low_latency(LowLatencyReduceArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const uint32_t call = device::call_begin(s);
  const size_t bytes = a.count * sizeof(T);  // one slice
  const size_t words = (bytes + 3) / 4;
  const T* in = static_cast<const T*>(a.in);
  auto slice = [&](int r) { return in + size_t(r) * a.peer_stride; };
  auto slot = [&](uint64_t* area, int sender) {
    return device::low_latency_slot(area, call, sender, a.lines.slot_words);
  };
  const uint64_t tag = uint64_t(s.signature) << 32;

  // Send: word w of slice p into this rank's slot of rank p's receive area.
  for (size_t w = device::global_thread(); w < words; w += device::global_threads()) {
    for (int k = 1; k < s.world; ++k) {
      const int p = (s.rank + k) % s.world;
      device::st_relaxed_sys_u64(slot(a.lines.peers[p], s.rank) + w, tag | device::load_word(slice(p), w, bytes));
    }
  }

  // Receive this rank's slice from every peer (clearing their lines) and reduce it in rank order.
  uint64_t* slots = slot(a.lines.peers[s.rank], 0);
  const uint32_t every = (1u << s.world) - 1;
  for (size_t w = device::global_thread(); w < words; w += device::global_threads()) {
    uint32_t word[kMaxWorld];
    if (!device::collect_words(s, slots, a.lines.slot_words, w, every, device::load_word(slice(s.rank), w, bytes), 0,
                               word))
      break;
    device::store_word(static_cast<T*>(a.out), w, a.count, device::reduce_word<T, kOp>(word, s.world));
  }
  // Invariant (on success): every line addressed to this rank in this call was read and cleared.
  device::call_end(s, call);
}

}  // namespace

void launch_reduce_scatter_low_latency(DataType type, ReduceOp op, const LowLatencyReduceArgs& args, int blocks,
                                       cudaStream_t stream) {
  dispatch_reduce(type, op, [&](auto t, auto o) {
    using T = decltype(t);
    constexpr int kOp = decltype(o)::value;
    launch_kernel(reduce_scatter_low_latency<T, kOp>, blocks, kThreadsPerBlock, 0, stream, args);
  });
}

}  // namespace symmem::detail
