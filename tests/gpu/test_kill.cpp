// A rank killed in the middle of a loop of collectives (a real SIGKILL, not a rank that merely
// stops calling): every survivor must raise a symmem::Error (kTimeout, or kAborted where another
// survivor's failure came first) naming the dead rank, within the deadline plus a few seconds of
// the kill, and must then be able to release its communicator.
//
//   symmem-run -n 2 --expect-killed 1 symmem_kill_tests sm|low_latency|copy_engine|graph
//
// Paths: sm (pull all-gather and two-shot all-reduce, alternating), low_latency (low-latency
// all-reduce, all-gather and reduce-scatter in turn), copy_engine (copy-engine all-gather), graph (a CUDA graph of the SM calls,
// replayed), hierarchical (the hierarchical all-gather under --simulate-nodes 2: the dead rank is on
// another node, behind NCCL). ctest runs each with and without CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue
// for every stream, where a wait on one stream can block the others).
//
// A separate program from symmem_gpu_tests: the dead rank cannot take part in the cross-rank
// agreement of that harness, and a dead process would end its job. Each rank reports through its
// exit code: survivors 0 when they saw the right error in time; the last rank dies by SIGKILL,
// which the launcher is told to expect. Exit code 77 (skipped) with fewer than two GPUs.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "api_compat.hpp"
#include "multicast_off.hpp"
#include "symmem/symmem.hpp"

