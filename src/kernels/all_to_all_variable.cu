// The kernel of the variable forms (all_to_all_v, all_to_all_vdev, all_to_all_vdev_2d;
// kernels/all_to_all_args.hpp): the split exchange and the data movement in one launch, push or
// pull, of the plan's blocks.
//
//   start     every block: the call number and this rank's own header words (its splits,
//             capacities, declared splits) at once, into shared memory
//   send      block 0: this rank's header as low-latency lines into every peer's slot; every
//             block: the rows of this rank's pairs that go by lines, behind the header in the
//             receiver's slot (pair_by_lines, judged from this rank's splits alone)
//   exchange  every block: every peer's header into shared memory (read, not cleared), then
//             arrives on the call counter; then the quantities of plan/all_to_all_layout.hpp:
//             the verdict, which pairs came by lines, where this rank's pieces lie (one warp
//             with serial sums for the 1-D forms, whose world x world matrix is small; parallel
//             sums for the 2-D form)
//   move      the lines into the output; this block's span of the SM pieces (the balanced cut,
//             plan/all_to_all_cut.hpp); the barrier (phase 1) when rows crossed between ranks by SM
//   finish    the last block to have read the headers clears them and advances the call counter
//
// One crossing for a call whose pairs all go by lines (header and rows travel together), two (the
// header, then the barrier) otherwise. Every block derives the same layout from the same matrix,
// and every rank the same verdict and the same choice per pair: a call that does not fit moves no
// row on any rank (lines that came are taken and dropped), and block 0 records kStatusCapacity
// (plan/capacity_failure.hpp). The header of a rank exists only once its stream reached the call:
// a sender pushes into a receiver, or a receiver pulls from a sender, only after reading that
// rank's header, so no rank writes memory a peer still reads, without an entry barrier. A fence
// (fence.acq_rel.sys) before storing the header (pull: the peers read this rank's input), in each
// thread that stores it, and acquire loads of the header (device/low_latency.cuh's read_line) turn
// the header into a release/acquire pair for the data around it; __syncthreads carries the acquire
// to the block's other threads, as after a barrier. The end barrier of block b proves
// only that block b of every peer finished; the kernel's end proves every block did, which is what
// the next call needs.
//
// Failure records: the waits for headers and lines name phase 0, the end barrier phase 1.
#include "common/check.hpp"
#include "device/copy.cuh"
#include "device/dependent_launch.cuh"
#include "device/low_latency.cuh"
#include "device/wait.cuh"
#include "kernels/all_to_all_args.hpp"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"
#include "plan/all_to_all_cut.hpp"
#include "plan/capacity_failure.hpp"

namespace symmem::detail {
namespace {

constexpr int kUnroll = 8;
constexpr int kWarps = kThreadsPerBlock / 32;
static_assert(kWarps >= 2 * kMaxWorld, "the exchange gives each sender a warp and each receiver another");
static_assert(kMaxWorld <= 32, "the 1-D forms lay out their world pieces in warp 0 alone");
constexpr unsigned kFullWarp = 0xFFFFFFFFu;

// Which SM path a kernel runs (a template argument: the plan names the kernel).
enum class Way { kPull, kPush };

// What a block derives about every rank, in shared memory.
struct Ranks {
  uint32_t input_rows[kMaxWorld];            // header words: rows rank s's input holds
  uint32_t output_rows[kMaxWorld];           //   rows rank q's output holds
  uint32_t declared[kMaxWorld * kMaxWorld];  // all_to_all_v: [q * world + s], rows q expects from s
  uint64_t sent[kMaxWorld];                  // rows sender s sends (its valid splits)
  uint64_t to_self[kMaxWorld];               // of them, to itself
  uint64_t needed[kMaxWorld];                // output rows receiver q needs (padding included)
  int32_t invalid_at[kMaxWorld];             // sender s's first invalid split, or -1
  EncodedFault fault;                        // the first fault in layout_fault's order, as recorded
  uint32_t lines_from;                       // bit s: sender s's rows for this rank came as lines
  uint64_t line_dst[kMaxWorld];              // their first output byte
  uint64_t line_bytes[kMaxWorld];            // and their bytes
  int go;                                    // the call fits (the verdict, alike everywhere)
  int sm_between_ranks;                      // rows cross between ranks by SM: the end barrier
};

// The per-destination arrays (world x experts entries each), in dynamic shared memory.
struct Columns {
  uint64_t* prefix;   // [i], i <= n: SM vectors before this rank's rotated piece i; [n] their total
  uint64_t* start;    // [j]: first output row of destination j's expert (expert_start)
  uint32_t* matrix;   // [s * n + j]: the split words every rank sent
  uint32_t* src_row;  // [i]: first input row of rotated piece i (fits 32 bits when the call fits)
  uint32_t* dst_row;  // [i]: its first output row
};

constexpr size_t kMostSharedBytes = all_to_all_variable_shared_bytes(kMaxWorld, kMaxAllToAllSplits);

__device__ Columns columns_in(uint8_t* shared, int world, int n) {
  Columns c;
  c.prefix = reinterpret_cast<uint64_t*>(shared);
  c.start = c.prefix + (n + 1);
  c.matrix = reinterpret_cast<uint32_t*>(c.start + n);
  c.src_row = c.matrix + size_t(world) * n;
  c.dst_row = c.src_row + n;
  return c;
}

__device__ __forceinline__ uint64_t warp_inclusive_sum(uint64_t x) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const uint64_t y = __shfl_up_sync(kFullWarp, x, d);
    if (lane >= d) x += y;
  }
  return x;
}

