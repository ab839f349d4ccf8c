// symmem-bench command line, in the style of nccl-tests. No CUDA here (unit-tested on CPUs).
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "symmem/types.hpp"

namespace symmem::bench {

struct Args {
  std::string op = "all_gather";           // all_gather | all_reduce | reduce_scatter | overlap
  size_t min_bytes = 1 << 10;              // -b; per rank for all_gather / reduce_scatter, whole tensor for all_reduce
  size_t max_bytes = 256u << 20;           // -e
  double factor = 2;                       // -f
  int iters = 20;                          // -n: calls per timed batch
  int warmup = 5;                          // -w
  int reps = 5;                            // --reps: batches per configuration, interleaved (ABAB...)
  bool check = true;                       // -c 0|1
  DataType dtype = DataType::kFloat16;     // -d
  ReduceOp reduce_op = ReduceOp::kSum;     // -o
  std::vector<int> blocks;                 // --blocks 4,8,16: SM budgets to sweep (empty: planner's choice)
  std::vector<std::string> algos;          // --algos pull,push,copy_engine (empty: every algorithm of the op)
  std::vector<size_t> sizes;               // --shapes MxN,...  (elements of dtype per rank) or --sizes
  bool nccl = true;                        // --nccl 0|1
  std::vector<int> nccl_ctas;              // --nccl-ctas 4,8,16: extra NCCL comms with min=max CTAs
  bool graph = false;                      // --graph: time CUDA-graph replays of n calls
  int gpus = 0;                            // --gpus N: ranks to start when not launched (0: every GPU)
  int simulate_nodes = 0;                  // --simulate-nodes K: ranks started in K simulated nodes
  std::string csv = "symmem_bench.csv";    // --csv
  std::string json = "symmem_bench.json";  // --json
  std::string tune;                        // --tune FILE: write the tuning table from this run
  bool vllm_table = false;                 // --vllm-table (all_reduce)
  std::string splits = "uniform";          // --splits uniform|zipf|onehot (all_to_all)
  // overlap
  int gemm_m = 8192, gemm_n = 8192, gemm_k = 8192;  // --gemm MxNxK
  size_t overlap_bytes = 64u << 20;                 // --ag-bytes: all-gather output bytes
  std::vector<int> chunks{2, 4};                    // --chunks: chunked_gemm row blocks
  std::string command_line;                         // as typed, less where results go (--csv, --json, --tune)
};

// Returns false with a message in *error (and usage text) for bad arguments.
bool parse_args(const std::vector<std::string>& argv, Args* args, std::string* error);
std::string usage();

// The command that reproduces a run, for every row of its report: the settings of symmem that
// change what runs (`SYMMEM_TUNING_FILE=...`; from `environment`, in this order), then
// "symmem-bench" and the arguments (each quoted where it holds a space).
std::string reproducing_command(const std::vector<std::pair<std::string, std::string>>& environment,
                                const std::string& command_line);
// The environment variables reproducing_command records when they are set.
const std::vector<const char*>& settings_that_change_a_run();

// Sizes of the sweep: from min to max by factor, rounded down to whole elements (at least one).
std::vector<size_t> sweep_sizes(const Args& args);

// "2048x4096" -> 8388608 (elements); throws std::invalid_argument.
size_t parse_shape(const std::string& shape);
// "1K", "64M", "1G", "4096" -> bytes; throws std::invalid_argument.
size_t parse_bytes(const std::string& text);

}  // namespace symmem::bench
