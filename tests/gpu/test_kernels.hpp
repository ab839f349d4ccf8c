// Device helpers for the GPU tests: deterministic patterns, on-device checks that accumulate a
// mismatch count without synchronising (so thousands of calls can be checked back to back), and
// a kernel that occupies every SM.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "symmem/types.hpp"

namespace symmem::test {

// byte i = pattern(seed, i)
void fill_pattern(void* p, size_t bytes, uint64_t seed, cudaStream_t stream);
// *mismatches += bytes of slot r (r < world, each `bytes` long at out + r * bytes) that differ
// from pattern(seed_of(r), i), where seed_of(r) = mix(r, iteration).
void count_gather_mismatches(const void* out, size_t bytes, int world, uint64_t iteration,
                             unsigned long long* mismatches, cudaStream_t stream);
// element i = small integer in [-8, 8] from (seed, i), stored as `type`.
void fill_small_integers(void* p, size_t count, DataType type, uint64_t seed, cudaStream_t stream);
// *mismatches += elements i of out (count, `type`) != sum over r < world of the small integer of
// (mix(r, iteration), first + i).
void count_sum_mismatches(const void* out, size_t count, size_t first, DataType type, int world, uint64_t iteration,
                          unsigned long long* mismatches, cudaStream_t stream);
// Seed of rank r for iteration `iteration` as the checks above compute it.
uint64_t pattern_seed(int rank, uint64_t iteration);

// Occupies every SM (two 1024-thread blocks each) until *release != 0 or `ms` pass.
void launch_sm_hog(int sm_count, const volatile int* release, int ms, cudaStream_t stream);

}  // namespace symmem::test
