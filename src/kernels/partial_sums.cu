// The sum of matmul_reduce_scatter's float32 partial products (kernel_args.hpp): 8 elements per
// thread and step, two 16-byte loads per source, one 16-byte store.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/check.hpp"
#include "device/dependent_launch.cuh"
#include "kernels/kernel_args.hpp"
#include "kernels/launch.cuh"

namespace symmem::detail {
namespace {

__device__ __forceinline__ uint32_t pack(float a, float b, __half*) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pack(float a, float b, __nv_bfloat16*) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <typename Out>
__global__ void __launch_bounds__(kThreadsPerBlock) partial_sums_kernel(PartialSumsArgs args) {
  device::enter_kernel();
  const size_t groups = args.count / 8;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t g = size_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    float4 lo = reinterpret_cast<const float4*>(args.sources[0])[2 * g];
    float4 hi = reinterpret_cast<const float4*>(args.sources[0])[2 * g + 1];
    for (int s = 1; s < args.world; ++s) {
      const float4 l = reinterpret_cast<const float4*>(args.sources[s])[2 * g];
      const float4 h = reinterpret_cast<const float4*>(args.sources[s])[2 * g + 1];
      lo.x += l.x, lo.y += l.y, lo.z += l.z, lo.w += l.w;
      hi.x += h.x, hi.y += h.y, hi.z += h.z, hi.w += h.w;
    }
    const uint4 packed{pack(lo.x, lo.y, static_cast<Out*>(nullptr)), pack(lo.z, lo.w, static_cast<Out*>(nullptr)),
                       pack(hi.x, hi.y, static_cast<Out*>(nullptr)), pack(hi.z, hi.w, static_cast<Out*>(nullptr))};
    reinterpret_cast<uint4*>(args.out)[g] = packed;
  }
}

}  // namespace

void launch_partial_sums(DataType type, const PartialSumsArgs& args, int sm_count, cudaStream_t stream) {
  if (args.count % 8 != 0)
    throw Error(ErrorCode::kInternal, "partial sums: count " + std::to_string(args.count) + " is not a multiple of 8");
  const size_t groups = args.count / 8;
  if (groups == 0) return;
  // Memory-bound: a few resident blocks per SM stream every source at full bandwidth.
  const size_t wanted = (groups + kThreadsPerBlock - 1) / kThreadsPerBlock;
  const int blocks = static_cast<int>(wanted < size_t(4) * sm_count ? wanted : size_t(4) * sm_count);
  switch (type) {
    case DataType::kFloat16:
      return launch_kernel(partial_sums_kernel<__half>, blocks, kThreadsPerBlock, 0, stream, args);
    case DataType::kBFloat16:
      return launch_kernel(partial_sums_kernel<__nv_bfloat16>, blocks, kThreadsPerBlock, 0, stream, args);
    default:
      throw Error(ErrorCode::kInvalidArgument, std::string("partial sums: no output type ") + dtype_name(type));
  }
}

}  // namespace symmem::detail
