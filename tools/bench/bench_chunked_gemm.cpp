#include "bench_chunked_gemm.hpp"

#include <cstdio>
#include <string>

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
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(second);
  return rows;
}

}  // namespace symmem::bench
