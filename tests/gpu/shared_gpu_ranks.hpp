// The shared-GPU suites' harness (symmem_shared_gpu_tests, symmem_shared_gpu_moe_tests): W ranks as
// threads of this process sharing GPU 0 (SYMMEM_TEST_SHARED_GPU=1 lifts the one-rank-per-GPU
// rule), each with its own communicator and stream. Calls pass no SM budget: ranks sharing a GPU
// plan with sm_count / (2 ranks) SMs each (src/plan/shared_gpu.hpp), so that every rank's kernel,
// and the next one each launches early (PDL), are resident at once.
//
// Rules a body must keep (each was seen to hang the ranks when broken; docs/design.md, "Testing on
// one GPU"):
//   - allocate device memory (and heap buffers) before the first wait_for_every_rank and free it
//     after the last one: cudaFree waits for the GPU, which waits for a peer's kernel that waits for
//     this rank, whose launches the free holds up;
//   - use the rank's stream (non-blocking), never a device-wide synchronisation;
//   - synchronise every few dozen calls or graph replays (shared_gpu_window()): the ranks share one CUDA
//     context, whose launch queue a rank far ahead fills with work waiting for a rank behind, which
//     then cannot launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "symmem/symmem.hpp"

namespace symmem::test {

// Calls (or graph replays) a rank enqueues between two synchronisations of its stream, when each
// puts `launches` kernels or copies in the queue and `world` ranks share it: at most 50, and the
// ranks' pending launches together at most kSharedLaunchBudget (1000 replays of a 7-node MoE
// graph timed out at 4 and 8 ranks with 50 replays a window, 1400 and 2800 pending launches, and
// passed at 2 and 3, 700 and 1050). SYMMEM_SHARED_GPU_WINDOW=N forces N (1 tells a crowded launch
// queue from a protocol fault).
constexpr int kSharedLaunchBudget = 256;
int shared_gpu_window(int world, size_t launches);

struct SharedRank {
  int rank = 0;
  int world = 0;
  std::shared_ptr<Bootstrap> bootstrap;  // the communicator's, also the test's (it outlives a failure)
  std::unique_ptr<Communicator> comm;
  cudaStream_t stream = nullptr;
  virtual ~SharedRank();
  // Once the communicator exists, before the ranks' first barrier: what every case of a suite
  // needs (heap buffers are allocated collectively, so every rank allocates alike).
  virtual void set_up() {}
};

// SYMMEM_SHARED_GPU_WORLDS (default "2 3 4 8").
std::vector<int> shared_gpu_worlds();
// The calls' max_blocks: none (-1), as a caller that knows nothing of sharing the GPU passes (the
// planner's share keeps them resident); SYMMEM_SHARED_GPU_BLOCKS=N sets one (to tell a residency
// problem from a protocol one).
int max_blocks_for_calls();
// Returns once every rank of r's group got here (its bootstrap, which outlives a failure). A rank
// must not tear its communicator down while a peer's kernel still waits.
void wait_for_every_rank(SharedRank& r);

// Runs body(rank) on `world` threads, each with its own communicator on device 0 (timeout_ms,
// workspace_bytes) and its R (SharedRank or a type derived from it, made before the communicator;
// set_up() runs once it exists), after every rank's set-up; closes the communicators unless the
// body released them (comm.reset() after a failure), then destroys the ranks. Rethrows the first
// rank's failure as a Failure.
void run_rank_threads(int world, const std::function<std::unique_ptr<SharedRank>()>& make,
                      const std::function<void(SharedRank&)>& body, int64_t timeout_ms, size_t workspace_bytes);

template <typename R = SharedRank, typename Body>
void run_shared_ranks(int world, const Body& body, int64_t timeout_ms = 20000,
                      size_t workspace_bytes = size_t(64) << 20) {
  run_rank_threads(
      world, [] { return std::unique_ptr<SharedRank>(new R()); }, [&](SharedRank& r) { body(static_cast<R&>(r)); },
      timeout_ms, workspace_bytes);
}

// Captures record() on r's stream, replays the graph `replays` times, synchronising every
// shared_gpu_window(world, graph nodes) replays (the shared launch queue; nothing of the call
// needs it), and waits for it.
void replay_captured(SharedRank& r, const std::function<void()>& record, int replays);

// Main of a shared-GPU suite: keeps multicast off, sets the environment the ranks need before
// CUDA starts (CUDA_DEVICE_MAX_CONNECTIONS=32, eager module loading, one copy-engine stream),
// skips (exit 77) without a GPU, runs the cases.
int shared_gpu_main(int argc, char** argv);

}  // namespace symmem::test
