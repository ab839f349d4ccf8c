// The kernels of the uniform all-to-all (kernels/all_to_all_args.hpp): all_to_all_push and
// all_to_all_pull (every slice by SM push / pull between two barriers) and all_to_all_low_latency
// (by lines). The variable forms have their own (kernels/all_to_all_variable.cu).
//
// SM path. Pieces are cut into units of at most kUnitBytes; blocks take units in turn, in an
// order that starts with the next rank (rank + 1, + 2, ...) so that at any moment the ranks
// address different peers. Each thread keeps kUnroll vectors in flight per unit. Push stores
// into the peers' outputs and reads only this rank's input; pull loads from the peers' inputs and
// writes only this rank's output. The barrier at the end (phase 1) means, once the whole kernel
// has finished on a rank, that every block of every peer has finished: its stores arrived (push)
// or its loads of this rank's input are done (pull), whatever block moved which unit. The uniform
// form also passes a barrier before the copies (phase 0): the peers' buffers are free and their
// inputs ready.
//
// Low-latency path. Each rank stores its bytes for peer q as words {signature, word} into its slot
// of q's low-latency area (device/low_latency.cuh), at least one word per pair even when it sends
// nothing: every counted call must receive from every peer. Each rank collects its peers' words
// and writes them into its own output; no barrier, no staging, no alignment needed. In place too:
// a thread sends word w of every slice before it writes word w of any slice it receives, and the
// slices of input and output share one stride, so no byte is overwritten before it was sent.
//
// Failure records: barriers name phases 0 and 1, the low-latency waits phase 0.
#include "common/check.hpp"
#include "device/call_counter.cuh"
#include "device/copy.cuh"
#include "device/dependent_launch.cuh"
#include "device/low_latency.cuh"
#include "device/wait.cuh"
#include "kernels/all_to_all_args.hpp"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"

namespace symmem::detail {
namespace {

constexpr int kUnroll = 8;
// One unit: what a block moves with kUnroll vectors per thread (64 KiB with 16-byte vectors).
template <typename V>
constexpr uint64_t unit_vectors() {
  return uint64_t(kUnroll) * kThreadsPerBlock;
}

// Which SM path a kernel runs (a template argument: the plan names the kernel).
enum class Way { kPull, kPush, kLines };

// Piece i of this rank's SM path, in rotated order (the next rank's first).
template <Way W>
__device__ AllToAllPiece piece_at(const AllToAllMoveArgs& a, int i) {
  const int world = a.sync.world, me = a.sync.rank;
  const int peer = (me + 1 + i) % world;
  return W == Way::kPush ? AllToAllPiece{peer, uint32_t(peer), peer * a.in_stride, me * a.out_stride, a.pair_bytes}
                         : AllToAllPiece{peer, uint32_t(me), me * a.in_stride, peer * a.out_stride, a.pair_bytes};
}

template <typename V, Way W>
__device__ void move_by_sm(const AllToAllMoveArgs& a, int n) {
  constexpr bool push = W == Way::kPush;
  // Each piece's first unit, in the rotated order: units [first[i], first[i + 1]) belong to piece i.
  __shared__ uint32_t first[kMaxWorld + 1];
  __shared__ AllToAllPiece pieces[kMaxWorld];
  constexpr uint64_t kUnit = unit_vectors<V>();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    pieces[i] = piece_at<W>(a, i);
    first[i + 1] = static_cast<uint32_t>((pieces[i].bytes / sizeof(V) + kUnit - 1) / kUnit);
  }
  if (threadIdx.x == 0) first[0] = 0;
  __syncthreads();
  // Inclusive scan of first[1 .. n] by warp 0 (n <= kMaxWorld <= 32: one turn).
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, i = lane + 1;
    uint32_t x = i <= n ? first[i] : 0;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const uint32_t y = __shfl_up_sync(0xFFFFFFFFu, x, d);
      if (lane >= d) x += y;
    }
    if (i <= n) first[i] = x;
  }
  __syncthreads();
  const uint32_t units = first[n];
  for (uint32_t u = blockIdx.x; u < units; u += gridDim.x) {
    int lo = 0, hi = n - 1;  // the piece whose units hold u: first[lo] <= u < first[lo + 1]
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (first[mid] <= u)
        lo = mid;
      else
        hi = mid - 1;
    }
    const AllToAllPiece& p = pieces[lo];
    const char* src_base = static_cast<const char*>(push || p.peer == a.sync.rank ? a.in : a.in_peers[p.peer]);
    char* dst_base = static_cast<char*>(push && p.peer != a.sync.rank ? a.out_peers[p.peer] : a.out);
    const V* src = reinterpret_cast<const V*>(src_base + p.src_byte);
    V* dst = reinterpret_cast<V*>(dst_base + p.dst_byte);
    const uint64_t vectors = p.bytes / sizeof(V);
    const uint64_t begin = uint64_t(u - first[lo]) * kUnit;
    device::block_copy<V, kUnroll>(src, dst, begin, begin + kUnit < vectors ? begin + kUnit : vectors);
  }
}