// The rank of turn i (0 .. world - 1) after `me`: me + 1, me + 2, ..., `me` itself last. Every loop
// over the ranks and every piece order follows it, so that at any moment the ranks address
// different peers.
__device__ __forceinline__ int rank_in_turn(int me, int world, int i) {
  const int q = me + 1 + i;
  return q < world ? q : q - world;
}
// Its inverse: the turn of rank q.
__device__ __forceinline__ int turn_of_rank(int me, int world, int q) { return q > me ? q - me - 1 : q + world - me - 1; }

// Header word w of this rank (see all_to_all_header_words), from its arguments.
__device__ uint32_t my_header_word(const AllToAllVariableArgs& a, int n, int w) {
  if (w < n) return split_word(a.in_splits ? a.in_splits[w] : a.host_in_splits[w]);
  if (w == n) return capacity_word(a.input_rows);
  if (w == n + 1) return capacity_word(a.output_rows);
  return split_word(a.host_out_splits[w - n - 2]);
}

// Where header word w of `sender` is kept in shared memory.
__device__ __forceinline__ uint32_t& header_word_at(const Columns& c, Ranks& r, int world, int n, int sender, int w) {
  if (w < n) return c.matrix[size_t(sender) * n + w];
  if (w == n) return r.input_rows[sender];
  if (w == n + 1) return r.output_rows[sender];
  return r.declared[sender * world + (w - n - 2)];
}

// This rank's own header words into shared memory, from its arguments (no line carries them).
// Block 0 loads them from its last threads down: its first threads, which store the header
// (send), meanwhile pass their release fence, so that the fence and the loads overlap when the
// header is at most half a block (every 1-D form).
__device__ void keep_own_header(const AllToAllVariableArgs& a, int header, const Columns& c, Ranks& r) {
  const int world = a.sync.world, me = a.sync.rank, n = world * a.experts;
  const int first = blockIdx.x == 0 ? int(blockDim.x) - 1 - int(threadIdx.x) : int(threadIdx.x);
  for (int w = first; w < header; w += blockDim.x) header_word_at(c, r, world, n, me, w) = my_header_word(a, n, w);
}

// The release of this stream's earlier work before the header that lets the peers in, by each
// thread of block 0 that stores a word of it (send), before it loads its share of the header
// (nothing this kernel loads before it needs ordering). Pull: the peers read the input rows (a
// staged copy). Push: the peers write into this rank's output, which earlier kernels wrote (or
// read) last.
__device__ __forceinline__ void release_before_header(const AllToAllVariableArgs& a, int header) {
  if (blockIdx.x == 0 && a.sync.world > 1 && int(threadIdx.x) < header) device::fence_acq_rel_sys();
}

