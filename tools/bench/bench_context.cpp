#include "bench_context.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <stdexcept>

#include "device_check.hpp"

#include "symmem_git_commit.h"  // SYMMEM_GIT_COMMIT, written at build time (cmake/git_commit.cmake)

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
  if (comm_->nodes() > 1) {
    line_up_comm_ = nccl_ ? nccl_ : init_nccl(NCCL_CTA_POLICY_DEFAULT, 0);
    BENCH_CUDA_CHECK(cudaMalloc(&line_up_, sizeof(float)));
    BENCH_CUDA_CHECK(cudaMemset(line_up_, 0, sizeof(float)));
  }
}

void BenchContext::device_barrier(cudaStream_t stream) {
  if (!line_up_comm_) {
    comm_->barrier(stream);
    return;
  }
  BENCH_NCCL_CHECK(ncclAllReduce(line_up_, line_up_, 1, ncclFloat, ncclSum, line_up_comm_, stream));
}

BenchContext::~BenchContext() {
  cudaStreamSynchronize(stream_);
  release_windows();
  for (auto& [c, comm] : nccl_ctas_) ncclCommDestroy(comm);
  if (nccl_ce_) ncclCommDestroy(nccl_ce_);
  if (nccl_sym_) ncclCommDestroy(nccl_sym_);
  if (nccl_) ncclCommDestroy(nccl_);
  if (line_up_comm_ && line_up_comm_ != nccl_) ncclCommDestroy(line_up_comm_);
  if (line_up_) cudaFree(line_up_);
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
  const char* commit = std::getenv("SYMMEM_COMMIT");  // set when the binary was built from another tree
  m.commit = commit && *commit ? commit : SYMMEM_GIT_COMMIT;
  char date[32];
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  m.date = date;
  std::vector<std::pair<std::string, std::string>> settings;
  for (const char* name : settings_that_change_a_run())
    if (const char* value = std::getenv(name); value && *value) settings.emplace_back(name, value);
  m.command = reproducing_command(settings, args_.command_line);
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

bool BenchContext::register_windows(ncclComm_t comm, const std::vector<std::pair<void*, size_t>>& ranges) {
  bool ok = comm != nullptr;
  for (const auto& [p, bytes] : ranges) {
    if (!ok) break;
    const auto key = std::make_pair(comm, p);
    if (windows_.count(key)) continue;
    ncclWindow_t win = nullptr;
    // Registration is collective; every rank gets the same answer for the same buffers.
    ok = ncclCommWindowRegister(comm, p, bytes, &win, NCCL_WIN_COLL_SYMMETRIC) == ncclSuccess;
    if (ok) windows_[key] = win;
  }
  return sum_over_ranks(ok ? 0 : 1) == 0;
}

void BenchContext::release_windows() {
  BENCH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  for (auto& [key, win] : windows_) ncclCommWindowDeregister(key.first, win);
  windows_.clear();
}

NcclMemory::NcclMemory(size_t bytes) : bytes_(bytes) { BENCH_NCCL_CHECK(ncclMemAlloc(&p_, bytes)); }

NcclMemory::~NcclMemory() {
  if (p_) ncclMemFree(p_);
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

long BenchContext::check_output(const Config& c) {
  BENCH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  comm_->check();
  long wrong = count_mismatches(c.out, c.expected, c.out_bytes, c.elem_bytes, stream_);
  wrong = sum_over_ranks(wrong);
  // Equal to the reference on every rank means equal bits everywhere; the fingerprint proves it
  // without trusting the reference (ranks that differ count at least one wrong element).
  if (c.same_on_every_rank && !same_on_all_ranks(fingerprint(c.out, c.out_bytes, stream_))) wrong = std::max(wrong, 1L);
  return wrong;
}

std::vector<Measurement> BenchContext::measure(const std::vector<Config>& configs, bool graph) {
  const size_t n = configs.size();
  const int reps = args_.reps;
  std::vector<Measurement> result(n);
  auto checked = [&](const Config& c) { return args_.check && c.out != nullptr; };
  auto poison_output = [&](const Config& c) {
    char* out = static_cast<char*>(c.out);
    const size_t keep_end = std::min(c.out_bytes, c.keep_offset + c.keep_bytes);
    if (c.keep_bytes == 0) {
      poison(out, c.out_bytes, stream_);
      return;
    }
    if (c.keep_offset > 0) poison(out, c.keep_offset, stream_);
    if (keep_end < c.out_bytes) poison(out + keep_end, c.out_bytes - keep_end, stream_);
  };
  // The first call of each configuration, checked alone: what warm-up would hide.
  for (size_t i = 0; i < n; ++i) {
    if (!checked(configs[i])) continue;
    poison_output(configs[i]);
    configs[i].launch(stream_);
    result[i].wrong = check_output(configs[i]);
  }
  for (const auto& c : configs)
    for (int w = 0; w < args_.warmup; ++w) c.launch(stream_);
  BENCH_CUDA_CHECK(cudaStreamSynchronize(stream_));
  comm_->check();
  std::vector<cudaGraphExec_t> execs(n, nullptr);
  if (graph) {
    for (size_t i = 0; i < n; ++i) {
      cudaGraph_t g = nullptr;
      BENCH_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      for (int k = 0; k < args_.iters; ++k) configs[i].launch(stream_);
      BENCH_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
      BENCH_CUDA_CHECK(cudaGraphInstantiate(&execs[i], g, 0));
      BENCH_CUDA_CHECK(cudaGraphDestroy(g));
      BENCH_CUDA_CHECK(cudaGraphLaunch(execs[i], stream_));  // upload and warm the graph
      BENCH_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    comm_->check();
  }
  // times[rep * n + i]: this rank's time per call of configuration i in repetition rep.
  std::vector<double> times(size_t(reps) * n);
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t i = 0; i < n; ++i) {
      const Config& c = configs[i];
      if (checked(c)) poison_output(c);  // before the start event: not timed
      host_barrier();
      device_barrier(stream_);
      BENCH_CUDA_CHECK(cudaEventRecord(start_, stream_));
      if (graph)
        BENCH_CUDA_CHECK(cudaGraphLaunch(execs[i], stream_));
      else
        for (int k = 0; k < args_.iters; ++k) c.launch(stream_);
      BENCH_CUDA_CHECK(cudaEventRecord(stop_, stream_));
      BENCH_CUDA_CHECK(cudaEventSynchronize(stop_));
      float ms = 0;
      BENCH_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
      times[size_t(rep) * n + i] = ms * 1000.0 / args_.iters;
      // The output after the batch (after the graph replay in graph mode) must still be right.
      if (checked(c)) result[i].wrong = std::max(result[i].wrong, check_output(c));
    }
  }
  for (cudaGraphExec_t exec : execs)
    if (exec) BENCH_CUDA_CHECK(cudaGraphExecDestroy(exec));
  comm_->check();
  // A batch takes as long as its slowest rank; then the median and the spread over repetitions.
  std::vector<double> all(times.size() * world());
  comm_->bootstrap().all_gather(times.data(), all.data(), times.size() * sizeof(double));
  for (size_t i = 0; i < n; ++i) {
    std::vector<double> batch(reps, 0.0);
    for (int rep = 0; rep < reps; ++rep)
      for (int r = 0; r < world(); ++r)
        batch[rep] = std::max(batch[rep], all[size_t(r) * times.size() + size_t(rep) * n + i]);
    const Spread spread = spread_of(batch);
    result[i].median_us = spread.median;
    result[i].min_us = spread.min;
    result[i].max_us = spread.max;
  }
  return result;
}

int blocks_of(const std::string& plan) {
  const auto at = plan.find("blocks=");
  return at == std::string::npos ? 0 : std::atoi(plan.c_str() + at + 7);
}

void require_zero_copy(const std::string& impl, const std::string& plan) {
  if (plan.find("staged") != std::string::npos)
    throw std::runtime_error(impl + ": the plan \"" + plan +
                             "\" stages an operand although both are heap buffers; the bench measures zero copy");
}

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt32: return ncclInt32;
    case DataType::kUInt8: return ncclUint8;
  }
  throw std::invalid_argument("no NCCL type for this DataType");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kAvg: return ncclAvg;
  }
  throw std::invalid_argument("no NCCL reduction for this ReduceOp");
}

