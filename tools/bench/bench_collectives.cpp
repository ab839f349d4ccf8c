#include "bench_collectives.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <stdexcept>

#include "plan/algorithms.hpp"

namespace symmem::bench {
namespace {

struct Case {
  std::string impl;
  int blocks;  // -1: NCCL's / planner's own choice
  Launch launch;
};

// Every algorithm of `collective` (plan/algorithms.hpp), in the table's order.
std::vector<Algo> algorithms_of(detail::Collective collective) {
  std::vector<Algo> algos;
  for (const detail::Algorithm* a = detail::algorithms_begin(); a != detail::algorithms_end(); ++a)
    if (a->collective == collective) algos.push_back(a->algo);
  return algos;
}

// symmem variants to run: every requested algorithm of `collective` (by any name it answers to) at
// every requested block count; every algorithm when none is requested.
std::vector<std::pair<Algo, int>> variants(const Args& a, detail::Collective collective) {
  std::vector<Algo> algos;
  for (const auto& name : a.algos) {
    Algo algo;
    if (!parse_algo(name, &algo)) continue;
    const detail::Algorithm* row = detail::find_algorithm(collective, algo);
    if (row && std::find(algos.begin(), algos.end(), row->algo) == algos.end()) algos.push_back(row->algo);
  }
  if (a.algos.empty()) algos = algorithms_of(collective);
  std::vector<std::pair<Algo, int>> out;
  for (Algo algo : algos) {
    if (!detail::find_algorithm(collective, algo)->uses_sms || a.blocks.empty())
      out.push_back({algo, 0});
    else
      for (int b : a.blocks) out.push_back({algo, b});
  }
  return out;
}

// Checks and times every case of one size, interleaved, on the same output buffer; compares with
// NCCL, prints (rank 0) and keeps the rows.
void run_size(BenchContext& ctx, const std::string& op, const std::vector<Case>& cases, size_t bytes, size_t count,
              void* out, size_t out_bytes, const void* expected, std::vector<Row>* rows) {
  const DataType type = ctx.args().dtype;
  std::vector<Config> configs;
  for (const auto& c : cases) {
    Config k;
    k.launch = c.launch;
    k.out = out;
    k.out_bytes = out_bytes;
    k.expected = expected;
    k.elem_bytes = dtype_size(type);
    k.same_on_every_rank = op != "reduce_scatter";  // each rank holds its own slice
    configs.push_back(k);
  }
  const std::vector<Measurement> measured = ctx.measure(configs, ctx.args().graph);
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

// Frees what a sweep allocated; NCCL lets go of its windows on the buffers first.
void release(BenchContext& ctx, void* expected, std::initializer_list<Buffer*> buffers) {
  BENCH_CUDA_CHECK(cudaFree(expected));
  ctx.release_windows();
  for (Buffer* b : buffers) ctx.comm().free(b);
}

// Symmetric windows for the NCCL rows that use them, on the same heap buffers symmem uses.
bool register_heap_windows(BenchContext& ctx, std::initializer_list<Buffer*> buffers) {
  std::vector<std::pair<void*, size_t>> ranges;
  for (Buffer* b : buffers) ranges.push_back({b->ptr(), b->size()});
  bool ok = ctx.register_windows(ctx.nccl_symmetric(), ranges);
  ok = ctx.register_windows(ctx.nccl_copy_engine(), ranges) && ok;
  if (!ok) ctx.progress("NCCL refused to register the heap buffers as windows; symmetric rows skipped");
  return ok;
}

void print_header(BenchContext& ctx, const std::string& op) {
  if (ctx.rank() != 0) return;
  std::printf("# symmem-bench %s: %d ranks in %d node%s, %s, %s\n", op.c_str(), ctx.world(), ctx.comm().nodes(),
              ctx.comm().nodes() > 1 ? "s" : "", ctx.meta().gpu.c_str(),
              ctx.args().graph ? "CUDA graph replay" : "eager launches");
  std::printf("%s\n", table_header().c_str());
}

}  // namespace

std::vector<Row> run_all_gather(BenchContext& ctx) {
  const Args& a = ctx.args();
  const int world = ctx.world();
  const size_t elem = dtype_size(a.dtype);
  const auto sizes = sweep_sizes(a);
  const size_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  Communicator& comm = ctx.comm();
  Buffer* in = comm.allocate(max_bytes);
  Buffer* out = comm.allocate(max_bytes * world);
  void* expected = nullptr;
  BENCH_CUDA_CHECK(cudaMalloc(&expected, max_bytes * world));
  // NCCL's symmetric kernels serve one node; across (simulated) nodes the plain NCCL row is the
  // reference.
  const bool windows = a.nccl && comm.nodes() == 1 && register_heap_windows(ctx, {in, out});
  print_header(ctx, "all_gather");
  std::vector<Row> rows;
  for (size_t si = 0; si < sizes.size(); ++si) {
    const size_t bytes = sizes[si];
    const size_t count = bytes / elem;
    ctx.progress("all_gather " + std::to_string(si + 1) + "/" + std::to_string(sizes.size()) + ": " +
                 format_bytes(bytes) + " per rank");
    upload(in->ptr(), host_data(count, a.dtype, seed_for(ctx.rank(), bytes, 0), Fill::kBits), ctx.stream());
    for (int r = 0; r < world; ++r)
      upload(static_cast<char*>(expected) + r * bytes, host_data(count, a.dtype, seed_for(r, bytes, 0), Fill::kBits),
             ctx.stream());

    std::vector<Case> cases;
    const ncclDataType_t t = nccl_type(a.dtype);
    if (a.nccl) {
      ncclComm_t plain = ctx.nccl();
      cases.push_back({"nccl", -1, [=](cudaStream_t s) {
                         BENCH_NCCL_CHECK(ncclAllGather(in->ptr(), out->ptr(), count, t, plain, s));
                       }});
      if (windows) {
        ncclComm_t sym = ctx.nccl_symmetric();
        cases.push_back({"nccl_symmetric", -1, [=](cudaStream_t s) {
                           BENCH_NCCL_CHECK(ncclAllGather(in->ptr(), out->ptr(), count, t, sym, s));
                         }});
        ncclComm_t ce = ctx.nccl_copy_engine();
        cases.push_back({"nccl_ce", 0, [=](cudaStream_t s) {
                           BENCH_NCCL_CHECK(ncclAllGather(in->ptr(), out->ptr(), count, t, ce, s));
                         }});
      }
      for (int ctas : a.nccl_ctas) {
        ncclComm_t c = ctx.nccl_with_ctas(ctas);
        cases.push_back({"nccl_ctas", ctas, [=](cudaStream_t s) {
                           BENCH_NCCL_CHECK(ncclAllGather(in->ptr(), out->ptr(), count, t, c, s));
                         }});
      }
    }
    const DataType type = a.dtype;
    {
      const std::string plan = describe_all_gather(out, in, count, type, comm);
      require_zero_copy("symmem_auto", plan);
      cases.push_back(
          {"symmem_auto", blocks_of(plan), [=, &comm](cudaStream_t s) { all_gather(out, in, count, type, comm, s); }});
    }
    for (auto [algo, blocks] : variants(a, detail::Collective::kAllGather)) {
      // Across nodes every request runs the hierarchical all-gather: one row, under its name.
      if (comm.nodes() > 1 && algo != Algo::kHierarchical) continue;
      CollectiveOptions o;
      o.algo = algo;
      o.blocks = blocks;
      const std::string name = std::string("symmem_") + algo_name(algo);
      std::string plan;
      try {
        plan = describe_all_gather(out, in, count, type, comm, o);
      } catch (const Error& e) {  // e.g. low latency past its capacity
        if (ctx.rank() == 0) std::printf("# %s skipped at %zu bytes: %s\n", name.c_str(), bytes, e.what());
        continue;
      }
      require_zero_copy(name, plan);
      cases.push_back(
          {name, blocks_of(plan), [=, &comm](cudaStream_t s) { all_gather(out, in, count, type, comm, s, o); }});
    }
    run_size(ctx, "all_gather", cases, bytes, count, out->ptr(), bytes * world, expected, &rows);
  }
  release(ctx, expected, {out, in});
  return rows;
}

std::vector<Row> run_reduction(BenchContext& ctx, bool reduce_scatter) {
  const Args& a = ctx.args();
  const int world = ctx.world();
  const size_t elem = dtype_size(a.dtype);
  const std::string op = reduce_scatter ? "reduce_scatter" : "all_reduce";
  const auto sizes = sweep_sizes(a);
  const size_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  Communicator& comm = ctx.comm();
  if (comm.nodes() > 1)
    throw std::runtime_error(op +
                             ": symmem's reductions run inside one node; across nodes symmem-bench measures "
                             "all_gather only");
  const size_t in_max = reduce_scatter ? max_bytes * world : max_bytes;
  Buffer* in = comm.allocate(in_max);
  Buffer* out = comm.allocate(max_bytes);
  void* expected = nullptr;
  BENCH_CUDA_CHECK(cudaMalloc(&expected, max_bytes));
  const bool windows = a.nccl && register_heap_windows(ctx, {in, out});
  print_header(ctx, op);
  std::vector<Row> rows;
  for (size_t si = 0; si < sizes.size(); ++si) {
    const size_t bytes = sizes[si];  // output bytes
    const size_t count = bytes / elem;
    const size_t in_count = reduce_scatter ? count * world : count;
    ctx.progress(op + " " + std::to_string(si + 1) + "/" + std::to_string(sizes.size()) + ": " + format_bytes(bytes));
    // Inputs are small integers, so the reduction is exact in every type: expect equality.
    const int rank = ctx.rank();
    upload(in->ptr(), host_data(in_count, a.dtype, seed_for(rank, bytes, 1), Fill::kIntegers), ctx.stream());
    const size_t first = reduce_scatter ? rank * count : 0;
    const auto reference = reduce_over_ranks(world, in_count, first, count, a.dtype, a.reduce_op,
                                             [&](int r) { return seed_for(r, bytes, 1); });
    upload(expected, exact_in_type(reference, a.dtype), ctx.stream());

    std::vector<Case> cases;
    const ncclDataType_t t = nccl_type(a.dtype);
    const ncclRedOp_t nop = nccl_op(a.reduce_op);
    if (a.nccl) {
      ncclComm_t plain = ctx.nccl();
      cases.push_back({"nccl", -1, [=](cudaStream_t s) {
                         if (reduce_scatter)
                           BENCH_NCCL_CHECK(ncclReduceScatter(in->ptr(), out->ptr(), count, t, nop, plain, s));
                         else
                           BENCH_NCCL_CHECK(ncclAllReduce(in->ptr(), out->ptr(), count, t, nop, plain, s));
                       }});
      if (windows) {
        ncclComm_t sym = ctx.nccl_symmetric();
        cases.push_back({"nccl_symmetric", -1, [=](cudaStream_t s) {
                           if (reduce_scatter)
                             BENCH_NCCL_CHECK(ncclReduceScatter(in->ptr(), out->ptr(), count, t, nop, sym, s));
                           else
                             BENCH_NCCL_CHECK(ncclAllReduce(in->ptr(), out->ptr(), count, t, nop, sym, s));
                         }});
      }
      for (int ctas : a.nccl_ctas) {
        ncclComm_t c = ctx.nccl_with_ctas(ctas);
        cases.push_back({"nccl_ctas", ctas, [=](cudaStream_t s) {
                           if (reduce_scatter)
                             BENCH_NCCL_CHECK(ncclReduceScatter(in->ptr(), out->ptr(), count, t, nop, c, s));
                           else
                             BENCH_NCCL_CHECK(ncclAllReduce(in->ptr(), out->ptr(), count, t, nop, c, s));
                         }});
      }
    }
    const DataType type = a.dtype;
    const ReduceOp rop = a.reduce_op;
    auto symmem_case = [&](const std::string& name, const CollectiveOptions& o) {
      std::string plan;
      try {
        plan = reduce_scatter ? describe_reduce_scatter(out, in, count, type, comm, o)
                              : describe_all_reduce(out, in, count, type, comm, o);
      } catch (const Error& e) {
        if (ctx.rank() == 0) std::printf("# %s skipped at %zu bytes: %s\n", name.c_str(), bytes, e.what());
        return;
      }
      require_zero_copy(name, plan);
      cases.push_back({name, blocks_of(plan), [=, &comm](cudaStream_t s) {
                         if (reduce_scatter)
                           symmem::reduce_scatter(out, in, count, type, rop, comm, s, o);
                         else
                           symmem::all_reduce(out, in, count, type, rop, comm, s, o);
                       }});
    };
    symmem_case("symmem_auto", CollectiveOptions{});
    for (auto [algo, blocks] :
         variants(a, reduce_scatter ? detail::Collective::kReduceScatter : detail::Collective::kAllReduce)) {
      CollectiveOptions o;
      o.algo = algo;
      o.blocks = blocks;
      symmem_case(std::string("symmem_") + algo_name(algo), o);
    }
    run_size(ctx, op, cases, bytes, count, out->ptr(), bytes, expected, &rows);
  }
  release(ctx, expected, {out, in});
  return rows;
}

std::vector<detail::TuningEntry> tuning_entries(const std::vector<Row>& rows) {
  std::map<std::pair<std::string, size_t>, const Row*> best;
  for (const auto& r : rows) {
    // The table serves one node's planner: not the hierarchical all-gather, not runs across nodes.
    if (r.impl.rfind("symmem_", 0) != 0 || r.impl == "symmem_auto" || r.impl == "symmem_hierarchical" || r.nodes > 1 ||
        r.wrong > 0)
      continue;
    auto& b = best[{r.op, r.bytes_per_rank}];
    if (!b || r.time_us < b->time_us) b = &r;
  }
  std::vector<detail::TuningEntry> entries;
  for (const auto& [key, r] : best) {
    detail::TuningEntry e;
    e.op = r->op;
    e.world = r->world;
    e.max_bytes = r->bytes_per_rank;
    parse_algo(r->impl.substr(7), &e.algo);
    e.blocks = r->blocks;
    entries.push_back(e);
  }
  return entries;
}

}  // namespace symmem::bench