// Block 0 stores this rank's header into every peer's slot; every block, the rows of the pairs
// this rank sends as lines (one expert per rank: its n = world splits). After
// release_before_header, keep_own_header and a __syncthreads.
template <Way W>
__device__ void send(const AllToAllVariableArgs& a, uint32_t call, int header, bool lines, const Columns& c,
                     Ranks& r) {
  const SyncArgs& s = a.sync;
  const int world = s.world, me = s.rank, n = world * a.experts;
  const uint64_t tag = uint64_t(s.signature) << 32;
  if (blockIdx.x == 0 && world > 1) {
    for (int w = threadIdx.x; w < header; w += blockDim.x) {
      const uint32_t word = header_word_at(c, r, world, n, me, w);
      for (int i = 0; i < world - 1; ++i) {
        const int q = rank_in_turn(me, world, i);
        device::st_relaxed_sys_u64(device::low_latency_slot(a.lines.peers[q], call, me, a.lines.slot_words) + w,
                                   tag | word);
      }
    }
  }
  if (!lines) return;
  // sender_fits_row, from the words the peers receive (this rank's row of the matrix and its input
  // rows), in a rolled loop: sender_fits_row's own, unrolled, made the 8-byte-vector push kernel spill.
  const uint32_t* mine = c.matrix + size_t(me) * n;
  uint64_t total = 0;
  bool any_bad = false;
#pragma unroll 1
  for (int q = 0; q < world; ++q) {
    any_bad |= mine[q] == kInvalidSplit;
    total += mine[q];
  }
  const bool fits = !any_bad && total <= r.input_rows[me];
#pragma unroll 1
  for (int i = 0; i < world - 1; ++i) {
    const int q = rank_in_turn(me, world, i);
    if (!pair_by_lines(mine[q], a.row_bytes, a.low_latency_pair_bytes, fits, false)) continue;
    uint64_t first_row = 0;  // of pair q, in this rank's input
#pragma unroll 1
    for (int t = 0; t < q; ++t) first_row += mine[t];
    const uint64_t bytes = uint64_t(mine[q]) * a.row_bytes;
    const char* src = static_cast<const char*>(a.in) + first_row * a.row_bytes;
    uint64_t* slot = device::low_latency_slot(a.lines.peers[q], call, me, a.lines.slot_words) + header;
    for (uint64_t w = device::global_thread(); w < (bytes + 3) / 4; w += device::global_threads())
      device::st_relaxed_sys_u64(slot + w, tag | device::load_word(src, w, bytes));
  }
}

// Threads that read a peer's header word (read_headers): those below this index.
__device__ __forceinline__ int header_readers(int world, int header) { return (world - 1) * header; }

// Every peer's header into shared memory. False (in the threads whose wait failed) on timeout,
// mismatch or abort.
__device__ bool read_headers(const AllToAllVariableArgs& a, uint32_t call, int header, const Columns& c, Ranks& r) {
  const SyncArgs& s = a.sync;
  const int world = s.world, n = world * a.experts;
  const uint64_t* slots = device::low_latency_slot(a.lines.peers[s.rank], call, 0, a.lines.slot_words);
  for (int i = threadIdx.x; i < header_readers(world, header); i += blockDim.x) {
    const int sender = rank_in_turn(s.rank, world, i / header), w = i % header;
    uint32_t word = 0;
    if (!device::read_line(s, slots + size_t(sender) * a.lines.slot_words + w, sender, 0, &word)) return false;
    header_word_at(c, r, world, n, sender, w) = word;
  }
  return true;
}

// Rotated piece i of this rank (plan/all_to_all_layout.hpp's send_piece_in_turn and
// receive_piece_in_turn): its destination j and the rank at the other end.
template <Way W>
__device__ __forceinline__ void piece_in_turn(int me, int world, int experts, int i, int* j, int* peer) {
  const int n = world * experts;
  if (experts == 1) {  // both orders: the rank after this one first (no division on the 1-D path)
    *peer = rank_in_turn(me, world, i);
    *j = W == Way::kPush ? *peer : me;
    return;
  }
  if (W == Way::kPush) {
    *j = ((me + 1) * experts + i) % n;
    *peer = *j / experts;
  } else {
    *peer = rank_in_turn(me, world, i % world);
    *j = me * experts + i / world;
  }
}