using namespace symmem;
using namespace symmem::test;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kTimeoutMs = 3000;
constexpr double kSlackSeconds = 10;
constexpr int kSyncEvery = 8;
// The dead rank raises SIGKILL right after enqueueing this call, three calls after its last
// synchronisation: its GPU still has work in flight.
constexpr int kKillAfter = kSyncEvery * 25 + 3;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e));
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Runs the loop of `path` on this rank; returns the exit code (the dead rank never returns).
int run(const std::string& path) {
  const JobInfo job = JobInfo::from_env();
  check_cuda(cudaSetDevice(job.local_rank), "cudaSetDevice");
  // Never destroyed: rank 0's store would wait (until its timeout) for the dead rank to say
  // goodbye. The process leaves with _exit once it has reported; the launcher reaps it.
  static std::shared_ptr<Bootstrap>* const kept = new std::shared_ptr<Bootstrap>(make_store_bootstrap(job));
  Bootstrap& bootstrap = **kept;
  auto comm = Communicator::create(*kept, job.local_rank, make_config(kTimeoutMs));
  const int rank = comm->rank(), world = comm->world(), dead = world - 1;
  constexpr size_t kGatherBytes = size_t(1) << 20;  // per rank
  constexpr size_t kReduceCount = size_t(1) << 18;  // fp32
  constexpr size_t kLowLatencyCount = 4096;         // fp32
  Buffer* in = comm->allocate(kGatherBytes);
  Buffer* out = comm->allocate(kGatherBytes * world);
  check_cuda(cudaMemset(in->ptr(), 0x11 * (rank + 1), kGatherBytes), "cudaMemset");
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");

  CollectiveOptions pull, two_shot, low_latency, copy_engine;
  pull.algo = Algo::kPull;
  two_shot.algo = Algo::kTwoShot;
  low_latency.algo = Algo::kLowLatency;
  copy_engine.algo = Algo::kCopyEngine;
  auto sm_call = [&](int i) {
    if (i % 2 == 0)
      all_gather(sym(out), sym(in), kGatherBytes, DataType::kUInt8, *comm, stream, pull);
    else
      all_reduce(sym(out), sym(in), kReduceCount, DataType::kFloat32, ReduceOp::kSum, *comm, stream, two_shot);
  };
  cudaGraphExec_t graph = nullptr;
  if (path == "graph") {
    if (kWarmUpBeforeCapture) {
      sm_call(0);
      sm_call(1);
      comm->synchronize(stream);
    }
    cudaGraph_t g = nullptr;
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    sm_call(0);
    sm_call(1);
    check_cuda(cudaStreamEndCapture(stream, &g), "cudaStreamEndCapture");
    check_cuda(cudaGraphInstantiate(&graph, g, 0), "cudaGraphInstantiate");
    cudaGraphDestroy(g);
  }
  std::function<void(int)> step;
  if (path == "sm") {
    step = sm_call;
  } else if (path == "low_latency") {
    // The three low-latency collectives in turn (they share one receive area).
    step = [&](int i) {
      if (i % 3 == 0)
        all_reduce(sym(out), sym(in), kLowLatencyCount, DataType::kFloat32, ReduceOp::kSum, *comm, stream,
                   low_latency);
      else if (i % 3 == 1)
        all_gather(sym(out), sym(in), kLowLatencyCount * 4, DataType::kUInt8, *comm, stream, low_latency);
      else
        reduce_scatter(sym(out), sym(in), kLowLatencyCount / world, DataType::kFloat32, ReduceOp::kSum, *comm, stream,
                       low_latency);
    };
#if !SYMMEM_TEST_OLD_API  // (the negative control's old API has no hierarchical all-gather)
  } else if (path == "hierarchical") {
    // Under symmem-run --simulate-nodes 2: the dead rank is on another node, behind NCCL.
    CollectiveOptions hierarchical;
    hierarchical.algo = Algo::kHierarchical;
    step = [&, hierarchical](int) {
      all_gather(sym(out), sym(in), kGatherBytes, DataType::kUInt8, *comm, stream, hierarchical);
    };
#endif
  } else if (path == "copy_engine") {
    step = [&](int) { all_gather(sym(out), sym(in), kGatherBytes, DataType::kUInt8, *comm, stream, copy_engine); };
  } else {
    step = [&](int) { check_cuda(cudaGraphLaunch(graph, stream), "cudaGraphLaunch"); };
  }

  // Every rank is ready before the loop: nothing after this point goes through the bootstrap.
  bootstrap.barrier();
  // Every synchronisation that succeeds proves the dead rank was alive when its GPU joined those
  // calls, so the kill came after it: the time since then bounds the time since the kill.
  Clock::time_point last_success = Clock::now();
  std::string message;
  ErrorCode code = ErrorCode::kInternal;
  int calls = 0;
  bool raised = false;
  for (int i = 0;; ++i) {
    if (rank == dead && i == kKillAfter) {
      std::printf("rank %d: raising SIGKILL after %d calls (%s path)\n", rank, i, path.c_str());
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
    try {
      step(i);
      ++calls;
      if ((i + 1) % kSyncEvery == 0) {
        comm->synchronize(stream);
        last_success = Clock::now();
      }
    } catch (const Error& e) {
      raised = true;
      message = e.what();
      code = e.code();
      break;
    }
    if (seconds_since(last_success) > kTimeoutMs / 1000.0 + 2 * kSlackSeconds) break;
  }
  const double seconds = seconds_since(last_success);
  int failures = 0;
  auto problem = [&](const std::string& what) {
    ++failures;
    std::printf("[ FAIL ] kill %s: rank %d: %s\n", path.c_str(), rank, what.c_str());
  };
  if (!raised) {
    problem("no error within " + std::to_string(seconds) + " s of the last successful call; " + std::to_string(calls) +
            " calls enqueued");
  } else {
    if (calls < kKillAfter - kSyncEvery) problem("failed before the kill, after " + std::to_string(calls) + " calls");
    if (code != ErrorCode::kTimeout && code != ErrorCode::kAborted)
      problem(std::string("raised ") + error_code_name(code) + " instead of timeout or aborted");
    if (message.find("rank " + std::to_string(dead)) == std::string::npos)
      problem("the message does not name the dead rank " + std::to_string(dead));
    if (seconds > kTimeoutMs / 1000.0 + kSlackSeconds)
      problem("raised " + std::to_string(seconds) + " s after the last successful call (deadline " +
              std::to_string(kTimeoutMs) + " ms + " + std::to_string(static_cast<int>(kSlackSeconds)) + " s)");
    // The communicator is unusable now: every later call fails at once.
    const auto again = Clock::now();
    try {
      step(0);
      comm->synchronize(stream);
      problem("a call after the failure succeeded");
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kAborted) problem(std::string("a call after the failure raised ") + e.what());
    }
    if (seconds_since(again) > 1)
      problem("a call after the failure took " + std::to_string(seconds_since(again)) + " s");
  }
  std::printf("rank %d: %s after %d calls, %.1f s after the last successful synchronisation: %s\n", rank,
              raised ? error_code_name(code) : "no error", calls, seconds, message.c_str());
  // Local release must finish too (the device waits have deadlines; nothing waits for the dead).
  const auto release = Clock::now();
  if (graph) cudaGraphExecDestroy(graph);
  comm.reset();
  cudaStreamDestroy(stream);
  if (seconds_since(release) > kSlackSeconds)
    problem("releasing the communicator took " + std::to_string(seconds_since(release)) + " s");
  if (failures == 0) std::printf("[   OK ] kill %s: rank %d\n", path.c_str(), rank);
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  symmem::test::keep_multicast_off();
  const std::string path = argc > 1 ? argv[1] : "";
  if (path != "sm" && path != "low_latency" && path != "copy_engine" && path != "graph" && path != "hierarchical") {
    std::fprintf(stderr, "usage: symmem-run -n 2 --expect-killed 1 %s sm|low_latency|copy_engine|graph|hierarchical\n",
                 argv[0]);
    return 2;
  }
  const int world = std::getenv("WORLD_SIZE") ? std::atoi(std::getenv("WORLD_SIZE")) : 1;
  int gpus = 0;
  const cudaError_t err = cudaGetDeviceCount(&gpus);
  if (err != cudaSuccess || gpus < 2 || world < 2 || gpus < world) {
    std::printf("skipped: needs 2 GPUs and 2 ranks (found %d GPU%s, %d rank%s%s%s)\n", err == cudaSuccess ? gpus : 0,
                gpus == 1 ? "" : "s", world, world == 1 ? "" : "s", err == cudaSuccess ? "" : "; ",
                err == cudaSuccess ? "" : cudaGetErrorString(err));
    return 77;
  }
  int rc = 1;
  try {
    rc = run(path);
  } catch (const std::exception& e) {
    std::printf("[ FAIL ] kill %s: %s\n", path.c_str(), e.what());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(rc);
}
