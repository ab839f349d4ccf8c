// Device-side comparison for -c: counts elements whose bytes differ from the expected buffer.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace symmem::bench {

// Elements (of elem_bytes) in [0, bytes) where a and b differ bitwise; synchronous on stream.
long count_mismatches(const void* a, const void* b, size_t bytes, size_t elem_bytes, cudaStream_t stream);

}  // namespace symmem::bench
