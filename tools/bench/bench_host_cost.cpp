// Host cost per call. The eager figures of the other benches are max(host cost, GPU time) per call:
// back-to-back calls leave the GPU idle whenever issuing a call takes longer than running it, as
// it does for small messages. This bench separates the host half: each sample enqueues a spin
// kernel that holds the stream for longer than the sample takes, then issues -n calls and times
// them on the CPU clock; a sample after which the spin had already ended (the GPU caught up, so a
// call may have waited) is discarded. Rows run in turn (ABAB...) --reps times; a repetition counts
// as its slower rank's sample, and each row reports the median repetition, with the fastest and
// slowest.
//
// Rows: the bare launch of an empty kernel (<<<>>>, and cudaLaunchKernelEx with symmem's argument
// struct with and without the PDL attribute), NCCL's all-gather, all-reduce and reduce-scatter
// (plain communicator), and symmem's (auto and low latency, heap operands; all-reduce also with
// plain device memory, which adds a pointer query per call).
#include "bench_host_cost.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "host_cost_kernels.hpp"

namespace symmem::bench {
namespace {

struct Case {
  std::string op;  // the collective a row issues, or "launch"
  std::string impl;
  Launch launch;
};

// Microseconds per call of `calls` calls issued behind a spin, or NaN if the spin ended first.
double host_sample(const Launch& launch, int calls, cudaStream_t stream, cudaEvent_t spin_done) {
  // 20 ms: far longer than issuing a sample (calls of ~10 us), short enough to repeat often.
  launch_spin(20'000'000, stream);
  BENCH_CUDA_CHECK(cudaEventRecord(spin_done, stream));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) launch(stream);
  const auto end = std::chrono::steady_clock::now();
  // The spin itself, not the stream (whose queued calls keep it busy after the spin ends).
  const bool still_busy = cudaEventQuery(spin_done) == cudaErrorNotReady;
  BENCH_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (!still_busy) return std::numeric_limits<double>::quiet_NaN();
  return std::chrono::duration<double, std::micro>(end - start).count() / calls;
}

}  // namespace

