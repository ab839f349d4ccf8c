#include "comm/all_to_all_state.hpp"

#include <cuda_runtime_api.h>

#include "common/check.hpp"
#include "common/device_guard.hpp"

namespace symmem::detail {

AllToAllState::AllToAllState(int device) {
  DeviceGuard guard(device);
  SYMMEM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&table_), sizeof(AllToAllTable)));
  SYMMEM_CUDA_CHECK(cudaMemset(table_, 0, sizeof(AllToAllTable)));
  SYMMEM_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // (cudaMemset's legacy stream orders nothing else)
}

AllToAllState::~AllToAllState() {
  if (table_) SYMMEM_CUDA_CHECK_NOTHROW(cudaFree(table_));
}

}  // namespace symmem::detail
