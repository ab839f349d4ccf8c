#include "bench_collectives.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "device_check.hpp"

namespace symmem::bench {
namespace {

struct Case {
  std::string impl;
  int blocks;  // -1: NCCL's / planner's own choice
  Launch launch;
};

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kInt32: return ncclInt32;
    case DataType::kUInt8: return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

// The blocks a plan description reports ("... blocks=16 ..."), or 0.
int blocks_of(const std::string& plan) {
  const auto at = plan.find("blocks=");
  return at == std::string::npos ? 0 : std::atoi(plan.c_str() + at + 7);
}

// symmem variants to run: every requested algorithm at every requested block count.
std::vector<std::pair<Algo, int>> variants(const Args& a, const std::vector<Algo>& defaults) {
  std::vector<Algo> algos;
  for (const auto& name : a.algos) {
    Algo algo;
    parse_algo(name, &algo);
    if (std::find(defaults.begin(), defaults.end(), algo) != defaults.end()) algos.push_back(algo);
  }
  if (a.algos.empty()) algos = defaults;
  std::vector<std::pair<Algo, int>> out;
  for (Algo algo : algos) {
    if (algo == Algo::kCopyEngine || a.blocks.empty())
      out.push_back({algo, 0});
    else
      for (int b : a.blocks) out.push_back({algo, b});
  }
  return out;
}

// Checks (when -c) then times one case; rank 0 prints its row.
Row run_case(BenchContext& ctx, const std::string& op, const Case& c, size_t bytes_per_rank, size_t count, void* out,
             size_t out_bytes, const void* expected) {
  const Args& a = ctx.args();
  Row r;
  r.op = op;
  r.impl = c.impl;
  r.mode = a.graph ? "graph" : "eager";
  r.world = ctx.world();
  r.dtype = dtype_name(a.dtype);
  r.bytes_per_rank = bytes_per_rank;
  r.count = count;
  r.blocks = c.blocks;
  r.wrong = -1;
  if (a.check) {
    poison(out, out_bytes, ctx.stream());
    c.launch(ctx.stream());
    BENCH_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
    ctx.comm().check();
    r.wrong = ctx.sum_over_ranks(count_mismatches(out, expected, out_bytes, dtype_size(a.dtype), ctx.stream()));
  }
  r.time_us = ctx.time_us(c.launch, a.graph);
  compute_bandwidth(&r);
  return r;
}

// Checks and times every case of one size, compares with NCCL, prints (rank 0) and keeps the rows.
void run_size(BenchContext& ctx, const std::string& op, const std::vector<Case>& cases, size_t bytes, size_t count,
              void* out, size_t out_bytes, const void* expected, std::vector<Row>* rows) {
  std::vector<Row> size_rows;
  for (const auto& c : cases) size_rows.push_back(run_case(ctx, op, c, bytes, count, out, out_bytes, expected));
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
bool register_windows(BenchContext& ctx, std::initializer_list<Buffer*> buffers) {
  bool ok = true;
  for (Buffer* b : buffers) {
    ok = ctx.register_window(ctx.nccl_symmetric(), b->ptr(), b->size()) && ok;
    ok = ctx.register_window(ctx.nccl_copy_engine(), b->ptr(), b->size()) && ok;
  }
  ok = ctx.sum_over_ranks(ok ? 0 : 1) == 0;  // every rank runs the same rows
  if (!ok) ctx.progress("NCCL refused to register the heap buffers as windows; symmetric rows skipped");
  return ok;
}

void print_header(BenchContext& ctx, const std::string& op) {
  if (ctx.rank() != 0) return;
  std::printf("# symmem-bench %s: %d ranks, %s, %s\n", op.c_str(), ctx.world(), ctx.meta().gpu.c_str(),
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
  const bool windows = a.nccl && register_windows(ctx, {in, out});
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
      const std::string plan = describe_all_gather(out->ptr(), in->ptr(), count, type, comm);
      cases.push_back({"symmem_auto", blocks_of(plan),
                       [=, &comm](cudaStream_t s) { all_gather(out->ptr(), in->ptr(), count, type, comm, s); }});
    }
    for (auto [algo, blocks] : variants(a, {Algo::kPull, Algo::kPush, Algo::kCopyEngine})) {
      CollectiveOptions o;
      o.algo = algo;
      o.blocks = blocks;
      const std::string plan = describe_all_gather(out->ptr(), in->ptr(), count, type, comm, o);
      cases.push_back({std::string("symmem_") + algo_name(algo), blocks_of(plan),
                       [=, &comm](cudaStream_t s) { all_gather(out->ptr(), in->ptr(), count, type, comm, s, o); }});
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
  const size_t in_max = reduce_scatter ? max_bytes * world : max_bytes;
  Buffer* in = comm.allocate(in_max);
  Buffer* out = comm.allocate(max_bytes);
  void* expected = nullptr;
  BENCH_CUDA_CHECK(cudaMalloc(&expected, max_bytes));
  const bool windows = a.nccl && register_windows(ctx, {in, out});
  print_header(ctx, op);
  std::vector<Row> rows;
  for (size_t si = 0; si < sizes.size(); ++si) {
    const size_t bytes = sizes[si];  // output bytes
    const size_t count = bytes / elem;
    const size_t in_count = reduce_scatter ? count * world : count;
    ctx.progress(op + " " + std::to_string(si + 1) + "/" + std::to_string(sizes.size()) + ": " + format_bytes(bytes));
    // Inputs are small integers, so the reduction is exact in every type: expect equality.
    std::vector<double> acc(count, 0);
    for (int r = 0; r < world; ++r) {
      const auto data = host_data(in_count, a.dtype, seed_for(r, bytes, 1), Fill::kIntegers);
      if (r == ctx.rank()) upload(in->ptr(), data, ctx.stream());
      const size_t first = reduce_scatter ? ctx.rank() * count : 0;
      for (size_t i = 0; i < count; ++i) {
        const double v = element_to_double(data.data(), a.dtype, first + i);
        if (r == 0)
          acc[i] = v;
        else if (a.reduce_op == ReduceOp::kSum)
          acc[i] += v;
        else if (a.reduce_op == ReduceOp::kMax)
          acc[i] = std::max(acc[i], v);
        else
          acc[i] = std::min(acc[i], v);
      }
    }
    // The expected values, written by the device in the output type (exact for integers).
    {
      std::vector<uint8_t> typed(bytes);
      for (size_t i = 0; i < count; ++i) {
        const auto one = [&]() {
          std::vector<uint8_t> v(elem);
          const int x = static_cast<int>(acc[i]);
          switch (a.dtype) {
            case DataType::kFloat32: {
              float f = static_cast<float>(x);
              std::memcpy(v.data(), &f, 4);
              break;
            }
            case DataType::kFloat16: {
              __half h = __float2half(static_cast<float>(x));
              std::memcpy(v.data(), &h, 2);
              break;
            }
            case DataType::kBFloat16: {
              __nv_bfloat16 h = __float2bfloat16(static_cast<float>(x));
              std::memcpy(v.data(), &h, 2);
              break;
            }
            case DataType::kInt32: {
              int32_t y = x;
              std::memcpy(v.data(), &y, 4);
              break;
            }
            case DataType::kUInt8: v[0] = static_cast<uint8_t>(x); break;
          }
          return v;
        }();
        std::memcpy(typed.data() + i * elem, one.data(), elem);
      }
      upload(expected, typed, ctx.stream());
    }

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
        plan = reduce_scatter ? describe_reduce_scatter(out->ptr(), in->ptr(), count, type, comm, o)
                              : describe_all_reduce(out->ptr(), in->ptr(), count, type, comm, o);
      } catch (const Error& e) {
        if (ctx.rank() == 0) std::printf("# %s skipped at %zu bytes: %s\n", name.c_str(), bytes, e.what());
        return;
      }
      cases.push_back({name, blocks_of(plan), [=, &comm](cudaStream_t s) {
                         if (reduce_scatter)
                           symmem::reduce_scatter(out->ptr(), in->ptr(), count, type, rop, comm, s, o);
                         else
                           symmem::all_reduce(out->ptr(), in->ptr(), count, type, rop, comm, s, o);
                       }});
    };
    symmem_case("symmem_auto", CollectiveOptions{});
    const std::vector<Algo> algos =
        reduce_scatter ? std::vector<Algo>{Algo::kTwoShot, Algo::kTwoShotPush}
                       : std::vector<Algo>{Algo::kOneShot,     Algo::kOneShotPush, Algo::kTwoShot,
                                           Algo::kTwoShotPush, Algo::kLowLatency,  Algo::kLowLatencyTwoShot};
    for (auto [algo, blocks] : variants(a, algos)) {
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
    if (r.impl.rfind("symmem_", 0) != 0 || r.impl == "symmem_auto" || r.wrong > 0) continue;
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