// From the matrix: per sender its rows, validity and (for this rank's pieces) where its rows start
// in its input; per receiver where each expert starts and the rows it needs. A warp per sender, a
// warp per receiver (the 2-D form; sum_rows_one_expert serves the 1-D forms).
template <Way W>
__device__ void sum_rows(const AllToAllVariableArgs& a, const Columns& c, Ranks& r) {
  const int world = a.sync.world, me = a.sync.rank, experts = a.experts, n = world * experts;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp < world) {
    const int sender = warp;
    uint64_t carry = 0, to_self = 0;
    int invalid = -1;
    for (int base = 0; base < n; base += 32) {
      const int j = base + lane;
      const uint32_t v = j < n ? c.matrix[size_t(sender) * n + j] : 0;
      const bool bad = j < n && v == kInvalidSplit;
      const uint32_t bads = __ballot_sync(kFullWarp, bad);
      if (bads != 0 && invalid < 0) invalid = base + __ffs(bads) - 1;
      const uint64_t x = bad ? 0 : v;
      const uint64_t inclusive = warp_inclusive_sum(x);
      const uint64_t before = carry + inclusive - x;  // input_row(sender, j)
      if (j < n) {
        if (j / experts == sender) to_self += x;
        if (W == Way::kPush && sender == me) c.src_row[(j + n - ((me + 1) * experts) % n) % n] = uint32_t(before);
        if (W == Way::kPull && j / experts == me)
          c.src_row[(j - me * experts) * world + turn_of_rank(me, world, sender)] = uint32_t(before);
      }
      carry += __shfl_sync(kFullWarp, inclusive, 31);
    }
    const uint64_t self_total = __shfl_sync(kFullWarp, warp_inclusive_sum(to_self), 31);
    if (lane == 0) {
      r.sent[sender] = carry;
      r.invalid_at[sender] = invalid;
      r.to_self[sender] = self_total;
    }
  } else if (warp < 2 * world) {
    const int q = warp - world;
    uint64_t carry = 0;
    for (int base = 0; base < experts; base += 32) {
      const int e = base + lane, j = q * experts + e;
      uint64_t rows = 0;
      if (e < experts)
        for (int s = 0; s < world; ++s) {
          const uint32_t v = c.matrix[size_t(s) * n + j];
          rows += v == kInvalidSplit ? 0 : v;
        }
      const uint64_t extent = e < experts ? expert_extent(rows, a.align) : 0;
      const uint64_t inclusive = warp_inclusive_sum(extent);
      if (e < experts) c.start[j] = carry + inclusive - extent;
      carry += __shfl_sync(kFullWarp, inclusive, 31);
    }
    if (lane == 0) r.needed[q] = carry;
  }
}

// sum_rows for one expert per rank (n = world <= kMaxWorld): warp 0, a lane per rank, serial sums
// over the small matrix (no scans). The same quantities as sum_rows.
template <Way W>
__device__ void sum_rows_one_expert(const AllToAllVariableArgs& a, const Columns& c, Ranks& r) {
  const int world = a.sync.world, me = a.sync.rank;
  const int x = threadIdx.x;  // a sender, and a receiver
  if (x >= world) return;
  uint64_t sent = 0, received = 0;
  int invalid = -1;
  for (int q = 0; q < world; ++q) {
    const uint32_t v = c.matrix[x * world + q];
    if (v == kInvalidSplit && invalid < 0) invalid = q;
    // input_row(x, q) is `sent` here.
    // Piece i is the pair with the rank of turn i (piece_in_turn).
    if (W == Way::kPush && x == me) c.src_row[turn_of_rank(me, world, q)] = uint32_t(sent);
    if (W == Way::kPull && q == me) c.src_row[turn_of_rank(me, world, x)] = uint32_t(sent);
    sent += v == kInvalidSplit ? 0 : v;
    const uint32_t u = c.matrix[q * world + x];
    received += u == kInvalidSplit ? 0 : u;
  }
  const uint32_t self = c.matrix[x * world + x];
  r.sent[x] = sent;
  r.invalid_at[x] = invalid;
  r.to_self[x] = self == kInvalidSplit ? 0 : self;
  c.start[x] = 0;
  r.needed[x] = expert_extent(received, a.align);
}

