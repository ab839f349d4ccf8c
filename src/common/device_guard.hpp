// Makes `device` current for a scope and restores the previous device after it.
#pragma once

#include <cuda_runtime_api.h>

#include "common/check.hpp"

namespace symmem::detail {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    SYMMEM_CUDA_CHECK(cudaGetDevice(&previous_));
    switched_ = previous_ != device;
    if (switched_) SYMMEM_CUDA_CHECK(cudaSetDevice(device));
  }
  // Restores only what it changed: every collective passes through here, and the usual caller is
  // already on the communicator's device.
  ~DeviceGuard() {
    if (switched_) SYMMEM_CUDA_CHECK_NOTHROW(cudaSetDevice(previous_));
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace symmem::detail
