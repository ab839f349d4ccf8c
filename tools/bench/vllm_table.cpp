#include "vllm_table.hpp"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <memory>
#include <optional>

namespace symmem::bench {
namespace {

// One row of each T, in the order of the table's columns.
struct Column {
  const char* impl;          // the row's name in the CSV
  const char* header;        // the table's column
  std::optional<Algo> algo;  // symmem rows; none for NCCL rows
};

const Column kColumns[] = {
    {"nccl", "nccl", std::nullopt},
    {"nccl_symmetric", "nccl_sym", std::nullopt},
    {"symmem_auto", "auto", Algo::kAuto},
    {"symmem_one_shot", "one_shot", Algo::kOneShot},
    {"symmem_one_shot_push", "1shot_push", Algo::kOneShotPush},
    {"symmem_two_shot", "two_shot", Algo::kTwoShot},
    {"symmem_two_shot_push", "2shot_push", Algo::kTwoShotPush},
    {"symmem_low_latency", "ll", Algo::kLowLatency},
    {"symmem_low_latency_two_shot", "ll_2shot", Algo::kLowLatencyTwoShot},
};

void print_header(const BenchContext& ctx) {
  std::printf(
      "# vLLM-style all-reduce table: T x %d bf16, %d ranks, %s, %s; median us per call of %d interleaved "
      "batches of %d calls; spread = widest (max - min) / median of the line's cells\n",
      kVllmHidden, ctx.world(), ctx.meta().gpu.c_str(), ctx.args().graph ? "CUDA graph replay" : "eager",
      ctx.args().reps, ctx.args().iters);
  std::printf("%6s %10s", "T", "bytes");
  for (const Column& c : kColumns) {
    std::printf(" %10s", c.header);
    if (std::string(c.impl) == "symmem_auto") std::printf(" %21s", "auto_plan");
  }
  std::printf(" %28s %10s %10s %7s %7s\n", "best", "nccl/auto", "sym/auto", "#wrong", "spread");
}

// One line of the table from the rows of one T (rank 0).
void print_line(int tokens, size_t bytes, const std::vector<Row>& rows, const std::string& auto_plan) {
  std::map<std::string, const Row*> by_impl;
  for (const Row& r : rows) by_impl[r.impl] = &r;
  auto time_of = [&](const char* impl) -> double {
    const auto it = by_impl.find(impl);
    return it == by_impl.end() ? 0 : it->second->time_us;
  };
  std::printf("%6d %10zu", tokens, bytes);
  for (const Column& c : kColumns) {
    if (time_of(c.impl) > 0)
      std::printf(" %10.1f", time_of(c.impl));
    else
      std::printf(" %10s", "-");
    if (std::string(c.impl) == "symmem_auto") std::printf(" %21s", auto_plan.c_str());
  }
  const Row* best = nullptr;
  long wrong = -1;
  double spread = 0;
  for (const Row& r : rows) {
    if (!best || r.time_us < best->time_us) best = &r;
    if (r.wrong >= 0) wrong = std::max(wrong, 0L) + r.wrong;
    if (r.time_us > 0) spread = std::max(spread, (r.time_max_us - r.time_min_us) / r.time_us);
  }
  auto ratio = [&](const char* impl) {
    static char buf[2][16];
    static int k = 0;
    char* b = buf[k++ % 2];
    const double num = time_of(impl), den = time_of("symmem_auto");
    if (num > 0 && den > 0)
      std::snprintf(b, 16, "%.2fx", num / den);
    else
      std::snprintf(b, 16, "-");
    return b;
  };
  char wrong_text[24];
  if (wrong < 0)
    std::snprintf(wrong_text, sizeof(wrong_text), "N/A");
  else
    std::snprintf(wrong_text, sizeof(wrong_text), "%ld", wrong);
  std::printf(" %28s %10s %10s %7s %6.1f%%\n", best ? best->impl.c_str() : "-", ratio("nccl"), ratio("nccl_symmetric"),
              wrong_text, 100 * spread);
  std::fflush(stdout);
}

}  // namespace

std::vector<Row> run_vllm_table(BenchContext& ctx) {
  const Args& a = ctx.args();
  Communicator& comm = ctx.comm();
  const int world = ctx.world();
  const DataType type = DataType::kBFloat16;
  const size_t elem = dtype_size(type);
  const size_t max_bytes = size_t(kVllmTokens[std::size(kVllmTokens) - 1]) * kVllmHidden * elem;
  Buffer* in = comm.allocate(max_bytes);
  Buffer* out = comm.allocate(max_bytes);
  void* expected = nullptr;
  BENCH_CUDA_CHECK(cudaMalloc(&expected, max_bytes));
  // NCCL's symmetric kernels on NCCL's own symmetric memory, the setup NCCL documents for them.
  std::unique_ptr<NcclMemory> sym_in, sym_out;
  bool symmetric_rows = false;
  if (a.nccl) {
    sym_in = std::make_unique<NcclMemory>(max_bytes);
    sym_out = std::make_unique<NcclMemory>(max_bytes);
    symmetric_rows =
        ctx.register_windows(ctx.nccl_symmetric(), {{sym_in->get(), max_bytes}, {sym_out->get(), max_bytes}});
    if (!symmetric_rows)
      ctx.progress("NCCL refused to register ncclMemAlloc buffers as windows; nccl_symmetric skipped");
  }
  if (ctx.rank() == 0) print_header(ctx);

  std::vector<Row> rows;
  for (int tokens : kVllmTokens) {
    const size_t count = size_t(tokens) * kVllmHidden;
    const size_t bytes = count * elem;
    ctx.progress("vllm table: T = " + std::to_string(tokens));
    // Nonzero integers, different on every rank: the bf16 sum is exact and must match the float64
    // reference bit for bit, whatever the order of the additions (bench_context.hpp, Fill).
    const auto data = host_data(count, type, seed_for(ctx.rank(), bytes, 3), Fill::kIntegers);
    upload(in->ptr(), data, ctx.stream());
    if (symmetric_rows) upload(sym_in->get(), data, ctx.stream());
    const auto reference =
        reduce_over_ranks(world, count, 0, count, type, ReduceOp::kSum, [&](int r) { return seed_for(r, bytes, 3); });
    upload(expected, exact_in_type(reference, type), ctx.stream());

    std::vector<Config> configs;
    std::vector<Row> line;
    std::string auto_plan = "-";
    for (const Column& column : kColumns) {
      Config c;
      c.out_bytes = bytes;
      c.expected = expected;
      c.elem_bytes = elem;
      int blocks = -1;
      if (!column.algo) {
        if (!a.nccl) continue;
        const bool symmetric = std::string(column.impl) == "nccl_symmetric";
        if (symmetric && !symmetric_rows) continue;
        const ncclComm_t n = symmetric ? ctx.nccl_symmetric() : ctx.nccl();
        void* src = symmetric ? sym_in->get() : in->ptr();
        void* dst = symmetric ? sym_out->get() : out->ptr();
        c.out = dst;
        c.launch = [=](cudaStream_t s) {
          BENCH_NCCL_CHECK(ncclAllReduce(src, dst, count, ncclBfloat16, ncclSum, n, s));
        };
      } else {
        CollectiveOptions o;
        o.algo = *column.algo;
        std::string plan;
        try {
          plan = describe_all_reduce(out, in, count, type, comm, o);
        } catch (const Error&) {
          continue;  // e.g. low_latency beyond its capacity
        }
        require_zero_copy(column.impl, plan);
        if (*column.algo == Algo::kAuto) auto_plan = plan.substr(0, plan.find(' '));
        blocks = blocks_of(plan);
        c.out = out->ptr();
        c.launch = [=, &comm](cudaStream_t s) { all_reduce(out, in, count, type, ReduceOp::kSum, comm, s, o); };
      }
      configs.push_back(c);
      line.push_back(new_row(ctx, "all_reduce", column.impl, type, bytes, count, blocks));
    }
    const std::vector<Measurement> measured = ctx.measure(configs, a.graph);
    for (size_t i = 0; i < line.size(); ++i) apply(measured[i], &line[i]);
    compare_with_nccl(&line);
    if (ctx.rank() == 0) print_line(tokens, bytes, line, auto_plan);
    rows.insert(rows.end(), line.begin(), line.end());
  }
  if (ctx.rank() == 0) {
    std::printf("# every row: median and spread (min, max) of the batches, #wrong summed over ranks\n%s\n",
                table_header().c_str());
    for (const Row& r : rows) std::printf("%s\n", table_row(r).c_str());
    std::fflush(stdout);
  }
  ctx.release_windows();
  sym_out.reset();
  sym_in.reset();
  BENCH_CUDA_CHECK(cudaFree(expected));
  comm.free(out);
  comm.free(in);
  return rows;
}

}  // namespace symmem::bench
