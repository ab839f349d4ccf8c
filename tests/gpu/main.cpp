// GPU tests, one process per GPU: symmem-run -n N symmem_gpu_tests [filter].
// Without enough GPUs every rank prints why and exits 77 (ctest reports the test as skipped).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>

#include "fixture.hpp"
#include "multicast_off.hpp"
#include "test.hpp"

int main(int argc, char** argv) {
  symmem::test::keep_multicast_off();
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
  symmem::test::Fixture& fx = symmem::test::Fixture::get();
  const int rc = symmem::test::run_all(argc, argv, fx.rank() != 0);
  // Leave together: rank 0 hosts the store, and its bootstrap's destructor keeps serving until
  // every rank has left the last exchange (exiting with the fixture alive would not wait).
  try {
    fx.comm->close();
  } catch (const std::exception& e) {
    std::printf("close: %s\n", e.what());
  }
  fx.comm.reset();
  fx.bootstrap.reset();
  return rc;
}
