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
// The rows x cols matrix fill_small_integers(p, rows * cols, type, seed) writes row-major, stored
// column-major instead: element (i, j) at p[i + j * rows] (a fused op's b given as W.t()).
void fill_small_integers_column_major(void* p, int rows, int cols, DataType type, uint64_t seed,
                                      cudaStream_t stream);
// *mismatches += elements i of out (count, `type`) != sum over r < world of the small integer of
// (mix(r, iteration), first + i).
void count_sum_mismatches(const void* out, size_t count, size_t first, DataType type, int world, uint64_t iteration,
                          unsigned long long* mismatches, cudaStream_t stream);
// Products of small-integer matrices (a rows x cols matrix filled by fill_small_integers(p,
// rows * cols, type, seed) holds small_integer(seed, i * cols + j) at (i, j)): with k * world * 64
// below 2^24 every float32 sum of products is exact in any order, so a GEMM that accumulates in
// float32 and rounds once has exactly one right answer (compared bit by bit).
//
// all_gather_matmul: *mismatches += elements of c [m x n] != (A @ B) rounded to `type`, where the
// shard_rows rows of A from s * shard_rows on are rank s's shard (seed pattern_seed(s, iteration))
// and B [k x n] has seed b_seed.
void count_gathered_product_mismatches(const void* c, int m, int n, int k, int shard_rows, DataType type,
                                       uint64_t iteration, uint64_t b_seed, unsigned long long* mismatches,
                                       cudaStream_t stream);
// matmul_reduce_scatter: *mismatches += elements of c_shard [rows x n] != rows first_row.. of the
// sum over r < world of A_r [. x k] @ B_r [k x n], rounded once to `type`; A_r has seed
// pattern_seed(r, iteration), B_r seed pattern_seed(r, iteration + kSecondOperand).
constexpr uint64_t kSecondOperand = uint64_t(1) << 40;
void count_summed_product_mismatches(const void* c_shard, int first_row, int rows, int n, int k, int world,
                                     DataType type, uint64_t iteration, unsigned long long* mismatches,
                                     cudaStream_t stream);
// *mismatches += elements i < count of p != small_integer(seed, i) as `type` (fill_small_integers).
void count_small_integer_mismatches(const void* p, size_t count, DataType type, uint64_t seed,
                                    unsigned long long* mismatches, cudaStream_t stream);

// Seed of rank r for iteration `iteration` as the checks above compute it.
uint64_t pattern_seed(int rank, uint64_t iteration);

// Occupies every SM (two 1024-thread blocks each) until *release != 0 or `ms` pass.
void launch_sm_hog(int sm_count, const volatile int* release, int ms, cudaStream_t stream);

// Holds `stream` for `us` microseconds (one block: the rest of the GPU stays free).
void launch_delay(int us, cudaStream_t stream);

// *mismatches += bytes i < bytes where a[i] != b[i] (bit-exact comparison, e.g. against NCCL).
void count_differences(const void* a, const void* b, size_t bytes, unsigned long long* mismatches, cudaStream_t stream);
// *mismatches += bytes of p that differ from fill_pattern(p, bytes, seed) (an untouched canary).
void count_pattern_mismatches(const void* p, size_t bytes, uint64_t seed, unsigned long long* mismatches,
                              cudaStream_t stream);

// element i = a nonzero multiple of 1/4 in [-8, 8] from (seed, i) (int32: a nonzero integer in
// [-1000, 1000]). Every partial sum of up to 8 ranks is exact in every type, so every summation
// order (symmem's, NCCL's, float64) gives the same bits: results compare bit-exactly with NCCL.
void fill_exact(void* p, size_t count, DataType type, uint64_t seed, cudaStream_t stream);

// element i = uniform in [-1, 1) from (seed, i), rounded to `type` (int32: integer in [-1000, 1000]).
void fill_uniform(void* p, size_t count, DataType type, uint64_t seed, cudaStream_t stream);
struct RankSeeds {
  uint64_t seed[8];  // rank r filled its input with fill_uniform(..., seed[r], ...)
  int world;
};
// *mismatches += elements i < count of out farther from the float64 sum over ranks of their
// element first + i than one rounding to `type` after fp32 accumulation allows (NaN counts).
void count_far_from_uniform_sum(const void* out, size_t count, size_t first, DataType type, const RankSeeds& seeds,
                                unsigned long long* mismatches, cudaStream_t stream);

// An order-independent 64-bit digest of `bytes` bytes (equal contents give equal digests).
// Synchronises the stream.
uint64_t device_digest(const void* p, size_t bytes, cudaStream_t stream);

}  // namespace symmem::test
