// Every SM kernel of symmem is launched here: with programmatic stream serialization (PDL,
// device/dependent_launch.cuh) unless SYMMEM_PDL=0, and with the launch's own error checked.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "common/check.hpp"
#include "common/env.hpp"

namespace symmem::detail {

// Read once: the environment is fixed for the process, and this runs on every call's hot path.
inline bool programmatic_launch() {
  static const bool enabled = env::programmatic_launch();
  return enabled;
}

// A kernel's dynamic shared memory limit, raised once per device (the attribute is per device:
// a process driving several GPUs raises it on each). One instance per kernel (a static at its
// launcher).
class DynamicSharedLimit {
 public:
  template <typename Kernel>
  void raise(Kernel kernel, size_t bytes) {
    int device = 0;
    SYMMEM_CUDA_CHECK(cudaGetDevice(&device));
    const uint64_t bit = uint64_t(1) << (device & 63);
    if (raised_.load(std::memory_order_acquire) & bit) return;
    SYMMEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    raised_.fetch_or(bit, std::memory_order_acq_rel);
  }

 private:
  std::atomic<uint64_t> raised_{0};
};

template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), int blocks, int threads, size_t shared_bytes, cudaStream_t stream,
                   const Args&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = programmatic_launch() ? 1 : 0;
  const cudaError_t launched = cudaLaunchKernelEx(&config, kernel, args...);
  // A failed launch also sets the runtime's last error: clear it before throwing, or the caller's
  // next unrelated launch check (torch's, after catching our exception) would report it.
  if (launched != cudaSuccess) (void)cudaGetLastError();
  SYMMEM_CUDA_CHECK(launched);
}

}  // namespace symmem::detail
