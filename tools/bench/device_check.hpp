// Device-side checks for -c: element mismatches against an expected buffer, and a fingerprint of
// a buffer that ranks compare to prove they hold the same bits (without copying it to the host).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace symmem::bench {

// Elements (of elem_bytes) in [0, bytes) where a and b differ bitwise; synchronous on stream.
long count_mismatches(const void* a, const void* b, size_t bytes, size_t elem_bytes, cudaStream_t stream);

// A 64-bit fingerprint of [p, p + bytes): the sum of a strong mix of every 8-byte word with its
// index (order-independent on the device, so atomics suffice; a changed or moved byte changes it
// with probability 1 - 2^-64). Synchronous on stream.
uint64_t fingerprint(const void* p, size_t bytes, cudaStream_t stream);

}  // namespace symmem::bench
