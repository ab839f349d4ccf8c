// ncclAvg as symmem serves it: symmem's sum, then this kernel multiplies the result by 1 / world on
// the same stream (in fp32, rounded once to the element type). NCCL pre-multiplies the inputs
// instead; at a world that is a power of two both are exact scalings of the same sum. Capturable.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "symmem/types.hpp"

namespace symmem::nccl {

// data[i] *= factor for i < count; float32, float16 or bfloat16. Throws kCudaError.
void launch_scale(void* data, size_t count, DataType type, float factor, cudaStream_t stream);

}  // namespace symmem::nccl
