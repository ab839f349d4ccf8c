// W ranks as threads of this process sharing GPU 0 (SYMMEM_TEST_SHARED_GPU=1 lifts the
// one-rank-per-GPU rule), each with its own communicator and stream, for suites that test the
// multi-rank protocols on a one-GPU machine. Every call must be held to block_budget(world) blocks
// so that every rank's kernels, and the next one each launches early (PDL), are resident at once.
//
// Rules a body must keep: allocate device memory (and heap buffers) before the first
// wait_for_every_rank and free it after the last one (cudaFree waits for the GPU, which would wait
// for a peer's kernel that waits for this rank); use the rank's stream (non-blocking), never a
// device-wide synchronisation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "symmem/symmem.hpp"

namespace symmem::test {

struct SharedRank {
  int rank = 0;
  int world = 0;
  std::shared_ptr<Bootstrap> bootstrap;  // the communicator's, also the test's (it outlives a failure)
  std::unique_ptr<Communicator> comm;
  cudaStream_t stream = nullptr;
  ~SharedRank();
};

// SYMMEM_SHARED_GPU_WORLDS (default "2 3 4 8").
std::vector<int> shared_gpu_worlds();
// sm_count / (2 world), or SYMMEM_SHARED_GPU_BLOCKS.
int block_budget(int world);
// Returns once every rank of r's group got here.
void wait_for_every_rank(SharedRank& r);

// Runs body(rank) on `world` threads, each with its own communicator on device 0 (timeout_ms,
// workspace_bytes); the body allocates, then calls wait_for_every_rank before its first call.
// Closes the communicators unless the body released them (comm.reset() after a failure).
// Rethrows the first rank's failure as a Failure.
void run_shared_ranks(int world, const std::function<void(SharedRank&)>& body, int64_t timeout_ms = 20000,
                      size_t workspace_bytes = size_t(64) << 20);

// Main of a shared-GPU suite: keeps multicast off, sets the environment the ranks need, skips
// (exit 77) without a GPU, runs the cases.
int shared_gpu_main(int argc, char** argv);

}  // namespace symmem::test
