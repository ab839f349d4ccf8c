#include "shared_gpu_ranks.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>

#include "device_memory.hpp"
#include "multicast_off.hpp"
#include "test.hpp"

namespace symmem::test {

SharedRank::~SharedRank() {
  if (stream) cudaStreamDestroy(stream);
}

std::vector<int> shared_gpu_worlds() {
  const char* text = std::getenv("SYMMEM_SHARED_GPU_WORLDS");
  std::istringstream in(text && *text ? text : "2 3 4 8");
  std::vector<int> result;
  for (int w; in >> w;)
    if (w >= 2 && w <= 8) result.push_back(w);
  return result;
}

int max_blocks_for_calls() {
  const char* forced = std::getenv("SYMMEM_SHARED_GPU_BLOCKS");
  if (forced && *forced) return std::max(1, std::atoi(forced));
  return -1;
}

int shared_gpu_window(int world, size_t launches) {
  static const int forced = [] {
    const char* text = std::getenv("SYMMEM_SHARED_GPU_WINDOW");
    return text && *text ? std::max(1, std::atoi(text)) : 0;
  }();
  if (forced) return forced;
  const size_t pending_per_window = size_t(std::max(world, 1)) * std::max<size_t>(launches, 1);
  return int(std::clamp<size_t>(kSharedLaunchBudget / pending_per_window, 1, 50));
}

void wait_for_every_rank(SharedRank& r) { r.bootstrap->barrier(); }

void run_rank_threads(int world, const std::function<std::unique_ptr<SharedRank>()>& make,
                      const std::function<void(SharedRank&)>& body, int64_t timeout_ms, size_t workspace_bytes) {
  auto group = make_thread_group(world, 120000);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        TEST_CUDA(cudaSetDevice(0));
        std::unique_ptr<SharedRank> rank = make();
        rank->rank = r;
        rank->world = world;
        TEST_CUDA(cudaStreamCreateWithFlags(&rank->stream, cudaStreamNonBlocking));
        CommConfig config;
        config.timeout_ms = timeout_ms;
        config.workspace_bytes = workspace_bytes;
        rank->bootstrap = make_thread_bootstrap(group, r);
        rank->comm = Communicator::create(rank->bootstrap, 0, config);
        rank->set_up();
        // Nobody launches before everybody is set up: a rank still allocating (which may wait for
        // the shared GPU to be idle) would stall a peer whose first call already waits for it.
        wait_for_every_rank(*rank);
        body(*rank);
        TEST_CUDA(cudaStreamSynchronize(rank->stream));
        wait_for_every_rank(*rank);
        if (rank->comm) rank->comm->close();  // (a test may have released a failed one)
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  // Every rank's error, not only the first: a rank that failed first often leaves its peers
  // timing out later, and which rank saw what is the diagnosis.
  std::string failures;
  for (int r = 0; r < world; ++r)
    if (!errors[r].empty())
      failures += (failures.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + errors[r]);
  if (!failures.empty()) throw Failure("world " + std::to_string(world) + ", " + failures);
}

void replay_captured(SharedRank& r, const std::function<void()>& record, int replays) {
  CapturedGraph graph(r.stream, record);
  const int window = shared_gpu_window(r.world, graph.nodes());
  for (int i = 0; i < replays; ++i) {
    graph.launch(r.stream);
    if ((i + 1) % window == 0) r.comm->synchronize(r.stream);
  }
  r.comm->synchronize(r.stream);
}

int shared_gpu_main(int argc, char** argv) {
  keep_multicast_off();
  setenv("SYMMEM_TEST_SHARED_GPU", "1", 1);
  // Every rank's streams on their own hardware queue: a rank's work queued behind another's
  // waiting kernel (or stream wait) would wait for its own peer, until the deadline. Read when CUDA
  // starts: before the first CUDA call of the process.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  setenv("SYMMEM_CE_STREAMS", "1", 0);
  // Lazy loading loads a kernel at its first launch, which may wait for the context to be idle:
  // for a rank whose peer's kernel is already waiting for it, that is forever.
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  int gpus = 0;
  const cudaError_t err = cudaGetDeviceCount(&gpus);
  if (err != cudaSuccess || gpus < 1) {
    std::printf("SKIPPED: the shared-GPU tests need a CUDA GPU, found none (%s)\n",
                err == cudaSuccess ? "cudaGetDeviceCount" : cudaGetErrorString(err));
    std::printf("0 passed, 0 failed, 1 skipped\n");
    return 77;
  }
  return run_all(argc, argv);
}

}  // namespace symmem::test