// The verdict (layout_fault's, from the sums), which senders' rows came as lines, and whether any
// rows cross between ranks by SM. Warp 0, a lane per rank; block 0 records a failing verdict.
__device__ void judge(const AllToAllVariableArgs& a, const Columns& c, Ranks& r, bool lines) {
  const SyncArgs& s = a.sync;
  const int world = s.world, me = s.rank, n = world * a.experts;
  if (threadIdx.x >= 32) return;
  const int x = threadIdx.x;  // a sender, and a receiver
  const bool in_world = x < world;
  const bool sender_bad = in_world && (r.invalid_at[x] >= 0 || r.sent[x] > r.input_rows[x]);
  int declared_at = -1;
  if (a.declared && in_world)
#pragma unroll 1
    for (int t = 0; t < world; ++t)
      if (r.declared[x * world + t] != c.matrix[size_t(t) * n + x]) {
        declared_at = t;
        break;
      }
  const bool receiver_bad = in_world && (declared_at >= 0 || r.needed[x] > r.output_rows[x]);
  const uint32_t senders = __ballot_sync(kFullWarp, sender_bad);
  const uint32_t receivers = __ballot_sync(kFullWarp, receiver_bad);
  // The first fault in layout_fault's order: senders, then receivers, each in rank order.
  const int first = senders != 0 ? __ffs(senders) - 1 : receivers != 0 ? __ffs(receivers) - 1 : -1;
  if (x == first) {
    LayoutFault f;
    if (senders != 0 && r.invalid_at[x] >= 0)
      f = {kFaultInvalidSplit, x, r.invalid_at[x], 0, 0};
    else if (senders != 0)
      f = {kFaultInputTooSmall, x, -1, r.sent[x], r.input_rows[x]};
    else if (declared_at >= 0)
      f = {kFaultDeclaredSplits, x, declared_at, c.matrix[size_t(declared_at) * n + x],
           r.declared[x * world + declared_at]};
    else
      f = {kFaultOutputTooSmall, x, -1, r.needed[x], r.output_rows[x]};
    r.fault = encode_fault(f);
  }
  const bool go = first < 0;
  // Lines come only from a sender that fits, and only with one expert per rank (n == world).
  const bool fits = in_world && !sender_bad;
  const bool from = lines && in_world &&
                    pair_by_lines(c.matrix[size_t(x) * n + me], a.row_bytes, a.low_latency_pair_bytes, fits, x == me);
  if (from) {
    uint64_t row = c.start[me];
#pragma unroll 1
    for (int t = 0; t < x; ++t) row += c.matrix[size_t(t) * n + me];
    r.line_dst[x] = row * a.row_bytes;
    r.line_bytes[x] = uint64_t(c.matrix[size_t(x) * n + me]) * a.row_bytes;
  }
  uint64_t by_sm = 0;  // rows sender x moves to other ranks by SM
  if (in_world && lines) {
#pragma unroll 1
    for (int q = 0; q < world; ++q) {
      const uint32_t v = c.matrix[size_t(x) * n + q];
      if (q != x && v != kInvalidSplit && !pair_by_lines(v, a.row_bytes, a.low_latency_pair_bytes, fits, false))
        by_sm += v;
    }
  } else if (in_world) {
    by_sm = r.sent[x] - r.to_self[x];
  }
  const uint32_t lines_from = __ballot_sync(kFullWarp, from);
  const bool crosses = __ballot_sync(kFullWarp, by_sm > 0) != 0;
  __syncwarp();
  if (x == 0) {
    r.lines_from = lines_from;
    r.go = go;
    r.sm_between_ranks = go && crosses;
    if (!go && blockIdx.x == 0)
      device::record_failure_at(s, kStatusCapacity, r.fault.peer, r.fault.block, r.fault.phase, r.fault.peer_signature);
  }
}

