// The communicator's call number for kernels whose buffers alternate by call parity (low latency,
// one-shot push, reduce-scatter push). Unlike the per-block epochs of the barrier, it counts
// calls, not blocks: which block handles an element depends on the grid, which changes with the
// message size, so only a number unique to the call tells the two halves of an area apart.
// The last block to finish advances it on the device, so CUDA graph replays count too (the
// variable all-to-all counts its blocks once they have read the headers, kernels/all_to_all_variable.cu).
#pragma once

#include "device/device_types.hpp"

namespace symmem::device {

// The number of this call (all threads of every block see the same value).
__device__ __forceinline__ uint32_t call_begin(const detail::SyncArgs& s) {
  __shared__ uint32_t call;
  if (threadIdx.x == 0) call = s.call_counter[0] + 1;
  __syncthreads();
  return call;
}

// Every block must reach this, also after a failed wait, or the number stops advancing.
__device__ __forceinline__ void call_end(const detail::SyncArgs& s, uint32_t call) {
  __syncthreads();
  if (threadIdx.x == 0 && atomicAdd(&s.call_counter[1], 1u) == gridDim.x - 1) {
    s.call_counter[1] = 0;  // every block has read the number: the next kernel sees the new one
    s.call_counter[0] = call;
  }
}

}  // namespace symmem::device
