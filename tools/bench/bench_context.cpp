#include "bench_context.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <stdexcept>

#include "common/env.hpp"

#ifndef SYMMEM_GIT_COMMIT
#define SYMMEM_GIT_COMMIT "unknown"
#endif

namespace symmem::bench {

BenchContext::BenchContext(const Args& args) : args_(args) {
  JobInfo job = JobInfo::from_env();
  BENCH_CUDA_CHECK(cudaSetDevice(job.local_rank));
  auto bootstrap = make_store_bootstrap(job);
  comm_ = Communicator::create(bootstrap, job.local_rank);
  BENCH_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  BENCH_CUDA_CHECK(cudaEventCreate(&start_));
  BENCH_CUDA_CHECK(cudaEventCreate(&stop_));
  cudaDeviceProp prop{};
  BENCH_CUDA_CHECK(cudaGetDeviceProperties(&prop, job.local_rank));
  gpu_name_ = prop.name;
  if (args.nccl) {
    nccl_ = init_nccl(NCCL_CTA_POLICY_DEFAULT, 0);
    nccl_sym_ = init_nccl(NCCL_CTA_POLICY_DEFAULT, 0);
    nccl_ce_ = init_nccl(NCCL_CTA_POLICY_ZERO, 0);
  }
}

BenchContext::~BenchContext() {
  cudaStreamSynchronize(stream_);
  release_windows();
  for (auto& [c, comm] : nccl_ctas_) ncclCommDestroy(comm);
  if (nccl_ce_) ncclCommDestroy(nccl_ce_);
  if (nccl_sym_) ncclCommDestroy(nccl_sym_);
  if (nccl_) ncclCommDestroy(nccl_);
  try {
    comm_->close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "symmem-bench: close: %s\n", e.what());
  }
  cudaEventDestroy(start_);
  cudaEventDestroy(stop_);
  cudaStreamDestroy(stream_);
}

Meta BenchContext::meta() const {
  Meta m;
  m.gpu = gpu_name_;
  m.commit = env::get_string("SYMMEM_COMMIT", SYMMEM_GIT_COMMIT);
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  m.date = date;
  m.command = "symmem-bench " + args_.command_line;
  m.world = world();
  return m;
}

ncclUniqueId BenchContext::make_unique_id() {
  ncclUniqueId id{};
  if (rank() == 0) BENCH_NCCL_CHECK(ncclGetUniqueId(&id));
  std::vector<ncclUniqueId> all(world());
  comm_->bootstrap().all_gather(&id, all.data(), sizeof(id));
  return all[0];
}

ncclComm_t BenchContext::init_nccl(int cta_policy, int ctas) {
  ncclUniqueId id = make_unique_id();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.CTAPolicy = cta_policy;
  if (ctas > 0) {
    config.minCTAs = ctas;
    config.maxCTAs = ctas;
  }
  ncclComm_t comm = nullptr;
  BENCH_NCCL_CHECK(ncclCommInitRankConfig(&comm, world(), id, rank(), &config));
  return comm;
}

ncclComm_t BenchContext::nccl_with_ctas(int ctas) {
  auto it = nccl_ctas_.find(ctas);
  if (it != nccl_ctas_.end()) return it->second;
  return nccl_ctas_[ctas] = init_nccl(NCCL_CTA_POLICY_DEFAULT, ctas);
}

bool BenchContext::register_window(ncclComm_t comm, void* p, size_t bytes) {
  auto key = std::make_pair(comm, p);
  if (windows_.count(key)) return true;
  ncclWindow_t win = nullptr;
  ncclResult_t r = ncclCommWindowRegister(comm, p, bytes, &win, NCCL_WIN_COLL_SYMMETRIC);
  // Registration is collective; every rank gets the same answer for the same heap buffers.
  if (r != ncclSuccess) return false;
  windows_[key] = win;
  return true;
}

void BenchContext::release_windows() {
  BENCH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (auto& [key, win] : windows_) ncclCommWindowDeregister(key.first, win);
  windows_.clear();
}

double BenchContext::slowest(double mine) {
  std::vector<double> all(world());
  comm_->bootstrap().all_gather(&mine, all.data(), sizeof(double));
  return *std::max_element(all.begin(), all.end());
}

long BenchContext::sum_over_ranks(long mine) {
  std::vector<long> all(world());
  comm_->bootstrap().all_gather(&mine, all.data(), sizeof(long));
  long total = 0;
  for (long v : all) total += v;
  return total;
}

