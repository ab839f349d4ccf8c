// The split exchange of all_to_all_v / all_to_all_vdev (kernels/all_to_all_args.hpp): one block
// that all-gathers every rank's header as low-latency lines, then derives, from the matrix every
// rank now holds, the verdict, the pieces and torch's out_splits_offsets. The quantities are those
// of plan/all_to_all_layout.hpp, computed with parallel sums (the CPU tests check the formulas,
// the shared-GPU tests this kernel's results against them).
//
// Header of rank r (4-byte words): its world * experts splits, its input rows, its output
// capacity, and for all_to_all_v the rows it expects from each sender.
//
// Failure records: a wait names phase 0 (device/wait.cuh); a call that does not fit records
// kStatusCapacity (plan/capacity_failure.hpp) on every rank, and the table's go stays 0 so that no
// move kernel moves a row. A counted low-latency call: the block reaches call_end on every path.
#include "device/call_counter.cuh"
#include "device/dependent_launch.cuh"
#include "device/low_latency.cuh"
#include "plan/capacity_failure.hpp"
#include "kernels/all_to_all_args.hpp"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"

namespace symmem::detail {
namespace {

// Exclusive prefix sums of row `s` of the matrix, by one warp (lanes over 32 columns at a time):
// input_prefix[s][j] = input_row(s, j). Returns the row's sum and whether it holds an invalid split.
__device__ uint64_t scan_row(AllToAllTable* t, int s, int n, bool* invalid) {
  const int lane = threadIdx.x % 32;
  uint64_t carry = 0;
  bool bad = false;
  for (int base = 0; base < n; base += 32) {
    const int j = base + lane;
    const uint32_t v = j < n ? t->matrix[size_t(s) * n + j] : 0;
    bad |= v == kInvalidSplit;
    uint64_t x = v == kInvalidSplit ? 0 : v;
    // Inclusive warp scan, then shift to exclusive.
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const uint64_t y = __shfl_up_sync(0xFFFFFFFFu, x, d);
      if (lane >= d) x += y;
    }
    const uint64_t exclusive = x - (v == kInvalidSplit ? 0 : v);
    if (j < n) t->input_prefix[size_t(s) * n + j] = carry + exclusive;
    carry += __shfl_sync(0xFFFFFFFFu, x, 31);
  }
  *invalid = __any_sync(0xFFFFFFFFu, bad);
  return carry;
}

__global__ void __launch_bounds__(kThreadsPerBlock) all_to_all_split_exchange(AllToAllExchangeArgs a) {
  device::enter_kernel();
  const SyncArgs& s = a.sync;
  AllToAllTable* t = a.table;
  const uint32_t call = device::call_begin(s);
  const int world = s.world;
  const int experts = a.experts;
  const int n = world * experts;
  const int header = n + 2 + (a.declared ? world : 0);
  if (threadIdx.x == 0) t->go = 0;  // until the verdict

  auto my_word = [&](int w) -> uint32_t {
    if (w < n) return split_word(a.in_splits ? a.in_splits[w] : a.host_in_splits[w]);
    if (w == n) return capacity_word(a.input_rows);
    if (w == n + 1) return capacity_word(a.output_rows);
    return split_word(a.host_out_splits[w - n - 2]);
  };
  auto keep = [&](int r, int w, uint32_t word) {
    if (w < n)
      t->matrix[size_t(r) * n + w] = word;
    else if (w == n)
      t->input_rows[r] = word;
    else if (w == n + 1)
      t->output_rows[r] = word;
    else
      t->declared[size_t(r) * world + (w - n - 2)] = word;
  };

  // Send. The fence makes this stream's earlier writes (the input rows, a staged copy) visible
  // before the lines that tell the peers this rank reached the call.
  device::fence_acq_rel_sys();
  const uint64_t tag = uint64_t(s.signature) << 32;
  for (int w = threadIdx.x; w < header; w += blockDim.x) {
    const uint32_t word = my_word(w);
    for (int k = 1; k < world; ++k) {
      const int peer = (s.rank + k) % world;
      device::st_relaxed_sys_u64(device::low_latency_slot(a.lines.peers[peer], call, s.rank, a.lines.slot_words) + w,
                                 tag | word);
    }
  }

  // Collect every rank's header.
  __shared__ int ok;
  if (threadIdx.x == 0) ok = 1;
  __syncthreads();
  uint64_t* slots = device::low_latency_slot(a.lines.peers[s.rank], call, 0, a.lines.slot_words);
  const uint32_t every = (1u << world) - 1;
  for (int w = threadIdx.x; w < header; w += blockDim.x) {
    uint32_t word[kMaxWorld];
    if (!device::collect_words(s, slots, a.lines.slot_words, w, every, my_word(w), 0, word)) {
      ok = 0;
      break;
    }
    for (int r = 0; r < world; ++r) keep(r, w, word[r]);
  }
  __syncthreads();
  // Acquire: the peers' writes before their lines (their inputs) are visible to the move kernel.
  device::fence_acq_rel_sys();
  if (!ok) {
    device::call_end(s, call);
    return;
  }

  // Per destination j: the rows it receives in all. Per sender: prefix sums, total, validity.
  __shared__ uint64_t destination_rows[kMaxAllToAllSplits];
  __shared__ uint64_t expert_start[kMaxAllToAllSplits];
  __shared__ uint64_t sent[kMaxWorld], needed[kMaxWorld];
  __shared__ bool invalid[kMaxWorld];
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    uint64_t rows = 0;
    for (int r = 0; r < world; ++r) {
      const uint32_t v = t->matrix[size_t(r) * n + j];
      rows += v == kInvalidSplit ? 0 : v;
    }
    destination_rows[j] = rows;
  }
  const int warp = threadIdx.x / 32;
  if (warp < world) {
    bool bad = false;
    const uint64_t total = scan_row(t, warp, n, &bad);
    if (threadIdx.x % 32 == 0) {
      sent[warp] = total;
      invalid[warp] = bad;
    }
  }
  __syncthreads();
  if (threadIdx.x < world) {
    const int q = threadIdx.x;
    uint64_t start = 0;
    for (int e = 0; e < experts; ++e) {
      expert_start[q * experts + e] = start;
      start += expert_extent(destination_rows[q * experts + e], a.align);
    }
    needed[q] = start;
  }
  __syncthreads();

