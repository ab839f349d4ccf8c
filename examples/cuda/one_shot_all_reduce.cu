// A user kernel on symmem's heap, written against the public headers only (symmem/symmem.hpp,
// symmem/user_call.hpp, symmem/device.cuh): a one-shot all-reduce of floats. Every rank reads every
// peer's copy of a symmetric buffer and sums in rank order, so its result is bit-identical to
// symmem's own one-shot all-reduce, which the program checks.
//
//   symmem-run -n 2 symmem_example_one_shot_all_reduce          one process per GPU
//   SYMMEM_TEST_SHARED_GPU=1 symmem_example_one_shot_all_reduce --threads 4   ranks as threads of one GPU
//   ... --dead-rank        the last rank never launches: every other rank must fail naming it
//
// Exit status: 0 when every rank matched (or, with --dead-rank, every live rank raised kTimeout
// naming the dead rank in time), 1 otherwise, 77 without a GPU.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "symmem/device.cuh"
#include "symmem/symmem.hpp"
#include "symmem/user_call.hpp"

namespace {

__global__ void one_shot_all_reduce(symmem::Buffer::DeviceHandle in, float* out, size_t n, symmem::UserSync sync) {
  const uint32_t epoch = symmem::dev::epoch_begin(sync);
  // Every rank's input is written (each rank's stream reached this call).
  if (!symmem::dev::barrier(sync, epoch, 0)) return;
  const float* mine = static_cast<const float*>(in.local);
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += gridDim.x * size_t(blockDim.x)) {
    float sum = *symmem::dev::peer_ptr(in, mine + i, 0);
    for (int p = 1; p < in.world; ++p) sum += *symmem::dev::peer_ptr(in, mine + i, p);
    out[i] = sum;
  }
  // No peer reads this rank's input any more: the caller may overwrite it.
  if (symmem::dev::barrier(sync, epoch, 1)) symmem::dev::epoch_commit(sync, epoch);
}

#define CHECK_CUDA(call)                                                                          \
  do {                                                                                            \
    cudaError_t e = (call);                                                                       \
    if (e != cudaSuccess) throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(e)); \
  } while (0)

struct Options {
  int threads = 0;  // ranks as threads of one process (0: one process per rank, from the environment)
  bool dead_rank = false;
  size_t count = (size_t(1) << 20) + 3;
  int blocks = 8;
  int calls = 5;
};

