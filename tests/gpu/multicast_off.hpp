// Every GPU test program starts with this: NVLink multicast objects must never be created on the
// shared hosts these tests run on (they can take the GPUs out of service), by NCCL, PyTorch's
// symmetric memory or NVSHMEM. Values the caller already set are kept (as the three mains did before).
#pragma once

#include <cstdlib>

namespace symmem::test {

inline void keep_multicast_off() {
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 0);
  setenv("NVSHMEM_DISABLE_NVLS", "1", 0);
}

}  // namespace symmem::test
