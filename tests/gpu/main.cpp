// GPU tests, one process per GPU: symmem-run -n N symmem_gpu_tests [filter].
// Without enough GPUs every rank prints why and exits 77 (ctest reports the test as skipped).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "fixture.hpp"
#include "test.hpp"

int main(int argc, char** argv) {
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 0);
  setenv("NVSHMEM_DISABLE_NVLS", "1", 0);
  const int world = std::getenv("WORLD_SIZE") ? std::atoi(std::getenv("WORLD_SIZE")) : 1;
  int gpus = 0;
  const cudaError_t err = cudaGetDeviceCount(&gpus);
  if (err != cudaSuccess || gpus < world) {
    std::printf("SKIPPED: the GPU tests need %d CUDA GPU%s, found %d (%s)\n", world, world > 1 ? "s" : "",
                err == cudaSuccess ? gpus : 0, err == cudaSuccess ? "cudaGetDeviceCount" : cudaGetErrorString(err));
    std::printf("0 passed, 0 failed, 1 skipped\n");
    return 77;
  }
  try {
    symmem::test::Fixture::get();
  } catch (const std::exception& e) {
    std::printf("[ FAIL ] fixture: %s\n", e.what());
    return 1;
  }
  const bool quiet = symmem::test::Fixture::get().rank() != 0;
  return symmem::test::run_all(argc, argv, quiet);
}
