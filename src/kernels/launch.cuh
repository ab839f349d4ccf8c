// Every SM kernel of symmem is launched here: with programmatic stream serialization (PDL,
// device/dependent_launch.cuh) unless SYMMEM_PDL=0, and with the launch's own error checked.
#pragma once

#include <cuda_runtime.h>

#include "common/check.hpp"
#include "common/env.hpp"

namespace symmem::detail {

// Read once: the environment is fixed for the process, and this runs on every call's hot path.
inline bool programmatic_launch() {
  static const bool enabled = env::programmatic_launch();
  return enabled;
}

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