  // The verdict, in layout_fault's order: senders (invalid split, input too small), then
  // receivers (declared splits, output too small).
  __shared__ int fault;
  if (threadIdx.x == 0) {
    LayoutFault f;
    for (int r = 0; r < world && f.kind == kFaultNone; ++r) {
      if (invalid[r]) {
        f.kind = kFaultInvalidSplit;
        f.rank = r;
        for (int j = 0; j < n; ++j)
          if (t->matrix[size_t(r) * n + j] == kInvalidSplit) {
            f.other = j;
            break;
          }
      } else if (sent[r] > t->input_rows[r]) {
        f = {kFaultInputTooSmall, r, -1, sent[r], t->input_rows[r]};
      }
    }
    for (int q = 0; q < world && f.kind == kFaultNone; ++q) {
      if (a.declared) {
        for (int r = 0; r < world; ++r) {
          if (t->declared[size_t(q) * world + r] != t->matrix[size_t(r) * n + q]) {
            f = {kFaultDeclaredSplits, q, r, t->matrix[size_t(r) * n + q], t->declared[size_t(q) * world + r]};
            break;
          }
        }
      }
      if (f.kind == kFaultNone && needed[q] > t->output_rows[q])
        f = {kFaultOutputTooSmall, q, -1, needed[q], t->output_rows[q]};
    }
    fault = f.kind != kFaultNone;
    if (fault) {
      const EncodedFault e = encode_fault(f);
      device::record_failure_at(s, kStatusCapacity, e.peer, e.block, e.phase, e.peer_signature);
    }
  }
  __syncthreads();
  if (fault) {
    device::call_end(s, call);
    return;
  }

  // The pieces, and torch's out_splits_offsets (expert-major: k = e * world + r).
  const int me = s.rank;
  for (int k = threadIdx.x; k < n; k += blockDim.x) {
    {  // what this rank sends to destination j = k
      const int j = k;
      uint64_t dst = expert_start[j];
      for (int r = 0; r < me; ++r) dst += t->matrix[size_t(r) * n + j];
      const uint64_t rows = t->matrix[size_t(me) * n + j];
      t->send[k] = {j / experts, uint32_t(j), t->input_prefix[size_t(me) * n + j] * a.row_bytes, dst * a.row_bytes,
                    rows * a.row_bytes};
    }
    {  // what it receives from sender r for its expert e
      const int e = k / world, r = k % world;
      const int j = me * experts + e;
      uint64_t dst = expert_start[j];
      for (int r2 = 0; r2 < r; ++r2) dst += t->matrix[size_t(r2) * n + j];
      const uint64_t rows = t->matrix[size_t(r) * n + j];
      t->receive[k] = {r, uint32_t(j), t->input_prefix[size_t(r) * n + j] * a.row_bytes, dst * a.row_bytes,
                       rows * a.row_bytes};
      if (a.out_splits_offsets) {
        a.out_splits_offsets[k] = int64_t(rows);
        a.out_splits_offsets[n + k] = int64_t(dst);
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // Low latency when every pair fits the threshold (one piece per pair: experts == 1). The
    // matrix is the same on every rank, so is the choice.
    uint64_t largest = 0;
    if (experts == 1)
      for (int i = 0; i < world * world; ++i) largest = max(largest, uint64_t(t->matrix[i]) * a.row_bytes);
    t->low_latency = experts == 1 && a.low_latency_pair_bytes > 0 && largest <= a.low_latency_pair_bytes;
    t->pieces = n;
    t->go = 1;
  }
  // Invariant: every rank's table holds the same verdict; every line addressed to this rank was
  // read and cleared.
  device::call_end(s, call);
}

}  // namespace

void launch_all_to_all_split_exchange(const AllToAllExchangeArgs& args, cudaStream_t stream) {
  launch_kernel(all_to_all_split_exchange, 1, kThreadsPerBlock, 0, stream, args);
}

}  // namespace symmem::detail