// x[0 .. n) := their exclusive prefix sums, x[n] := their total; n <= kMaxAllToAllSplits. Every
// thread of the block calls it.
__device__ void exclusive_scan(uint64_t* x, int n) {
  __shared__ uint64_t warp_base[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int per_warp = (n + kWarps - 1) / kWarps;
  const int begin = min(n, warp * per_warp), end = min(n, begin + per_warp);
  uint64_t carry = 0;
  for (int base = begin; base < end; base += 32) {
    const int i = base + lane;
    const uint64_t v = i < end ? x[i] : 0;
    const uint64_t inclusive = warp_inclusive_sum(v);
    if (i < end) x[i] = carry + inclusive - v;
    carry += __shfl_sync(kFullWarp, inclusive, 31);
  }
  if (lane == 0) warp_base[warp] = carry;
  __syncthreads();
  if (warp == 0) {
    const uint64_t v = lane < kWarps ? warp_base[lane] : 0;
    const uint64_t inclusive = warp_inclusive_sum(v);
    if (lane < kWarps) warp_base[lane] = inclusive - v;
    if (lane == kWarps - 1) x[n] = inclusive;
  }
  __syncthreads();
  for (int i = begin + lane; i < end; i += 32) x[i] += warp_base[warp];
  __syncthreads();
}

// The same for n <= 32, by warp 0 alone.
__device__ void warp_exclusive_scan(uint64_t* x, int n) {
  const int lane = threadIdx.x % 32;
  const uint64_t v = lane < n ? x[lane] : 0;
  uint64_t inclusive = v;
  for (int d = 1; d < n; d *= 2) {  // log2(n) steps, not 5: the 1-D forms have n = world
    const uint64_t y = __shfl_up_sync(kFullWarp, inclusive, d);
    if (lane >= d) inclusive += y;
  }
  if (lane < n) x[lane] = inclusive - v;
  if (lane == n - 1) x[n] = inclusive;
}

// This rank's pieces in the order its blocks meet them: where each lies, and the SM vectors
// before it (a pair that came as lines has none); block 0 writes torch's out_splits_offsets.
// Only for a call that fits (then every row and offset fits 32 bits). Called by every thread of
// the block, or by warp 0 alone when n <= 32; the caller synchronizes the block after it.
template <typename V, Way W>
__device__ void lay_out_pieces(const AllToAllVariableArgs& a, const Columns& c, bool lines) {
  const int world = a.sync.world, me = a.sync.rank, experts = a.experts, n = world * experts;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    int j = 0, peer = 0;
    piece_in_turn<W>(me, world, experts, i, &j, &peer);
    const int sender = W == Way::kPush ? me : peer;
    const uint32_t rows = c.matrix[size_t(sender) * n + j];
    uint64_t dst = c.start[j];
#pragma unroll 1
    for (int t = 0; t < sender; ++t) dst += c.matrix[size_t(t) * n + j];
    c.dst_row[i] = uint32_t(dst);
    const bool by_lines = lines && pair_by_lines(rows, a.row_bytes, a.low_latency_pair_bytes, true, peer == me);
    c.prefix[i] = by_lines ? 0 : uint64_t(rows) * a.row_bytes / sizeof(V);
  }
  if (blockIdx.x == 0 && a.out_splits_offsets) {
    for (int k = threadIdx.x; k < n; k += blockDim.x) {  // k = e * world + sender, expert-major
      const int sender = k % world, j = me * experts + k / world;
      uint64_t dst = c.start[j];
#pragma unroll 1
      for (int t = 0; t < sender; ++t) dst += c.matrix[size_t(t) * n + j];
      a.out_splits_offsets[k] = int64_t(c.matrix[size_t(sender) * n + j]);
      a.out_splits_offsets[n + k] = int64_t(dst);
    }
  }
  if (n <= 32) {  // every piece in warp 0: no block barrier
    __syncwarp();
    if (threadIdx.x < 32) warp_exclusive_scan(c.prefix, n);
  } else {
    __syncthreads();
    exclusive_scan(c.prefix, n);
  }
}

// The rows that came as lines, into the output (dropped when the call does not fit), by every
// thread of the grid: word w of every such sender at once. False on timeout, mismatch or abort.
__device__ bool receive_lines(const AllToAllVariableArgs& a, uint32_t call, int header, const Ranks& r) {
  const SyncArgs& s = a.sync;
  uint64_t words[kMaxWorld];
  uint64_t longest = 0;
#pragma unroll
  for (int t = 0; t < kMaxWorld; ++t) {
    words[t] = (r.lines_from >> t & 1u) ? (r.line_bytes[t] + 3) / 4 : 0;
    longest = max(longest, words[t]);
  }
  uint64_t* slots = device::low_latency_slot(a.lines.peers[s.rank], call, 0, a.lines.slot_words) + header;
  char* out = static_cast<char*>(a.out);
  for (uint64_t w = device::global_thread(); w < longest; w += device::global_threads()) {
    uint32_t senders = 0;
#pragma unroll
    for (int t = 0; t < kMaxWorld; ++t)
      if (w < words[t]) senders |= 1u << t;
    uint32_t word[kMaxWorld];
    if (!device::collect_words(s, slots, a.lines.slot_words, w, senders, 0, 0, word)) return false;
    if (r.go) {
#pragma unroll
      for (int t = 0; t < kMaxWorld; ++t)
        if (senders >> t & 1u) device::store_word_bytes(out + r.line_dst[t], w, r.line_bytes[t], word[t]);
    }
  }
  return true;
}

