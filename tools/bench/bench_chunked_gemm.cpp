#include "bench_chunked_gemm.hpp"

#include <cstdio>
#include <string>

#include "flagged_gemm_variants.hpp"
#include "fused/flagged_gemm.hpp"
#include "gemm.hpp"

namespace symmem::bench {

std::vector<Row> run_chunked_gemm(BenchContext& ctx) {
  const Args& a = ctx.args();
  const DataType type = a.dtype == DataType::kBFloat16 ? DataType::kBFloat16 : DataType::kFloat16;
  Gemm gemm(a.gemm_m, a.gemm_n, a.gemm_k, type, ctx.stream());
  cudaStream_t second = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  BENCH_CUDA_CHECK(cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking));
  BENCH_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  BENCH_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));

  // The inputs are small integers: fp32 accumulation is exact in any order, so every layout must
  // give the full GEMM's bits, checked after every batch (measure() poisons C before each).
  gemm.run(ctx.stream());
  void* expected = nullptr;
  BENCH_CUDA_CHECK(cudaMalloc(&expected, gemm.c_bytes()));
  BENCH_CUDA_CHECK(cudaMemcpyAsync(expected, gemm.c(), gemm.c_bytes(), cudaMemcpyDeviceToDevice, ctx.stream()));
  BENCH_CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
  std::vector<std::string> names{"gemm_alone"};
  std::vector<Config> configs(1);
  configs[0].launch = [&](cudaStream_t s) { gemm.run(s); };
  for (int chunks : a.chunks) {
    if (chunks < 1 || a.gemm_m % chunks != 0) {
      if (ctx.rank() == 0) std::printf("# %d chunks skipped: M=%d is not a multiple\n", chunks, a.gemm_m);
      continue;
    }
    const int rows = a.gemm_m / chunks;
    names.push_back("chunks" + std::to_string(chunks) + "_one_stream");
    configs.push_back({});
    configs.back().launch = [&, chunks, rows](cudaStream_t s) {
      for (int c = 0; c < chunks; ++c) gemm.run_rows(c * rows, rows, s);
    };
    // Alternate chunks between the stream and a second one, so that one chunk's tail wave runs
    // beside the next chunk's first.
    names.push_back("chunks" + std::to_string(chunks) + "_two_streams");
    configs.push_back({});
    configs.back().launch = [&, chunks, rows](cudaStream_t s) {
      BENCH_CUDA_CHECK(cudaEventRecord(fork, s));
      BENCH_CUDA_CHECK(cudaStreamWaitEvent(second, fork, 0));
      for (int c = 0; c < chunks; ++c) gemm.run_rows(c * rows, rows, c % 2 ? second : s, c % 2);
      BENCH_CUDA_CHECK(cudaEventRecord(join, second));
      BENCH_CUDA_CHECK(cudaStreamWaitEvent(s, join, 0));
    };
  }
  // The fused op's persistent GEMM with every flag already set (its cost without communication),
  // in the tile width it chooses for the shape, in each tile order: M bands taken 1 or 2 at a time
  // (4 and 8 measured slower), rasterised along N or M.
  int device = 0, sms = 0;
  BENCH_CUDA_CHECK(cudaGetDevice(&device));
  BENCH_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  uint32_t* flags = nullptr;
  std::string flagged_gemm_why;
  if (detail::flagged_gemm_built(&flagged_gemm_why)) {
    const int tiles = (a.gemm_m + detail::kFlaggedGemmTileRows - 1) / detail::kFlaggedGemmTileRows;
    BENCH_CUDA_CHECK(cudaMalloc(&flags, sizeof(uint32_t) * tiles));
    BENCH_CUDA_CHECK(cudaMemset(flags, 0x01, sizeof(uint32_t) * tiles));  // nonzero: arrived
    detail::FlaggedGemm fg{};
    fg.a = gemm.a();
    fg.b = gemm.b();
    fg.c = gemm.c();
    fg.m = a.gemm_m;
    fg.n = a.gemm_n;
    fg.k = a.gemm_k;
    fg.type = type;
    fg.sm_count = sms;
    fg.chunks.flags = flags;
    fg.chunks.rows = fg.m;
    fg.chunks.shard_rows = fg.m;
    fg.chunks.piece_rows = detail::kFlaggedGemmTileRows;
    fg.chunks.pieces = tiles;
    fg.chunks.tile_rows = detail::kFlaggedGemmTileRows;
    fg.chunks.tiles = tiles;
    const std::string why = detail::flagged_gemm_problem(fg);
    for (bool along_m : {false, true}) {
      for (int swizzle : {1, 2}) {
        if (!why.empty()) break;
        fg.raster_along_m = along_m;
        fg.swizzle = swizzle;
        names.push_back(std::string("flagged_raster_") + (along_m ? "m" : "n") + "_swizzle" + std::to_string(swizzle));
        configs.push_back({});
        configs.back().launch = [fg](cudaStream_t s) { detail::run_flagged_gemm(fg, s); };
      }
    }
    for (const GemmVariant& v : type == DataType::kFloat16 ? flagged_gemm_variants() : std::vector<GemmVariant>{}) {
      detail::FlaggedGemm vg = fg;
      const std::string problem = v.problem(vg);
      if (!problem.empty()) {
        if (ctx.rank() == 0) std::printf("# %s skipped: %s\n", v.name.c_str(), problem.c_str());
        continue;
      }
      for (bool along_m : {false, true}) {
        vg.raster_along_m = along_m;
        vg.swizzle = 1;
        names.push_back(v.name + "_raster_" + (along_m ? "m" : "n"));
        configs.push_back({});
        configs.back().launch = [vg, run = v.run](cudaStream_t s) { run(vg, s); };
      }
    }
    if (!why.empty() && ctx.rank() == 0) std::printf("# flagged GEMM rows skipped: %s\n", why.c_str());
  } else if (ctx.rank() == 0) {
    std::printf("# flagged GEMM rows skipped: %s\n", flagged_gemm_why.c_str());
  }
  for (Config& c : configs) {
    c.out = gemm.c();
    c.out_bytes = gemm.c_bytes();
    c.expected = expected;
    c.elem_bytes = dtype_size(type);
  }
  const std::vector<Measurement> measured = ctx.measure(configs, false);
  std::vector<Row> rows;
  const std::string shape = std::to_string(a.gemm_m) + "x" + std::to_string(a.gemm_n) + "x" + std::to_string(a.gemm_k);
  if (ctx.rank() == 0)
    std::printf("# chunked_gemm %s (MxNxK, row-major), %s, %d ranks; median of %d batches of %d calls [min, max]\n",
                shape.c_str(), dtype_name(type), ctx.world(), a.reps, a.iters);
  if (ctx.rank() == 0) {
    std::printf("# cuBLASLt's choice: %s; the flagged GEMM's tiles: 128 x %d\n",
                gemm.algo_description(a.gemm_m).c_str(), detail::flagged_gemm_tile_n(a.gemm_m, a.gemm_n, sms));
  }
  for (size_t i = 0; i < configs.size(); ++i) {
    Row r = new_row(ctx, "chunked_gemm_" + shape, names[i], type, 0, 0, 0);
    apply(measured[i], &r);
    if (ctx.rank() == 0)
      std::printf("%-24s %10.1f us [%8.1f, %8.1f]  %.3fx gemm_alone  #wrong %ld\n", names[i].c_str(), r.time_us,
                  r.time_min_us, r.time_max_us, r.time_us / measured[0].median_us, r.wrong);
    rows.push_back(r);
  }
  std::fflush(stdout);
  BENCH_CUDA_CHECK(cudaFree(expected));
  if (flags) BENCH_CUDA_CHECK(cudaFree(flags));
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(second);
  return rows;
}

}  // namespace symmem::bench
