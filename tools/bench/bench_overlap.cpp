#include "bench_overlap.hpp"

#include <cstdio>
#include <cstdlib>

#include "gemm.hpp"
#include "overlap_phases.hpp"

namespace symmem::bench {

std::vector<Row> run_overlap(BenchContext& ctx) {
  const Args& a = ctx.args();
  const int world = ctx.world();
  Communicator& comm = ctx.comm();
  const DataType type = a.dtype;
  const size_t elem = dtype_size(type);
  const size_t per_rank = a.overlap_bytes / world / elem * elem;
  const size_t count = per_rank / elem;
  // In place, as FSDP2 gathers parameters: each rank's shard is its slot of the output. symmem
  // gets it as a symmetric operand (the heap buffer at this rank's offset: zero copy); NCCL as
  // the same address.
  Buffer* out = comm.allocate(per_rank * world);
  const size_t my_offset = ctx.rank() * per_rank;
  void* in = static_cast<char*>(out->ptr()) + my_offset;
  upload(in, host_data(count, type, seed_for(ctx.rank(), per_rank, 2), Fill::kBits), ctx.stream());
  void* expected = nullptr;
  BENCH_CUDA_CHECK(cudaMalloc(&expected, per_rank * world));
  for (int r = 0; r < world; ++r)
    upload(static_cast<char*>(expected) + r * per_rank, host_data(count, type, seed_for(r, per_rank, 2), Fill::kBits),
           ctx.stream());
  Gemm gemm(a.gemm_m, a.gemm_n, a.gemm_k, DataType::kFloat16, ctx.stream());
  cudaStream_t side = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  BENCH_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  BENCH_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  BENCH_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  const bool ce_window = a.nccl && ctx.register_windows(ctx.nccl_copy_engine(), {{out->ptr(), out->size()}});
  if (a.nccl && !ce_window) ctx.progress("NCCL refused to register the heap buffer as a window; nccl_ce skipped");
  const ncclDataType_t nt = nccl_type(type);

  using Gather = std::function<void(cudaStream_t)>;
  std::vector<std::pair<std::string, Gather>> gathers;
  if (a.nccl) {
    ncclComm_t plain = ctx.nccl();
    gathers.push_back(
        {"nccl", [=](cudaStream_t s) { BENCH_NCCL_CHECK(ncclAllGather(in, out->ptr(), count, nt, plain, s)); }});
  }
  if (ce_window) {
    ncclComm_t ce = ctx.nccl_copy_engine();
    gathers.push_back(
        {"nccl_ce", [=](cudaStream_t s) { BENCH_NCCL_CHECK(ncclAllGather(in, out->ptr(), count, nt, ce, s)); }});
  }
  const Operand symmetric_out(out), symmetric_in(out, my_offset);
  auto add_symmem = [&](const std::string& name, const CollectiveOptions& o) {
    require_zero_copy(name, describe_all_gather(symmetric_out, symmetric_in, count, type, comm, o));
    gathers.push_back(
        {name, [=, &comm](cudaStream_t s) { all_gather(symmetric_out, symmetric_in, count, type, comm, s, o); }});
  };
  const std::vector<int> blocks = a.blocks.empty() ? std::vector<int>{4, 8, 16, 32} : a.blocks;
  for (int b : blocks) {
    CollectiveOptions o;
    o.algo = Algo::kPull;
    o.blocks = b;
    add_symmem("symmem_sm" + std::to_string(b), o);
  }
  {
    CollectiveOptions o;
    o.algo = Algo::kCopyEngine;
    add_symmem("symmem_copy_engine", o);
  }

  // Every row, then one interleaved measurement of them all. Rows with an all-gather check its
  // output (this rank's slot, the input, is kept out of the poison).
  std::vector<Row> rows;
  std::vector<Config> configs;
  auto add = [&](const std::string& impl, int blocks_used, bool gathers_data, const Launch& launch) {
    Row r = new_row(ctx, "overlap", impl, type, per_rank, count, blocks_used);
    r.mode = "eager";
    rows.push_back(r);
    Config c;
    c.launch = launch;
    if (gathers_data) {
      c.out = out->ptr();
      c.out_bytes = per_rank * world;
      c.expected = expected;
      c.elem_bytes = elem;
      c.keep_offset = my_offset;
      c.keep_bytes = per_rank;
    }
    configs.push_back(c);
  };
  if (ctx.rank() == 0)
    std::printf("# overlap: GEMM %dx%dx%d fp16 with in-place all-gather of %zu bytes (%zu per rank), %d ranks\n",
                a.gemm_m, a.gemm_n, a.gemm_k, per_rank * world, per_rank, world);
  add("gemm_alone", -1, false, [&](cudaStream_t s) { gemm.run(s); });
  auto blocks_of_gather = [](const std::string& name) {
    return name.rfind("symmem_sm", 0) == 0 ? std::atoi(name.c_str() + 9) : 0;
  };
  for (auto& [name, g] : gathers) add("allgather_alone_" + name, blocks_of_gather(name), true, g);
  if (a.nccl) {
    const Gather nccl_gather = gathers[0].second;
    add("sequential_nccl", -1, true, [&, nccl_gather](cudaStream_t s) {
      gemm.run(s);
      nccl_gather(s);
    });
  }
  for (auto& [name, g] : gathers) {
    add("overlap_" + name, blocks_of_gather(name), true, [&, g](cudaStream_t s) {
      BENCH_CUDA_CHECK(cudaEventRecord(fork, s));
      BENCH_CUDA_CHECK(cudaStreamWaitEvent(side, fork, 0));
      g(side);
      gemm.run(s);
      BENCH_CUDA_CHECK(cudaEventRecord(join, side));
      BENCH_CUDA_CHECK(cudaStreamWaitEvent(s, join, 0));
    });
  }
  const std::vector<Measurement> measured = ctx.measure(configs, false);
  if (ctx.rank() == 0) std::printf("%s\n", table_header().c_str());
  for (size_t i = 0; i < rows.size(); ++i) {
    apply(measured[i], &rows[i]);
    if (ctx.rank() == 0) std::printf("%s\n", table_row(rows[i]).c_str());
  }
  std::fflush(stdout);
  // Ratios to the GEMM alone, the figure of merit of overlap.
  if (ctx.rank() == 0) {
    const double gemm_us = rows[0].time_us;
    std::printf("# ratio to gemm_alone (%.1f us):\n", gemm_us);
    for (const auto& r : rows)
      if (r.impl.rfind("overlap_", 0) == 0 || r.impl == "sequential_nccl")
        std::printf("#   %-32s %.3fx\n", r.impl.c_str(), r.time_us / gemm_us);
  }
  // The same rows timed phase by phase (overlap_phases.hpp): figures that do not rest on the
  // separately measured GEMM.
  std::vector<PhaseRow> phase_rows{{"gemm_alone", Layout::kGemmOnly, {}}};
  if (a.nccl) phase_rows.push_back({"sequential_nccl", Layout::kSequential, gathers[0].second});
  for (auto& [name, g] : gathers) phase_rows.push_back({"overlap_" + name, Layout::kOverlapped, g});
  const auto phases =
      measure_phases(ctx, [&](cudaStream_t s) { gemm.run(s); }, phase_rows, std::max(1, a.iters), std::max(1, a.reps));
  if (ctx.rank() == 0) {
    std::printf("# phases (events inside each iteration; median of reps [min, max]; times: slowest rank):\n");
    std::printf("# %-28s %22s %22s %22s %20s\n", "row", "iteration(us)", "gemm inside(us)", "all-gather(us)",
                "all-gather hidden");
    for (const auto& f : phases)
      std::printf("# %-28s %8.1f [%5.0f,%5.0f] %8.1f [%5.0f,%5.0f] %8.1f [%5.0f,%5.0f] %6.1f%% [%3.0f,%3.0f]\n",
                  f.impl.c_str(), f.iteration.median, f.iteration.min, f.iteration.max, f.gemm.median, f.gemm.min,
                  f.gemm.max, f.gather.median, f.gather.min, f.gather.max, 100 * f.hidden.median, 100 * f.hidden.min,
                  100 * f.hidden.max);
    std::fflush(stdout);
    if (a.csv.rfind("/dev/", 0) != 0) {  // beside --csv: results.csv -> results_phases.csv
      std::string path = a.csv;
      const size_t dot = path.rfind(".csv");
      path = (dot == std::string::npos ? path : path.substr(0, dot)) + "_phases.csv";
      write_phases_csv(phases, ctx.meta(), path);
      std::fprintf(stderr, "symmem-bench: wrote %s\n", path.c_str());
    }
  }
  BENCH_CUDA_CHECK(cudaStreamSynchronize(side));
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(side);
  BENCH_CUDA_CHECK(cudaFree(expected));
  ctx.release_windows();
  comm.free(out);
  return rows;
}

}  // namespace symmem::bench