std::vector<Row> run_host_cost(BenchContext& ctx) {
  const Args& a = ctx.args();
  const int world = ctx.world();
  const DataType type = a.dtype;
  const size_t elem = dtype_size(type);
  const size_t bytes = std::max(elem, a.min_bytes / elem * elem);  // per rank
  const size_t count = bytes / elem;
  Communicator& comm = ctx.comm();
  Buffer* in = comm.allocate(bytes * world);
  Buffer* out = comm.allocate(bytes * world);
  void* local_in = nullptr;
  void* local_out = nullptr;
  BENCH_CUDA_CHECK(cudaMalloc(&local_in, bytes));
  BENCH_CUDA_CHECK(cudaMalloc(&local_out, bytes));
  upload(in->ptr(), host_data(count * world, type, seed_for(ctx.rank(), bytes, 4), Fill::kIntegers), ctx.stream());
  upload(local_in, host_data(count, type, seed_for(ctx.rank(), bytes, 4), Fill::kIntegers), ctx.stream());
  const ncclDataType_t t = nccl_type(type);
  ncclComm_t nccl = ctx.nccl();
  CollectiveOptions low_latency;
  low_latency.algo = Algo::kLowLatency;

  std::vector<Case> cases = {
      {"launch", "empty_kernel", [](cudaStream_t s) { launch_empty(s); }},
      {"launch", "empty_kernel_ex", [](cudaStream_t s) { launch_empty_like_symmem(false, s); }},
      {"launch", "empty_kernel_ex_pdl", [](cudaStream_t s) { launch_empty_like_symmem(true, s); }},
  };
  if (a.nccl) {
    cases.push_back({"all_gather", "nccl", [=](cudaStream_t s) {
                       BENCH_NCCL_CHECK(ncclAllGather(in->ptr(), out->ptr(), count, t, nccl, s));
                     }});
    cases.push_back({"all_reduce", "nccl", [=](cudaStream_t s) {
                       BENCH_NCCL_CHECK(ncclAllReduce(in->ptr(), out->ptr(), count, t, ncclSum, nccl, s));
                     }});
    cases.push_back({"reduce_scatter", "nccl", [=](cudaStream_t s) {
                       BENCH_NCCL_CHECK(ncclReduceScatter(in->ptr(), out->ptr(), count, t, ncclSum, nccl, s));
                     }});
  }
  const CollectiveOptions automatic;
  std::vector<std::pair<std::string, CollectiveOptions>> variants{{"auto", automatic}};
  // Low latency holds up to 1 MiB per rank (Workspaces::kLowLatencySlotBytes).
  if (bytes <= (size_t(1) << 20)) variants.push_back({"low_latency", low_latency});
  for (const auto& [suffix, o] : variants) {
    cases.push_back({"all_gather", "symmem_" + suffix,
                     [=, &comm](cudaStream_t s) { all_gather(out, in, count, type, comm, s, o); }});
    cases.push_back({"all_reduce", "symmem_" + suffix,
                     [=, &comm](cudaStream_t s) { all_reduce(out, in, count, type, ReduceOp::kSum, comm, s, o); }});
    cases.push_back({"reduce_scatter", "symmem_" + suffix, [=, &comm](cudaStream_t s) {
                       reduce_scatter(out, in, count, type, ReduceOp::kSum, comm, s, o);
                     }});
  }
  cases.push_back({"all_reduce", "symmem_auto_device_memory", [=, &comm](cudaStream_t s) {
                     all_reduce(local_out, local_in, count, type, ReduceOp::kSum, comm, s);
                   }});

  // Warm-up: every row once (plans, graphs of NCCL's first call, lazy module loads).
  for (const auto& c : cases) c.launch(ctx.stream());
  comm.synchronize(ctx.stream());
  const int calls = std::max(1, a.iters);
  cudaEvent_t spin_done = nullptr;
  BENCH_CUDA_CHECK(cudaEventCreateWithFlags(&spin_done, cudaEventDisableTiming));
  const size_t n = cases.size();
  std::vector<double> samples(size_t(a.reps) * n);
  for (int rep = 0; rep < a.reps; ++rep)
    for (size_t i = 0; i < n; ++i) {
      ctx.host_barrier();
      samples[size_t(rep) * n + i] = host_sample(cases[i].launch, calls, ctx.stream(), spin_done);
    }
  comm.check();
  std::vector<double> all(samples.size() * world);
  comm.bootstrap().all_gather(samples.data(), all.data(), samples.size() * sizeof(double));

  std::vector<Row> rows;
  if (ctx.rank() == 0) {
    std::printf("# symmem-bench host_cost: %d ranks, %s, %zu bytes per rank, %d calls per sample, %d samples\n",
                world, ctx.meta().gpu.c_str(), bytes, calls, a.reps);
    std::printf("# host us per call (median of the slower rank's samples, min, max); nan: the GPU caught up\n");
    std::printf("%-16s %-28s %10s %10s %10s\n", "op", "impl", "host(us)", "min(us)", "max(us)");
  }
  for (size_t i = 0; i < n; ++i) {
    std::vector<double> per_rep;
    for (int rep = 0; rep < a.reps; ++rep) {
      double slowest = 0;
      for (int r = 0; r < world; ++r) {
        const double v = all[size_t(r) * samples.size() + size_t(rep) * n + i];
        slowest = std::isnan(v) || std::isnan(slowest) ? std::numeric_limits<double>::quiet_NaN() : std::max(slowest, v);
      }
      per_rep.push_back(slowest);  // NaN (some rank's GPU caught up): spread_of leaves it out
    }
    const Spread spread = spread_of(per_rep);
    Row r = new_row(ctx, "host_cost_" + cases[i].op, cases[i].impl, type, bytes, count, 0);
    r.mode = "host";
    r.time_us = spread.median;
    r.time_min_us = spread.min;
    r.time_max_us = spread.max;
    r.wrong = -1;  // nothing to check: host time only (the collectives are checked by the other benches)
    if (ctx.rank() == 0)
      std::printf("%-16s %-28s %10.2f %10.2f %10.2f\n", cases[i].op.c_str(), cases[i].impl.c_str(), r.time_us,
                  r.time_min_us, r.time_max_us);
    rows.push_back(r);
  }
  std::fflush(stdout);
  cudaEventDestroy(spin_done);
  BENCH_CUDA_CHECK(cudaFree(local_out));
  BENCH_CUDA_CHECK(cudaFree(local_in));
  comm.free(out);
  comm.free(in);
  return rows;
}

}  // namespace symmem::bench
