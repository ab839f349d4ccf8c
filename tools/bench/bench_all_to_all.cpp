#include "bench_all_to_all.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "bench_collectives.hpp"

namespace symmem::bench {
namespace {

// Rows of the variable forms (a 128-element row of 16-bit values).
constexpr size_t kRowBytes = 256;

// M[s][q]: bytes rank s sends rank q, every rank sending `bytes` in all (whole rows, except uniform).
std::vector<std::vector<size_t>> split_matrix(const std::string& splits, int world, size_t bytes, size_t elem) {
  std::vector<std::vector<size_t>> m(world, std::vector<size_t>(world, 0));
  for (int s = 0; s < world; ++s) {
    if (splits == "uniform") {
      for (int q = 0; q < world; ++q) m[s][q] = bytes / world / elem * elem;
    } else if (splits == "onehot") {
      m[s][0] = bytes / kRowBytes * kRowBytes;  // everything to rank 0 (at capacity)
    } else {                                    // zipf, s = 1.1, the sender's nearest neighbours first
      const size_t rows = bytes / kRowBytes;
      double total = 0;
      for (int k = 0; k < world; ++k) total += 1.0 / std::pow(1.0 + k, 1.1);
      size_t given = 0;
      for (int k = 0; k < world; ++k) {
        const int q = (s + 1 + k) % world;
        const size_t r = static_cast<size_t>(std::floor(rows * (1.0 / std::pow(1.0 + k, 1.1)) / total));
        m[s][q] = r * kRowBytes;
        given += r;
      }
      m[s][(s + 1) % world] += (rows - given) * kRowBytes;
    }
  }
  return m;
}

}  // namespace

std::vector<Row> run_all_to_all(BenchContext& ctx) {
  const Args& a = ctx.args();
  const int world = ctx.world(), me = ctx.rank();
  const size_t elem = dtype_size(a.dtype);
  const auto sizes = sweep_sizes(a);
  const size_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
  Communicator& comm = ctx.comm();
  if (comm.nodes() > 1) throw std::runtime_error("all_to_all: symmem's all-to-all runs inside one node");
  const bool uniform = a.splits == "uniform";
  // The output holds what one rank may receive: everything of every rank (one-hot).
  const size_t out_span = max_bytes * world;
  Buffer* in = comm.allocate(max_bytes);
  Buffer* out = comm.allocate(out_span);
  void *expected = nullptr, *in_splits = nullptr, *out_splits_offsets = nullptr;
  BENCH_CUDA_CHECK(cudaMalloc(&expected, out_span));
  BENCH_CUDA_CHECK(cudaMalloc(&in_splits, world * sizeof(int64_t)));
  BENCH_CUDA_CHECK(cudaMalloc(&out_splits_offsets, 2 * world * sizeof(int64_t)));
  if (ctx.rank() == 0) {
    std::printf("# symmem-bench all_to_all: %d ranks, %s splits, %s, %s\n", world, a.splits.c_str(),
                ctx.meta().gpu.c_str(), a.graph ? "CUDA graph replay" : "eager launches");
    std::printf("%s\n", table_header().c_str());
  }
  std::vector<Row> rows;
  for (size_t si = 0; si < sizes.size(); ++si) {
    const size_t bytes = sizes[si];
    if (!uniform && bytes < kRowBytes * world) continue;  // not a row per pair
    const auto m = split_matrix(a.splits, world, bytes, elem);
    ctx.progress("all_to_all " + std::to_string(si + 1) + "/" + std::to_string(sizes.size()) + ": " +
                 format_bytes(bytes) + " per rank, " + a.splits);
    // Inputs and the expected output: rank s's bytes for q start at the sum of its earlier splits
    // and land after the bytes of every lower rank; what nobody writes keeps the poison (0xFF).
    const size_t count = bytes / elem;
    upload(in->ptr(), host_data(count, a.dtype, seed_for(me, bytes, 3), Fill::kBits), ctx.stream());
    std::vector<uint8_t> want(out_span, 0xFF);
    size_t at = 0;
    for (int s = 0; s < world; ++s) {
      const auto theirs = host_data(count, a.dtype, seed_for(s, bytes, 3), Fill::kBits);
      size_t from = 0;
      for (int q = 0; q < me; ++q) from += m[s][q];
      std::memcpy(want.data() + at, theirs.data() + from, m[s][me]);
      at += m[s][me];
    }
    upload(expected, want, ctx.stream());
    std::vector<int64_t> in_rows(world), out_rows(world);
    for (int q = 0; q < world; ++q) {
      in_rows[q] = int64_t(m[me][q] / kRowBytes);
      out_rows[q] = int64_t(m[q][me] / kRowBytes);
    }
    BENCH_CUDA_CHECK(cudaMemcpy(in_splits, in_rows.data(), world * sizeof(int64_t), cudaMemcpyHostToDevice));

    std::vector<Candidate> cases;
    if (a.nccl) {
      // torch.distributed.all_to_all_single's NCCL path: a send and a receive per peer in one group.
      std::vector<size_t> send_off(world, 0), recv_off(world, 0);
      for (int q = 1; q < world; ++q) {
        send_off[q] = send_off[q - 1] + m[me][q - 1];
        recv_off[q] = recv_off[q - 1] + m[q - 1][me];
      }
      ncclComm_t nccl = ctx.nccl();
      cases.push_back({"nccl", -1, [=](cudaStream_t s) {
                         BENCH_NCCL_CHECK(ncclGroupStart());
                         for (int q = 0; q < world; ++q) {
                           BENCH_NCCL_CHECK(
                               ncclSend(static_cast<char*>(in->ptr()) + send_off[q], m[me][q], ncclUint8, q, nccl, s));
                           BENCH_NCCL_CHECK(
                               ncclRecv(static_cast<char*>(out->ptr()) + recv_off[q], m[q][me], ncclUint8, q, nccl, s));
                         }
                         BENCH_NCCL_CHECK(ncclGroupEnd());
                       }});
    }
    auto add = [&](const std::string& name, const std::function<std::string()>& describe, const Launch& launch) {
      std::string plan;
      try {
        plan = describe();
      } catch (const Error& e) {
        if (ctx.rank() == 0) std::printf("# %s skipped at %zu bytes: %s\n", name.c_str(), bytes, e.what());
        return;
      }
      require_zero_copy(name, plan);
      cases.push_back({name, blocks_of(plan), launch});
    };
    // auto, then the table's all-to-all rows (plan/algorithms.hpp) at every requested block count;
    // the variable forms have no copy engine (their offsets are known on the device only).
    std::vector<std::pair<Algo, int>> runs{{Algo::kAuto, 0}};
    for (const auto& [algo, blocks] : variants(a, detail::Collective::kAllToAll))
      if (uniform || detail::find_algorithm(detail::Collective::kAllToAll, algo)->uses_sms)
        runs.push_back({algo, blocks});
    const size_t pair = m[0][0];
    const size_t in_row_count = bytes / kRowBytes, out_row_count = out_span / kRowBytes;
    for (const auto& [algo, blocks] : runs) {
      const CollectiveOptions o{algo, blocks, -1};
      const std::string suffix = std::string(algo_name(algo)) + (blocks ? "_b" + std::to_string(blocks) : "");
      if (uniform) {
        add(
            "symmem_" + suffix, [=, &comm] { return describe_all_to_all(out, in, pair, comm, o); },
            [=, &comm](cudaStream_t s) { all_to_all(out, in, pair, comm, s, o); });
      } else {
        add(
            "symmem_v_" + suffix,
            [=, &comm] {
              return describe_all_to_all_v(out, out_row_count, in, in_row_count, kRowBytes, false, 1, 0, comm, o);
            },
            [=, &comm](cudaStream_t s) {
              all_to_all_v(out, out_row_count, in, in_row_count, in_rows.data(), out_rows.data(), kRowBytes, comm, s,
                           o);
            });
      }
      if (algo == Algo::kAuto || !uniform) {
        add(
            "symmem_vdev_" + suffix,
            [=, &comm] {
              return describe_all_to_all_v(out, out_row_count, in, in_row_count, kRowBytes, true, 1, 0, comm, o);
            },
            [=, &comm](cudaStream_t s) {
              all_to_all_vdev(out, out_row_count, in, in_row_count, static_cast<const int64_t*>(in_splits),
                              static_cast<int64_t*>(out_splits_offsets), kRowBytes, comm, s, o);
            });
      }
    }
    // The uniform call moves bytes per pair that need not be whole rows: only rows fit vdev then.
    if (uniform && pair % kRowBytes != 0)
      cases.erase(std::remove_if(cases.begin(), cases.end(),
                                 [](const Candidate& c) { return c.impl.rfind("symmem_vdev", 0) == 0; }),
                  cases.end());
    std::vector<Config> configs;
    for (const auto& c : cases) {
      Config k;
      k.launch = c.launch;
      k.out = out->ptr();
      k.out_bytes = out_span;
      k.expected = expected;
      k.elem_bytes = 1;
      k.same_on_every_rank = false;
      configs.push_back(k);
    }
    report_size(ctx, uniform ? "all_to_all" : "all_to_all_" + a.splits, a.dtype, bytes, count, cases,
                ctx.measure(configs, a.graph), &rows);
  }
  BENCH_CUDA_CHECK(cudaFree(expected));
  BENCH_CUDA_CHECK(cudaFree(in_splits));
  BENCH_CUDA_CHECK(cudaFree(out_splits_offsets));
  comm.free(out);
  comm.free(in);
  return rows;
}

}  // namespace symmem::bench
