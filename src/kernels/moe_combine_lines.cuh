// What the MoE combine kernels share (kernels/moe_combine.cu, kernels/moe_combine_reduced.cu):
// bfloat16 rows summed in float32, and the per-block lines they exchange with the same block of
// every peer: the pulls' entry line (phase 0) in word blockIdx.x of the sender's slot and their exit
// line ("done reading", phase 1) in word kMaxBlocks + blockIdx.x; the reduction's presence line in
// word blockIdx.x and its delivery line ("partials delivered") in word kMaxBlocks + blockIdx.x;
// all in the half of the call's parity. Every line is taken and cleared in its call
// (device/low_latency.cuh).
#pragma once

#include <cuda_bf16.h>

#include "device/low_latency.cuh"
#include "device/ptx.cuh"
#include "kernels/moe_args.hpp"

namespace symmem::detail::combine_lines {

// acc[i] += w * v[i] for eight bfloat16 values, in float32.
__device__ __forceinline__ void add_scaled(float (&acc)[8], const uint4& v, float w) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    acc[2 * i] = fmaf(w, f.x, acc[2 * i]);
    acc[2 * i + 1] = fmaf(w, f.y, acc[2 * i + 1]);
  }
}

// Eight float32 sums rounded to bfloat16 once, as one 16-byte vector.
__device__ __forceinline__ uint4 to_bf16x8(const float (&acc)[8]) {
  uint4 out;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
  return out;
}

constexpr int kEntryPhase = 0, kSecondPhase = 1;
__device__ __forceinline__ size_t line_word(int phase) { return size_t(phase) * kMaxBlocks + blockIdx.x; }

// One thread: this block's line of `phase` into this rank's slot at every peer.
__device__ __forceinline__ void post_lines(const MoeCombineArgs& a, uint32_t call, int phase) {
  const SyncArgs& s = a.sync;
  const uint64_t line = uint64_t(s.signature) << 32;
  for (int k = 1; k < s.world; ++k) {
    const int peer = (s.rank + k) % s.world;
    device::st_relaxed_sys_u64(
        device::low_latency_slot(a.lines.peers[peer], call, s.rank, a.lines.slot_words) + line_word(phase), line);
  }
}

// One thread: every peer's line of `phase` for this block, with the communicator's deadline (the
// record names the first peer missing, and the phase). False on timeout, mismatch or abort.
__device__ __forceinline__ bool collect_lines(const MoeCombineArgs& a, uint32_t call, int phase) {
  const SyncArgs& s = a.sync;
  uint32_t word[kMaxWorld];
  return device::collect_words(s, device::low_latency_slot(a.lines.peers[s.rank], call, 0, a.lines.slot_words),
                               a.lines.slot_words, line_word(phase), (1u << s.world) - 1, 0, phase, word);
}

// Entry, the whole block: every peer's expert outputs are written, and the dispatch fit (`go`).
__device__ __forceinline__ bool enter_combine(const MoeCombineArgs& a, uint32_t call) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    device::fence_acq_rel_sys();  // this stream's expert outputs before the lines
    post_lines(a, call, kEntryPhase);
    ok = collect_lines(a, call, kEntryPhase);
    device::fence_acq_rel_sys();  // acquire: the peers' expert outputs
  }
  __syncthreads();
  // The dispatch's `go`: a dispatch that did not fit left the communicator failed (nothing to sum).
  return ok && *a.scratch.go != 0;
}

}  // namespace symmem::detail::combine_lines
