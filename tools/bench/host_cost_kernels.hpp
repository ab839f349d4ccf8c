// Kernels of the host-cost benchmark: a spin that holds the GPU busy for a while (so that calls
// issued behind it never wait for the GPU), and empty kernels that give the bare launch cost.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace symmem::bench {

// One thread spinning on the GPU's global timer for `nanoseconds`.
void launch_spin(uint64_t nanoseconds, cudaStream_t stream);
// An empty kernel, <<<1, 32>>> with no arguments.
void launch_empty(cudaStream_t stream);
// An empty kernel with symmem's largest argument struct (ReduceKernelArgs), through
// cudaLaunchKernelEx, with the programmatic-serialisation attribute when `pdl`: what a symmem
// launch costs with nothing of symmem around it.
void launch_empty_like_symmem(bool pdl, cudaStream_t stream);

}  // namespace symmem::bench