// One rank: returns "" on success, else what went wrong.
std::string run_rank(std::shared_ptr<symmem::Bootstrap> bootstrap, int device, const Options& o) {
  CHECK_CUDA(cudaSetDevice(device));
  symmem::CommConfig config;
  config.workspace_bytes = size_t(64) << 20;
  config.timeout_ms = o.dead_rank ? 2000 : 20000;
  auto comm = symmem::Communicator::create(bootstrap, device, config);
  const int rank = comm->local_rank(), world = comm->local_world();
  const bool dead = o.dead_rank && rank == world - 1;
  const size_t bytes = o.count * sizeof(float);
  symmem::Buffer* in = comm->allocate(bytes);
  float *out = nullptr, *expected = nullptr;
  CHECK_CUDA(cudaMalloc(&out, bytes));
  CHECK_CUDA(cudaMalloc(&expected, bytes));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<float> host(o.count), got(o.count), want(o.count);
  std::string failure;
  for (int call = 0; call < o.calls && failure.empty(); ++call) {
    for (size_t i = 0; i < o.count; ++i)  // values whose sums round: the order must match
      host[i] = 1.0f / float(1 + (i * 7 + size_t(rank) * 13 + call) % 1000) + float(rank) * 1e-3f;
    CHECK_CUDA(cudaMemcpyAsync(in->ptr(), host.data(), bytes, cudaMemcpyHostToDevice, stream));
    CHECK_CUDA(cudaMemsetAsync(out, 0xFF, bytes, stream));  // poison (NaN)
    bootstrap->barrier();
    const auto start = std::chrono::steady_clock::now();
    try {
      if (!dead) {
        const std::string what = "example:one_shot_all_reduce(count=" + std::to_string(o.count) + ", float32)";
        // A call of the communicator: ordered, signed and logged; then the kernel; then its end.
        const symmem::UserSync sync = symmem::begin_user_call(*comm, what, o.blocks, stream);
        one_shot_all_reduce<<<o.blocks, 256, 0, stream>>>(in->device_handle(), out, o.count, sync);
        CHECK_CUDA(cudaGetLastError());
        symmem::end_user_call(*comm, stream);
      }
      comm->synchronize(stream);
      if (o.dead_rank && !dead) failure = "the call returned although rank " + std::to_string(world - 1) + " never came";
    } catch (const symmem::Error& e) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const std::string dead_name = "rank " + std::to_string(world - 1);
      if (!o.dead_rank) {
        failure = e.what();
      } else if (!dead && (e.code() != symmem::ErrorCode::kTimeout || !std::strstr(e.what(), dead_name.c_str()) ||
                           seconds > 2.0 + 2.0)) {
        failure = "expected kTimeout naming " + dead_name + " within 4 s, got (" + std::to_string(seconds) + " s) " +
                  e.what();
      } else {
        std::printf("rank %d: %.2f s: %s\n", rank, seconds, e.what());
      }
    }
    if (o.dead_rank) {
      // The CUDA context is intact: an ordinary copy still works after the failure.
      CHECK_CUDA(cudaMemcpy(got.data(), in->ptr(), sizeof(float), cudaMemcpyDeviceToHost));
      break;
    }
    if (!failure.empty()) break;
    symmem::CollectiveOptions one_shot;
    one_shot.algo = symmem::Algo::kOneShot;
    symmem::all_reduce(symmem::Operand(expected), symmem::Operand(*in), o.count, symmem::DataType::kFloat32,
                       symmem::ReduceOp::kSum, *comm, stream, one_shot);
    comm->synchronize(stream);
    CHECK_CUDA(cudaMemcpy(got.data(), out, bytes, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(want.data(), expected, bytes, cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t i = 0; i < o.count; ++i) wrong += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
    if (wrong) failure = std::to_string(wrong) + " elements differ from symmem's one-shot all-reduce at call " +
                         std::to_string(call);
  }
  bootstrap->barrier();  // nobody tears down while a peer's kernel may still wait
  comm->close();
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaFree(expected));
  return failure;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) o.threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--dead-rank")) o.dead_rank = true;
    else if (!std::strcmp(argv[i], "--count") && i + 1 < argc) o.count = std::strtoull(argv[++i], nullptr, 10);
    else {
      std::fprintf(stderr, "usage: %s [--threads W] [--dead-rank] [--count N]\n", argv[0]);
      return 2;
    }
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::printf("no GPU: skipped\n");
    return 77;
  }
  std::vector<std::string> failures;
  try {
    if (o.threads > 0) {
      auto group = symmem::make_thread_group(o.threads, 120000);
      failures.resize(o.threads);
      std::vector<std::thread> threads;
      for (int r = 0; r < o.threads; ++r)
        threads.emplace_back([&, r] {
          try {
            failures[r] = run_rank(symmem::make_thread_bootstrap(group, r), 0, o);
          } catch (const std::exception& e) {
            failures[r] = e.what();
          }
        });
      for (auto& t : threads) t.join();
    } else {
      const symmem::JobInfo job = symmem::JobInfo::from_env();
      failures.push_back(run_rank(symmem::make_store_bootstrap(job), job.local_rank, o));
    }
  } catch (const std::exception& e) {
    failures.push_back(e.what());
  }
  int failed = 0;
  for (size_t r = 0; r < failures.size(); ++r)
    if (!failures[r].empty()) std::fprintf(stderr, "rank %zu: %s\n", r, failures[r].c_str()), ++failed;
  std::printf("one_shot_all_reduce example: %s\n", failed ? "FAILED" : "ok");
  return failed ? 1 : 0;
}
