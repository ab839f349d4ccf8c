// Pipelined two-shot all-reduce and reduce-scatter of local operands: no staging copy, a workspace
// of fixed size whatever the message, every NVLink transfer a store.
//
// Rank o owns slice o (the two-shot slice of an all-reduce, rank o's part of a reduce-scatter).
// Each slice is cut into pieces of `piece` elements; block b of every rank handles pieces b,
// b + G, b + 2G, ... (G blocks), one per round t, through slots of two parities (t % 2):
//   send(t):   piece t of slice o of this rank's input -> rank o's send slot (block, this rank),
//              for every peer o
//   reduce(t): piece t of the own slice (own input and the send slots, rank order) -> the own
//              output and, for an all-reduce, every peer's result slot (block, this rank)
//   gather(t): the peers' result slots -> the output (all-reduce only)
// One signal per step says "reduced s - 1, sent s" (its epoch: the block's call epoch + s):
//   send(0); signal 0
//   step s = 0 .. T: wait for every peer's signal s; gather(s - 1); reduce(s); send(s + 1);
//                    signal s + 1 (s < T)
// so that a block meets its peers once per round, with the next round's stores sent before.
// (A variant with four parities that waited for the signal of two steps before, so that the wait
// overlapped a step of work, was the slower in a probe on 2 x H200 (not kept): at the same
// workspace its pieces are half as large. What a step costs beyond its data is the system-scope
// release that publishes its stores, which waits for them to land, so larger pieces are what pays.)
//
// Why two parities suffice, with no credit beyond the signals:
//   send(s + 1) overwrites rank o's send slot of round s - 1: it follows the wait for o's signal
//   s, given after o's reduce(s - 1) read that slot.
//   reduce(s) overwrites rank q's result slot of round s - 2: it follows the wait for q's signal
//   s, given after q's gather(s - 2) read it.
//   The wait's "at most one ahead" holds: a peer's signal s + 1 needs this rank's signal s, and
//   its signal s + 2 this rank's signal s + 1, given only after this wait.
// The block commits the epoch of its last signal: calls after it start above every epoch it used.
//
// The four slot areas, each [block][sender] x piece (so a piece is an area / (G x world)):
//   send parity 0: push_slots. send(0) is the one store before any wait; push_slots is written
//     before a barrier only by two_shot_push and this kernel, and read by its owner before the
//     owner's last signal or barrier of the call, which the writer's kernel waited for.
//   send parity 1: the receive area; result parity 0: staging_out; result parity 1: staging_in.
//     Written only after a wait for every peer's signal of this call: every rank is inside it, so
//     done with the calls before (a one-shot push's reads of its receive area, peers' reads of a
//     staged input). The owner reads the send slots before its last signal, so a peer leaves this
//     call, and may store into the receive area before its next barrier, only after those reads.
//     The result slots are read by gather after the last wait; nothing stores into a rank's
//     staging areas before a barrier of its next call but the rank itself, in stream order.
// In place is safe: piece t of every slice is touched by block b only, which reads all of it in
// send(t) and reduce(t) before gather(t) overwrites it.
#include "device/copy.cuh"
#include "device/dependent_launch.cuh"
#include "device/reduce.cuh"
#include "device/wait.cuh"
#include "kernels/dispatch.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"

