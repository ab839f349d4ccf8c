#include "vllm_table.hpp"

#include <cstdio>
#include <iterator>
#include <map>
#include <optional>

namespace symmem::bench {

std::vector<Row> run_vllm_table(BenchContext& ctx) {
  const Args& a = ctx.args();
  Communicator& comm = ctx.comm();
  const DataType type = DataType::kBFloat16;
  const size_t max_count = size_t(kVllmTokens[std::size(kVllmTokens) - 1]) * kVllmHidden;
  Buffer* in = comm.allocate(max_count * 2);
  Buffer* out = comm.allocate(max_count * 2);
  // What each column runs: NCCL (no algorithm), then symmem with each algorithm; the row names
  // (`symmem_<algo>`) follow from it.
  const std::optional<Algo> columns[] = {
      std::nullopt,       Algo::kOneShot,    Algo::kOneShotPush,       Algo::kTwoShot,
      Algo::kTwoShotPush, Algo::kLowLatency, Algo::kLowLatencyTwoShot, Algo::kAuto};
  std::vector<Row> rows;
  if (ctx.rank() == 0) {
    std::printf("# vLLM-style all-reduce table: T x %d bf16, %d ranks, %s, median us per call\n", kVllmHidden,
                ctx.world(), a.graph ? "CUDA graph replay" : "eager");
    std::printf("%6s %10s %10s %10s %10s %10s %10s %10s %10s %10s %21s %28s %9s\n", "T", "bytes", "nccl", "one_shot",
                "1shot_push", "two_shot", "2shot_push", "ll", "ll_2shot", "auto", "auto_plan", "best", "speedup");
  }
  for (int tokens : kVllmTokens) {
    const size_t count = size_t(tokens) * kVllmHidden;
    upload(in->ptr(), host_data(count, type, seed_for(ctx.rank(), count, 3), Fill::kIntegers), ctx.stream());
    std::map<std::string, double> t;
    for (const std::optional<Algo>& column : columns) {
      const std::string name = column ? std::string("symmem_") + algo_name(*column) : "nccl";
      Launch launch;
      if (!column) {
        ncclComm_t n = ctx.nccl();
        launch = [=](cudaStream_t s) {
          BENCH_NCCL_CHECK(ncclAllReduce(in->ptr(), out->ptr(), count, ncclBfloat16, ncclSum, n, s));
        };
      } else {
        CollectiveOptions o;
        o.algo = *column;
        try {
          describe_all_reduce(out->ptr(), in->ptr(), count, type, comm, o);
        } catch (const Error&) {
          continue;  // e.g. low_latency beyond its capacity
        }
        launch = [=, &comm](cudaStream_t s) {
          all_reduce(out->ptr(), in->ptr(), count, type, ReduceOp::kSum, comm, s, o);
        };
      }
      Row r;
      r.op = "all_reduce";
      r.impl = name;
      r.mode = a.graph ? "graph" : "eager";
      r.world = ctx.world();
      r.dtype = dtype_name(type);
      r.bytes_per_rank = count * 2;
      r.count = count;
      r.blocks = -1;
      r.wrong = -1;
      r.time_us = ctx.time_us(launch, a.graph);
      compute_bandwidth(&r);
      t[name] = r.time_us;
      rows.push_back(r);
    }
    if (ctx.rank() == 0) {
      std::string best = "nccl";
      for (const auto& [name, us] : t)
        if (us < t[best]) best = name;
      auto cell = [&](const char* n) {
        static char buf[10][32];
        static int k = 0;
        char* b = buf[k++ % 10];
        if (t.count(n))
          std::snprintf(b, 32, "%.1f", t[n]);
        else
          std::snprintf(b, 32, "-");
        return b;
      };
      const std::string plan = describe_all_reduce(out->ptr(), in->ptr(), count, type, comm);
      std::printf("%6d %10zu %10s %10s %10s %10s %10s %10s %10s %10s %21s %28s %8.2fx\n", tokens, count * 2,
                  cell("nccl"), cell("symmem_one_shot"), cell("symmem_one_shot_push"), cell("symmem_two_shot"),
                  cell("symmem_two_shot_push"), cell("symmem_low_latency"), cell("symmem_low_latency_two_shot"),
                  cell("symmem_auto"), plan.substr(0, plan.find(' ')).c_str(), best.c_str(),
                  t["nccl"] / t["symmem_auto"]);
      std::fflush(stdout);
    }
  }
  compare_with_nccl(&rows);
  comm.free(out);
  comm.free(in);
  return rows;
}

}  // namespace symmem::bench
