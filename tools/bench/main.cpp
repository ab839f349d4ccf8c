// symmem-bench: measures symmem against NCCL on the same buffers in the same run.
// Without a launcher (no RANK in the environment) it starts one process per local GPU itself.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "args.hpp"
#include "bench_all_to_all.hpp"
#include "bench_collectives.hpp"
#include "bench_chunked_gemm.hpp"
#include "bench_context.hpp"
#include "bench_host_cost.hpp"
#include "bench_overlap.hpp"
#include "launcher.hpp"
#include "plan/tuning_table.hpp"
#include "vllm_table.hpp"

using namespace symmem::bench;

namespace {

int self_launch(const Args& args, int argc, char** argv) {
  int gpus = 0;
  const cudaError_t err = cudaGetDeviceCount(&gpus);
  if (err != cudaSuccess || gpus == 0) {
    std::fprintf(stderr,
                 "symmem-bench: no CUDA GPU found (cudaGetDeviceCount: %s). symmem-bench measures "
                 "collectives and needs at least one GPU, two or more to measure communication.\n",
                 err == cudaSuccess ? "0 devices" : cudaGetErrorString(err));
    return 2;
  }
  symmem::launch::LaunchOptions options;
  options.processes = args.gpus > 0 ? std::min(args.gpus, gpus) : gpus;
  options.simulate_nodes = args.simulate_nodes;
  std::vector<std::string> command{"/proc/self/exe"};
  for (int i = 1; i < argc; ++i) command.push_back(argv[i]);
  std::fprintf(stderr, "symmem-bench: starting %d ranks, one per GPU\n", options.processes);
  return symmem::launch::run(options, command);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  std::string error;
  if (!parse_args(std::vector<std::string>(argv + 1, argv + argc), &args, &error)) {
    if (!error.empty()) std::fprintf(stderr, "symmem-bench: %s\n", error.c_str());
    std::fprintf(stderr, "%s", usage().c_str());
    return error.empty() ? 0 : 2;
  }
  // NVLink multicast stays off in this process and every rank it starts, whatever the caller set:
  // NCCL reads NCCL_NVLS_ENABLE when a communicator is created.
  symmem::launch::disable_multicast_in_environment();
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  if (!nvls || std::string(nvls) != "0") {
    std::fprintf(stderr, "symmem-bench: NCCL_NVLS_ENABLE=%s overridden to 0 (multicast stays off)\n", nvls ? nvls : "");
    ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  }
  if (!std::getenv("RANK")) return self_launch(args, argc, argv);
  try {
    BenchContext ctx(args);
    std::vector<Row> rows;
    if (args.op == "all_gather")
      rows = run_all_gather(ctx);
    else if (args.op == "overlap")
      rows = run_overlap(ctx);
    else if (args.op == "host_cost")
      rows = run_host_cost(ctx);
    else if (args.op == "chunked_gemm")
      rows = run_chunked_gemm(ctx);
    else if (args.op == "all_to_all")
      rows = run_all_to_all(ctx);
    else if (args.vllm_table)
      rows = run_vllm_table(ctx);
    else
      rows = run_reduction(ctx, args.op == "reduce_scatter");
    if (ctx.rank() == 0) {
      const Meta meta = ctx.meta();
      write_files(rows, meta, args.csv, args.json);
      std::fprintf(stderr, "symmem-bench: wrote %s and %s\n", args.csv.c_str(), args.json.c_str());
      if (!args.tune.empty()) {
        symmem::detail::TuningTable table;
        table.gpu = meta.gpu;
        table.command = meta.command;
        table.date = meta.date;
        table.entries = tuning_entries(rows);
        FILE* f = std::fopen(args.tune.c_str(), "w");
        if (!f) throw std::runtime_error("cannot write " + args.tune);
        const std::string text = symmem::detail::format_tuning_table(table);
        std::fwrite(text.data(), 1, text.size(), f);
        std::fclose(f);
        std::fprintf(stderr, "symmem-bench: wrote tuning table %s\n", args.tune.c_str());
      }
    }
    long wrong = 0;
    for (const auto& r : rows) wrong += r.wrong > 0 ? r.wrong : 0;
    if (wrong > 0) {
      std::fprintf(stderr, "symmem-bench: %ld wrong elements\n", wrong);
      return 3;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "symmem-bench rank %s: %s\n", std::getenv("RANK"), e.what());
    return 1;
  }
  return 0;
}