namespace symmem::detail {
namespace {

// The signals' flag phase (device_types.hpp signal_slot).
constexpr int kPhase = 0;
// Half the other kernels' blocks: a block keeps pointers to every peer's slots of both parities
// and a reduction's loads of every rank in registers, which at 512 threads (128 registers each)
// spilled about 1.4 KB per thread in the vector kernels (ptxas, nvcc 13.0).
constexpr int kPipelinedThreads = 256;

template <typename T, int kOp, bool kVector>
__global__ void __launch_bounds__(kPipelinedThreads) reduce_pipelined(ReducePipelinedArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const uint32_t epoch = device::epoch_begin(s);
  const int world = s.world;
  const int rank = s.rank;
  // Slice o: input elements [in_begin(o), in_begin(o) + length(o)), output at out_begin(o).
  const size_t slice = a.gather ? two_shot_slice(a.count, world, sizeof(T)) : a.count;
  auto length = [&](int o) {
    return a.gather ? min(a.count, size_t(o + 1) * slice) - min(a.count, size_t(o) * slice) : a.count;
  };
  auto in_begin = [&](int o) { return a.gather ? min(a.count, size_t(o) * slice) : size_t(o) * a.count; };
  auto out_begin = [&](int o) { return a.gather ? min(a.count, size_t(o) * slice) : size_t(0); };
  const size_t piece = a.piece;
  const size_t pieces = (slice + piece - 1) / piece;
  const size_t blocks = gridDim.x;
  const uint32_t rounds = blockIdx.x < pieces ? uint32_t((pieces - 1 - blockIdx.x) / blocks + 1) : 0u;
  if (rounds == 0) return;  // (the same blocks on every rank: nothing to meet)
  auto first = [&](uint32_t t) { return (size_t(t) * blocks + blockIdx.x) * piece; };
  auto part = [&](int o, uint32_t t) { return length(o) > first(t) ? min(piece, length(o) - first(t)) : size_t(0); };
  // This block's slot for `sender` in rank `owner`'s area of round t's parity.
  auto slot = [&](void* const (&areas)[2][kMaxWorld], int owner, uint32_t t, int sender) {
    return static_cast<T*>(areas[t & 1u][owner]) + (size_t(blockIdx.x) * world + sender) * piece;
  };
  auto send_slot = [&](int owner, uint32_t t, int sender) { return slot(a.send_slots, owner, t, sender); };
  auto result_slot = [&](int owner, uint32_t t, int sender) { return slot(a.result_slots, owner, t, sender); };
  const T* in = static_cast<const T*>(a.in);
  T* out = static_cast<T*>(a.out);
  const device::Threads threads = device::block_threads();

  // Round t's piece of every peer, next rank first: from src_of(peer) to dst_of(peer).
  auto scatter_peers = [&](uint32_t t, auto src_of, auto dst_of) {
    const T* src[kMaxWorld];
    T* dst[kMaxWorld];
    size_t n[kMaxWorld];
#pragma unroll
    for (int k = 0; k < kMaxWorld; ++k) {
      const int o = (rank + 1 + k) % world;
      src[k] = src_of(o);
      dst[k] = dst_of(o);
      n[k] = k < world - 1 ? part(o, t) : 0;
    }
    device::scatter<T, kVector>(threads, src, dst, n, world - 1);
  };
  // Send: this rank's input for each peer, into its send slot there.
  auto send = [&](uint32_t t) {
    scatter_peers(t, [&](int o) { return in + in_begin(o) + first(t); }, [&](int o) { return send_slot(o, t, rank); });
  };
  auto reduce = [&](uint32_t t) {
    const T* src[kMaxWorld];
    T* dst[kMaxWorld];
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r) {
      src[r] = r == rank ? in + in_begin(rank) + first(t) : send_slot(rank, t, r < world ? r : 0);
      // dst[0]: the own output; then the result slot of every peer, next rank first.
      const int to = (rank + r) % world;
      dst[r] = r == 0 ? out + out_begin(rank) + first(t) : result_slot(to, t, rank);
    }
    device::reduce_range<T, kOp, kVector>(threads, src, world, dst, a.gather ? world : 1, part(rank, t));
  };
  // Gather: each peer's reduced piece, from its result slot here into the output.
  auto gather = [&](uint32_t t) {
    scatter_peers(t, [&](int o) { return result_slot(rank, t, o); }, [&](int o) { return out + out_begin(o) + first(t); });
  };

  send(0);
  device::signal_peers(s, epoch, kPhase);
  for (uint32_t step = 0; step <= rounds; ++step) {
    if (!device::wait_for_peers(s, epoch + step, kPhase)) return;
    if (step > 0 && a.gather) gather(step - 1);
    if (step == rounds) break;
    reduce(step);
    if (step + 1 < rounds) send(step + 1);
    device::signal_peers(s, epoch + step + 1, kPhase);
  }
  device::epoch_commit(s, epoch + rounds);
}

}  // namespace

void launch_reduce_pipelined(DataType type, ReduceOp op, bool vector, const ReducePipelinedArgs& args, int blocks,
                             cudaStream_t stream) {
  dispatch_reduce(type, op, [&](auto t, auto o) {
    using T = decltype(t);
    constexpr int kOp = decltype(o)::value;
    if (vector)
      launch_kernel(reduce_pipelined<T, kOp, true>, blocks, kPipelinedThreads, 0, stream, args);
    else
      launch_kernel(reduce_pipelined<T, kOp, false>, blocks, kPipelinedThreads, 0, stream, args);
  });
}

}  // namespace symmem::detail
