#include <cstdint>
#include <stdexcept>
#include <string>

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

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e));
}

}  // namespace

long count_mismatches(const void* a, const void* b, size_t bytes, size_t elem_bytes, cudaStream_t stream) {
  unsigned long long* count = nullptr;
  check(cudaMallocAsync(&count, sizeof(*count), stream), "cudaMallocAsync");
  check(cudaMemsetAsync(count, 0, sizeof(*count), stream), "cudaMemsetAsync");
  mismatch_kernel<<<264, 512, 0, stream>>>(static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b),
                                           bytes / elem_bytes, elem_bytes, count);
  check(cudaGetLastError(), "mismatch_kernel");
  unsigned long long host = 0;
  check(cudaMemcpyAsync(&host, count, sizeof(host), cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
  check(cudaFreeAsync(count, stream), "cudaFreeAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return static_cast<long>(host);
}

}  // namespace symmem::bench