Row new_row(const BenchContext& ctx, const std::string& op, const std::string& impl, DataType type,
            size_t bytes_per_rank, size_t count, int blocks) {
  Row r;
  r.op = op;
  r.impl = impl;
  r.mode = ctx.args().graph ? "graph" : "eager";
  r.world = ctx.world();
  r.nodes = ctx.nodes();
  r.dtype = dtype_name(type);
  r.bytes_per_rank = bytes_per_rank;
  r.count = count;
  r.blocks = blocks;
  r.wrong = -1;
  return r;
}

void apply(const Measurement& m, Row* row) {
  row->time_us = m.median_us;
  row->time_min_us = m.min_us;
  row->time_max_us = m.max_us;
  row->wrong = m.wrong;
  compute_bandwidth(row);
}

void report_size(const BenchContext& ctx, const std::string& op, DataType type, size_t bytes, size_t count,
                 const std::vector<Candidate>& cases, const std::vector<Measurement>& measured,
                 std::vector<Row>* rows) {
  std::vector<Row> size_rows;
  for (size_t i = 0; i < cases.size(); ++i) {
    Row r = new_row(ctx, op, cases[i].impl, type, bytes, count, cases[i].blocks);
    apply(measured[i], &r);
    size_rows.push_back(r);
  }
  compare_with_nccl(&size_rows);
  if (ctx.rank() == 0) {
    for (const auto& r : size_rows) std::printf("%s\n", table_row(r).c_str());
    std::fflush(stdout);
  }
  rows->insert(rows->end(), size_rows.begin(), size_rows.end());
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
    int v = static_cast<int>(splitmix(state) % 32) - 16;
    if (v == 0) v = 16;  // never zero: a dropped contribution must change the sum
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

void poison(void* device, size_t bytes, cudaStream_t stream) {
  BENCH_CUDA_CHECK(cudaMemsetAsync(device, 0xFF, bytes, stream));
}

std::vector<double> reduce_over_ranks(int world, size_t in_count, size_t first, size_t count, DataType type,
                                      ReduceOp op, const std::function<uint64_t(int)>& seed_of) {
  if (op == ReduceOp::kAvg) throw std::invalid_argument("the bench's exact references hold sums, max and min only");
  std::vector<double> acc(count, 0);
  for (int r = 0; r < world; ++r) {
    const auto data = host_data(in_count, type, seed_of(r), Fill::kIntegers);
    for (size_t i = 0; i < count; ++i) {
      const double v = element_to_double(data.data(), type, first + i);
      if (r == 0)
        acc[i] = v;
      else if (op == ReduceOp::kSum)
        acc[i] += v;
      else if (op == ReduceOp::kMax)
        acc[i] = std::max(acc[i], v);
      else
        acc[i] = std::min(acc[i], v);
    }
  }
  return acc;
}

std::vector<uint8_t> exact_in_type(const std::vector<double>& values, DataType type) {
  const size_t elem = dtype_size(type);
  std::vector<uint8_t> out(values.size() * elem);
  for (size_t i = 0; i < values.size(); ++i) {
    const double x = values[i];
    uint8_t* p = out.data() + i * elem;
    switch (type) {
      case DataType::kFloat32: {
        const float f = static_cast<float>(x);
        std::memcpy(p, &f, 4);
        break;
      }
      case DataType::kFloat16: {
        const __half h = __double2half(x);
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        const __nv_bfloat16 h = __double2bfloat16(x);
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kInt32: {
        const int32_t y = static_cast<int32_t>(x);
        std::memcpy(p, &y, 4);
        break;
      }
      case DataType::kUInt8: *p = static_cast<uint8_t>(x); break;
    }
    if (element_to_double(out.data(), type, i) != x)
      throw std::runtime_error("reference value " + std::to_string(x) + " at element " + std::to_string(i) +
                               " is not exact in " + dtype_name(type));
  }
  return out;
}

}  // namespace symmem::bench
