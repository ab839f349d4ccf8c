#include "host_cost_kernels.hpp"

#include "check.hpp"
#include "kernels/kernel_args.hpp"

namespace symmem::bench {
namespace {

__global__ void spin(uint64_t nanoseconds) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

__global__ void empty() {}

__global__ void empty_with_arguments(detail::AllReduceTwoShotArgs) {}

}  // namespace

void launch_spin(uint64_t nanoseconds, cudaStream_t stream) {
  spin<<<1, 1, 0, stream>>>(nanoseconds);
  BENCH_CUDA_CHECK(cudaGetLastError());
}

void launch_empty(cudaStream_t stream) {
  empty<<<1, 32, 0, stream>>>();
  BENCH_CUDA_CHECK(cudaGetLastError());
}

void launch_empty_like_symmem(bool pdl, cudaStream_t stream) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(16);
  config.blockDim = dim3(detail::kThreadsPerBlock);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = pdl ? 1 : 0;
  detail::AllReduceTwoShotArgs args{};
  BENCH_CUDA_CHECK(cudaLaunchKernelEx(&config, empty_with_arguments, args));
}

}  // namespace symmem::bench