// This block's span of the concatenated SM pieces (plan/all_to_all_cut.hpp).
template <typename V, Way W>
__device__ void move_span(const AllToAllVariableArgs& a, const Columns& c) {
  const int world = a.sync.world, me = a.sync.rank, experts = a.experts, n = world * experts;
  const uint64_t total = c.prefix[n];
  const uint64_t begin = cut_begin(total, gridDim.x, blockIdx.x), end = cut_begin(total, gridDim.x, blockIdx.x + 1);
  for_each_segment(c.prefix, n, begin, end, [&](int i, uint64_t first, uint64_t count) {
    int j = 0, peer = 0;
    piece_in_turn<W>(me, world, experts, i, &j, &peer);
    const char* src_base = static_cast<const char*>(W == Way::kPush || peer == me ? a.in : a.in_peers[peer]);
    char* dst_base = static_cast<char*>(W == Way::kPush && peer != me ? a.out_peers[peer] : a.out);
    const V* src = reinterpret_cast<const V*>(src_base + uint64_t(c.src_row[i]) * a.row_bytes);
    V* dst = reinterpret_cast<V*>(dst_base + uint64_t(c.dst_row[i]) * a.row_bytes);
    device::block_copy<V, kUnroll>(src, dst, first, first + count);
  });
}

// The thread that reads the call counter and the epoch and counts its block on it: one of the last
// warp, which waits for no peer's header word (read_headers gives them to the first threads; in
// block 0 it loads one of this rank's own, beside the counter) and is idle while warp 0 derives
// the layout of a 1-D call (the 2-D form at world 8 gives it a receiver's sums).
constexpr int kCounterThread = kThreadsPerBlock - 1;

// Called by kCounterThread once its block has read every header: counts the block on the call
// counter (device/call_counter.cuh's second word), with release (this block's reads of the
// headers come before its arrival), and returns the count before it. Taken right after the
// headers, not at the end: the atomic's round trip overlaps the layout instead of following the
// copies.
__device__ uint32_t arrive_after_headers(const SyncArgs& s) {
  return device::atomic_add_release_gpu(&s.call_counter[1], 1u);
}

// Every block reaches this, also after a failed wait. The last block to have read the headers
// clears every peer's header line (every block has read them by then), then advances the call
// counter as device/call_counter.cuh's call_end does, with the clear before it.
__device__ void finish(const AllToAllVariableArgs& a, uint32_t call, int header, bool last_reader) {
  const SyncArgs& s = a.sync;
  if (!last_reader) return;
  if (threadIdx.x == kCounterThread) __threadfence();  // the other blocks' reads (their arrivals) before the clears
  __syncthreads();
  uint64_t* slots = device::low_latency_slot(a.lines.peers[s.rank], call, 0, a.lines.slot_words);
  for (int i = threadIdx.x; i < header_readers(s.world, header); i += blockDim.x) {
    const int sender = rank_in_turn(s.rank, s.world, i / header);
    device::st_relaxed_sys_u64(slots + size_t(sender) * a.lines.slot_words + i % header, 0);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    s.call_counter[1] = 0;  // every block has read the number: the next kernel sees the new one
    s.call_counter[0] = call;
  }
}

