#include <cstdint>

#include "check.hpp"
#include "device_check.hpp"

namespace symmem::bench {
namespace {

__global__ void mismatch_kernel(const uint8_t* a, const uint8_t* b, size_t elems, size_t elem_bytes,
                                unsigned long long* count) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < elems; i += size_t(gridDim.x) * blockDim.x) {
    bool differ = false;
    for (size_t k = 0; k < elem_bytes; ++k) differ |= a[i * elem_bytes + k] != b[i * elem_bytes + k];
    local += differ;
  }
  if (local) atomicAdd(count, local);
}

// splitmix64's finaliser: every input bit flips about half of the output bits.
__device__ uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Word w of the buffer, the bytes past the end read as zero (byte loads: no alignment assumed).
__device__ uint64_t word_at(const uint8_t* p, size_t bytes, size_t w) {
  uint64_t v = 0;
  for (size_t k = 0; k < 8 && w * 8 + k < bytes; ++k) v |= uint64_t(p[w * 8 + k]) << (8 * k);
  return v;
}

__global__ void fingerprint_kernel(const uint8_t* p, size_t bytes, bool aligned, unsigned long long* sum) {
  const size_t words = (bytes + 7) / 8;
  uint64_t local = 0;
  for (size_t w = blockIdx.x * size_t(blockDim.x) + threadIdx.x; w < words; w += size_t(gridDim.x) * blockDim.x) {
    const uint64_t v = aligned && (w + 1) * 8 <= bytes ? reinterpret_cast<const uint64_t*>(p)[w] : word_at(p, bytes, w);
    local += mix(v ^ mix(w + 0x9E3779B97F4A7C15ull));
  }
  atomicAdd(sum, static_cast<unsigned long long>(local));
}

// Runs `launch(counter)` on a zeroed device counter and returns the counter's final value.
template <typename Launch>
unsigned long long with_counter(cudaStream_t stream, Launch launch) {
  unsigned long long* counter = nullptr;
  BENCH_CUDA_CHECK(cudaMallocAsync(&counter, sizeof(*counter), stream));
  BENCH_CUDA_CHECK(cudaMemsetAsync(counter, 0, sizeof(*counter), stream));
  launch(counter);
  BENCH_CUDA_CHECK(cudaGetLastError());
  unsigned long long host = 0;
  BENCH_CUDA_CHECK(cudaMemcpyAsync(&host, counter, sizeof(host), cudaMemcpyDeviceToHost, stream));
  BENCH_CUDA_CHECK(cudaFreeAsync(counter, stream));
  BENCH_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

}  // namespace

long count_mismatches(const void* a, const void* b, size_t bytes, size_t elem_bytes, cudaStream_t stream) {
  return static_cast<long>(with_counter(stream, [&](unsigned long long* count) {
    mismatch_kernel<<<264, 512, 0, stream>>>(static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b),
                                             bytes / elem_bytes, elem_bytes, count);
  }));
}

uint64_t fingerprint(const void* p, size_t bytes, cudaStream_t stream) {
  const bool aligned = reinterpret_cast<uintptr_t>(p) % 8 == 0;
  return with_counter(stream, [&](unsigned long long* sum) {
    fingerprint_kernel<<<264, 512, 0, stream>>>(static_cast<const uint8_t*>(p), bytes, aligned, sum);
  });
}

}  // namespace symmem::bench
