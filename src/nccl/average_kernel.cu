#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/check.hpp"
#include "device/dependent_launch.cuh"
#include "nccl/average_kernel.hpp"

namespace symmem::nccl {
namespace {

// Launched plainly (it waits for the served collective to end); enter_kernel() keeps the rule of
// every symmem kernel all the same.
template <typename T>
__global__ void scale(T* data, size_t count, float factor) {
  device::enter_kernel();
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    data[i] = T(float(data[i]) * factor);
}

template <typename T>
void launch(void* data, size_t count, float factor, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const size_t blocks = (count + kThreads - 1) / kThreads;
  scale<T><<<static_cast<unsigned>(blocks < 1024 ? blocks : 1024), kThreads, 0, stream>>>(static_cast<T*>(data), count,
                                                                                          factor);
  SYMMEM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void launch_scale(void* data, size_t count, DataType type, float factor, cudaStream_t stream) {
  if (count == 0) return;
  switch (type) {
    case DataType::kFloat32: return launch<float>(data, count, factor, stream);
    case DataType::kFloat16: return launch<__half>(data, count, factor, stream);
    case DataType::kBFloat16: return launch<__nv_bfloat16>(data, count, factor, stream);
    default: SYMMEM_THROW(ErrorCode::kInvalidArgument, std::string("no average of ") + dtype_name(type));
  }
}

}  // namespace symmem::nccl