template <typename V, Way W>
__global__ void __launch_bounds__(kThreadsPerBlock) all_to_all_variable(AllToAllVariableArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  const int header = all_to_all_header_words(s.world, a.experts, a.declared);
  const bool lines = a.experts == 1 && a.low_latency_pair_bytes > 0;
  extern __shared__ __align__(16) uint8_t dynamic_shared[];
  const Columns c = columns_in(dynamic_shared, s.world, s.world * a.experts);
  __shared__ Ranks r;
  __shared__ uint32_t call_number;

  // The call number (device/call_counter.cuh's call_begin, without its own barrier), this block's
  // epoch for the end barrier and this rank's header words load at once, beside block 0's release.
  __shared__ uint32_t epoch;
  if (threadIdx.x == kCounterThread) {
    call_number = s.call_counter[0] + 1;
    epoch = device::epoch_after(s);
  }
  release_before_header(a, header);
  keep_own_header(a, header, c, r);
  __syncthreads();
  const uint32_t call = call_number;
  send<W>(a, call, header, lines, c, r);
  bool ok = __syncthreads_and(read_headers(a, call, header, c, r));
  // Whether this block was the last to read the headers, for finish (published by the barriers
  // below). In the 1-D forms the atomic's round trip overlaps the layout, which kCounterThread's
  // warp has no part in.
  __shared__ int last_reader;
  if (threadIdx.x == kCounterThread) last_reader = arrive_after_headers(s) == gridDim.x - 1;
  if (ok) {
    if (a.experts == 1) {
      // The 1-D forms: one warp derives everything, with no block barrier between the steps.
      if (threadIdx.x < 32) {
        sum_rows_one_expert<W>(a, c, r);
        __syncwarp();
        judge(a, c, r, lines);
        __syncwarp();
        if (r.go) lay_out_pieces<V, W>(a, c, lines);
      }
    } else {
      sum_rows<W>(a, c, r);
      __syncthreads();
      judge(a, c, r, lines);
      __syncthreads();
      if (r.go) lay_out_pieces<V, W>(a, c, lines);
    }
    __syncthreads();
    // Invariant: every block of every rank holds the same matrix, verdict and choice per pair.
    if (r.lines_from != 0) ok = receive_lines(a, call, header, r);
  }
  const bool go = __syncthreads_and(ok) && r.go;
  if (go) {
    move_span<V, W>(a, c);
    if (r.sm_between_ranks) {
      if (device::barrier(s, epoch, 1)) device::epoch_commit(s, epoch);
      // Invariant: block b of every peer finished its stores into (push) or loads from (pull)
      // this rank's buffers; the kernel's end, every block of every peer.
    }
  }
  finish(a, call, header, last_reader);
}

template <typename V, Way W>
void launch_as(const AllToAllVariableArgs& args, int blocks, cudaStream_t stream) {
  const size_t shared = all_to_all_variable_shared_bytes(args.sync.world, args.sync.world * args.experts);
  // Raised for every call, not only past 48 KiB of dynamic bytes: the kernel's static shared memory
  // (Ranks and the phases' words) counts against the same default limit, so a layout just under
  // 48 KiB (2-D form: world 8 with 108 or 109 experts, 7 with 133-135, 6 with 168-170) would fail
  // to launch.
  static DynamicSharedLimit limit;
  limit.raise(all_to_all_variable<V, W>, kMostSharedBytes);
  launch_kernel(all_to_all_variable<V, W>, blocks, kThreadsPerBlock, shared, stream, args);
}

template <Way W>
void launch_variable(int vector_bytes, const AllToAllVariableArgs& args, int blocks, cudaStream_t stream) {
  switch (vector_bytes) {
    case 16: return launch_as<uint4, W>(args, blocks, stream);
    case 8: return launch_as<uint2, W>(args, blocks, stream);
    case 4: return launch_as<uint32_t, W>(args, blocks, stream);
    case 2: return launch_as<uint16_t, W>(args, blocks, stream);
    case 1: return launch_as<uint8_t, W>(args, blocks, stream);
    default:
      SYMMEM_THROW(ErrorCode::kInternal, "all_to_all: no kernel for " + std::to_string(vector_bytes) + "-byte vectors");
  }
}

}  // namespace

void launch_all_to_all_variable_pull(int vector_bytes, const AllToAllVariableArgs& args, int blocks,
                                     cudaStream_t stream) {
  launch_variable<Way::kPull>(vector_bytes, args, blocks, stream);
}

void launch_all_to_all_variable_push(int vector_bytes, const AllToAllVariableArgs& args, int blocks,
                                     cudaStream_t stream) {
  launch_variable<Way::kPush>(vector_bytes, args, blocks, stream);
}

}  // namespace symmem::detail