// One pair's bytes as low-latency words: the source (this rank's input) and where they land.
struct Stream {
  const char* src;
  char* dst;
  uint64_t bytes;
};
__device__ Stream send_stream(const AllToAllMoveArgs& a, int q) {
  return {static_cast<const char*>(a.in) + q * a.in_stride, nullptr, a.pair_bytes};
}
__device__ Stream receive_stream(const AllToAllMoveArgs& a, int r) {
  return {nullptr, static_cast<char*>(a.out) + r * a.out_stride, a.pair_bytes};
}
__device__ uint64_t words_of(uint64_t bytes) { return bytes == 0 ? 1 : (bytes + 3) / 4; }  // never none

__device__ void move_by_lines(const AllToAllMoveArgs& a) {
  const SyncArgs& s = a.sync;
  const uint32_t call = device::call_begin(s);
  const int world = s.world, me = s.rank;
  const uint64_t tag = uint64_t(s.signature) << 32;
  // Send to every peer; copy this rank's own bytes locally.
  for (int k = 1; k <= world; ++k) {
    const int q = (me + k) % world;
    const Stream out = send_stream(a, q);
    if (q == me) {
      const Stream own = receive_stream(a, me);
      for (uint64_t w = device::global_thread(); w < (out.bytes + 3) / 4; w += device::global_threads())
        device::store_word_bytes(own.dst, w, out.bytes, device::load_word(out.src, w, out.bytes));
      continue;
    }
    uint64_t* slot = device::low_latency_slot(a.lines.peers[q], call, me, a.lines.slot_words);
    for (uint64_t w = device::global_thread(); w < words_of(out.bytes); w += device::global_threads()) {
      const uint32_t word = w * 4 < out.bytes ? device::load_word(out.src, w, out.bytes) : 0;
      device::st_relaxed_sys_u64(slot + w, tag | word);
    }
  }
  // Receive: word w of every sender that has one, all awaited at once.
  Stream from[kMaxWorld];
  uint64_t longest = 0;
#pragma unroll
  for (int r = 0; r < kMaxWorld; ++r) {
    if (r >= world) break;
    from[r] = receive_stream(a, r);
    if (r != me) longest = max(longest, words_of(from[r].bytes));
  }
  uint64_t* slots = device::low_latency_slot(a.lines.peers[me], call, 0, a.lines.slot_words);
  for (uint64_t w = device::global_thread(); w < longest; w += device::global_threads()) {
    uint32_t senders = 0;
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r)
      if (r < world && r != me && w < words_of(from[r].bytes)) senders |= 1u << r;
    uint32_t word[kMaxWorld];
    if (!device::collect_words(s, slots, a.lines.slot_words, w, senders, 0, 0, word)) break;
#pragma unroll
    for (int r = 0; r < kMaxWorld; ++r)
      if ((senders >> r & 1u) && w * 4 < from[r].bytes)
        device::store_word_bytes(from[r].dst, w, from[r].bytes, word[r]);
  }
  // Invariant (on success): every line addressed to this rank in this call was read and cleared.
  device::call_end(s, call);
}

template <typename V, Way W>
__global__ void __launch_bounds__(kThreadsPerBlock) all_to_all_move(AllToAllMoveArgs a) {
  device::enter_kernel();
  if constexpr (W == Way::kLines) {
    move_by_lines(a);
  } else {
    const SyncArgs& s = a.sync;
    const uint32_t epoch = device::epoch_begin(s);
    if (!device::barrier(s, epoch, 0)) return;
    // Invariant: every peer's input holds this call's rows and its output may be overwritten.
    move_by_sm<V, W>(a, s.world);
    if (!device::barrier(s, epoch, 1)) return;
    // Invariant: every block of every peer finished its stores into (push) or loads from (pull)
    // this rank's buffers, for the blocks of this index; the kernel's end, for all of them.
    device::epoch_commit(s, epoch);
  }
}

template <Way W>
void launch_moving(int vector_bytes, const AllToAllMoveArgs& args, int blocks, cudaStream_t stream) {
  switch (vector_bytes) {
    case 16: return launch_kernel(all_to_all_move<uint4, W>, blocks, kThreadsPerBlock, 0, stream, args);
    case 8: return launch_kernel(all_to_all_move<uint2, W>, blocks, kThreadsPerBlock, 0, stream, args);
    case 4: return launch_kernel(all_to_all_move<uint32_t, W>, blocks, kThreadsPerBlock, 0, stream, args);
    case 2: return launch_kernel(all_to_all_move<uint16_t, W>, blocks, kThreadsPerBlock, 0, stream, args);
    case 1: return launch_kernel(all_to_all_move<uint8_t, W>, blocks, kThreadsPerBlock, 0, stream, args);
    default:
      SYMMEM_THROW(ErrorCode::kInternal, "all_to_all: no kernel for " + std::to_string(vector_bytes) + "-byte vectors");
  }
}

}  // namespace

void launch_all_to_all_pull(int vector_bytes, const AllToAllMoveArgs& args, int blocks, cudaStream_t stream) {
  launch_moving<Way::kPull>(vector_bytes, args, blocks, stream);
}

void launch_all_to_all_push(int vector_bytes, const AllToAllMoveArgs& args, int blocks, cudaStream_t stream) {
  launch_moving<Way::kPush>(vector_bytes, args, blocks, stream);
}

void launch_all_to_all_low_latency(const AllToAllMoveArgs& args, int blocks, cudaStream_t stream) {
  launch_kernel(all_to_all_move<uint32_t, Way::kLines>, blocks, kThreadsPerBlock, 0, stream, args);
}

}  // namespace symmem::detail