bool BenchContext::same_on_all_ranks(uint64_t value) {
  std::vector<uint64_t> all(world());
  comm_->bootstrap().all_gather(&value, all.data(), sizeof(uint64_t));
  return std::all_of(all.begin(), all.end(), [&](uint64_t v) { return v == all[0]; });
}

void BenchContext::progress(const std::string& what) const {
  if (comm_->rank() == 0) std::fprintf(stderr, "symmem-bench: %s\n", what.c_str());
}

double BenchContext::time_us(const Launch& launch, bool graph) {
  for (int i = 0; i < args_.warmup; ++i) launch(stream_);
  BENCH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  comm_->check();
  cudaGraphExec_t exec = nullptr;
  if (graph) {
    cudaGraph_t g = nullptr;
    BENCH_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < args_.iters; ++i) launch(stream_);
    BENCH_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    BENCH_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    BENCH_CUDA_CHECK(cudaGraphDestroy(g));
    BENCH_CUDA_CHECK(cudaGraphLaunch(exec, stream_));  // upload and warm the graph
    BENCH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  std::vector<double> batches;
  for (int b = 0; b < 3; ++b) {
    host_barrier();
    comm_->barrier(stream_);  // line the ranks up on the device
    BENCH_CUDA_CHECK(cudaEventRecord(start_, stream_));
    if (graph)
      BENCH_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    else
      for (int i = 0; i < args_.iters; ++i) launch(stream_);
    BENCH_CUDA_CHECK(cudaEventRecord(stop_, stream_));
    BENCH_CUDA_CHECK(cudaEventSynchronize(stop_));
    float ms = 0;
    BENCH_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
    batches.push_back(ms * 1000.0 / args_.iters);
  }
  if (exec) BENCH_CUDA_CHECK(cudaGraphExecDestroy(exec));
  comm_->check();
  std::sort(batches.begin(), batches.end());
  return slowest(batches[1]);
}

uint64_t seed_for(int rank, size_t bytes, int salt) {
  return (uint64_t(rank + 1) * 0x9E3779B97F4A7C15ull) ^ (uint64_t(bytes) * 0xBF58476D1CE4E5B9ull) ^
         (uint64_t(salt) << 48);
}

static uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<uint8_t> host_data(size_t count, DataType type, uint64_t seed, Fill fill) {
  const size_t elem = dtype_size(type);
  std::vector<uint8_t> out(count * elem);
  uint64_t state = seed;
  if (fill == Fill::kBits) {
    size_t i = 0;
    for (; i + 8 <= out.size(); i += 8) {
      const uint64_t v = splitmix(state);
      std::memcpy(out.data() + i, &v, 8);
    }
    const uint64_t v = splitmix(state);
    std::memcpy(out.data() + i, &v, out.size() - i);
    return out;
  }
  for (size_t i = 0; i < count; ++i) {
    const int v = static_cast<int>(splitmix(state) % 32) - 16;
    uint8_t* p = out.data() + i * elem;
    switch (type) {
      case DataType::kFloat32: {
        float f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case DataType::kFloat16: {
        __half h = __float2half(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        __nv_bfloat16 h = __float2bfloat16(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kInt32: {
        int32_t x = v;
        std::memcpy(p, &x, 4);
        break;
      }
      case DataType::kUInt8: *p = static_cast<uint8_t>(v + 16); break;
    }
  }
  return out;
}

void upload(void* device, const std::vector<uint8_t>& host, cudaStream_t stream) {
  BENCH_CUDA_CHECK(cudaMemcpyAsync(device, host.data(), host.size(), cudaMemcpyHostToDevice, stream));
  BENCH_CUDA_CHECK(cudaStreamSynchronize(stream));
}

std::vector<uint8_t> download(const void* device, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  BENCH_CUDA_CHECK(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost));
  return host;
}

void poison(void* device, size_t bytes, cudaStream_t stream) {
  BENCH_CUDA_CHECK(cudaMemsetAsync(device, 0xFF, bytes, stream));
}

uint64_t hash_bytes(const std::vector<uint8_t>& bytes) {
  uint64_t h = 1469598103934665603ull;
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    h = (h ^ w) * 1099511628211ull;
  }
  for (; i < bytes.size(); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return h;
}

}  // namespace symmem::bench
