#include "args.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace symmem::bench {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

std::vector<int> parse_int_list(const std::string& s) {
  std::vector<int> out;
  for (const auto& item : split(s, ',')) {
    size_t used = 0;
    int v = std::stoi(item, &used);
    if (used != item.size() || v < 0) throw std::invalid_argument("'" + item + "' is not a count");
    out.push_back(v);
  }
  return out;
}

}  // namespace

size_t parse_bytes(const std::string& text) {
  if (text.empty()) throw std::invalid_argument("empty size");
  size_t used = 0;
  const double value = std::stod(text, &used);
  size_t scale = 1;
  const std::string unit = text.substr(used);
  if (unit.empty() || unit == "B")
    scale = 1;
  else if (unit == "K" || unit == "KB" || unit == "KiB")
    scale = size_t(1) << 10;
  else if (unit == "M" || unit == "MB" || unit == "MiB")
    scale = size_t(1) << 20;
  else if (unit == "G" || unit == "GB" || unit == "GiB")
    scale = size_t(1) << 30;
  else
    throw std::invalid_argument("'" + text + "' has an unknown unit");
  if (value < 0) throw std::invalid_argument("'" + text + "' is negative");
  return static_cast<size_t>(value * static_cast<double>(scale));
}

size_t parse_shape(const std::string& shape) {
  const auto x = shape.find('x');
  if (x == std::string::npos) throw std::invalid_argument("shape '" + shape + "' is not MxN");
  size_t used_m = 0, used_n = 0;
  const unsigned long m = std::stoul(shape.substr(0, x), &used_m);
  const unsigned long n = std::stoul(shape.substr(x + 1), &used_n);
  if (used_m != x || used_n != shape.size() - x - 1 || m == 0 || n == 0)
    throw std::invalid_argument("shape '" + shape + "' is not MxN");
  return m * n;
}

std::string usage() {
  return "usage: symmem-bench [all_gather|all_reduce|reduce_scatter|all_to_all|overlap|host_cost|chunked_gemm] "
         "[options]\n"
         "  -b BYTES   smallest size (default 1K; per rank for all_gather/reduce_scatter)\n"
         "  -e BYTES   largest size (default 256M)\n"
         "  -f FACTOR  size multiplier between steps (default 2)\n"
         "  -n ITERS   calls per timed batch (default 20)\n"
         "  -w ITERS   warm-up calls (default 5)\n"
         "  --reps N   batches per configuration (default 5), interleaved: each repetition times one\n"
         "             batch of every configuration in turn; median, min and max reported\n"
         "  -c 0|1     check results (default 1): output poisoned before every batch and compared\n"
         "             bit for bit after it with the expected gather / the float64 reference of the\n"
         "             reduction, then the same bits on every rank\n"
         "  -d TYPE    float16|bfloat16|float32|int32|uint8 (default float16)\n"
         "  -o OP      sum|max|min for reductions (default sum)\n"
         "  --blocks LIST     SM block counts to sweep, e.g. 4,8,16,32\n"
         "  --algos LIST      symmem algorithms to run (pull,push,copy_engine,one_shot,two_shot,low_latency)\n"
         "  --shapes LIST     per-rank tensor shapes MxN of TYPE instead of -b/-e, e.g. 2048x4096\n"
         "  --nccl 0|1        run NCCL rows (default 1)\n"
         "  --nccl-ctas LIST  extra NCCL rows with a fixed CTA count each\n"
         "  --graph           time CUDA-graph replays instead of eager launches\n"
         "  --gpus N          ranks to start (default: every GPU) when not under a launcher\n"
         "  --simulate-nodes K  start the ranks as K nodes of one host (symmem-run --simulate-nodes):\n"
         "                    symmem and NCCL both move data between them over the network\n"
         "  --csv FILE --json FILE   result files (default symmem_bench.csv/.json)\n"
         "  --tune FILE       write the tuning table (JSON) chosen from this run\n"
         "  --vllm-table      all_reduce: vLLM-style table over T x 8192 bf16: nccl, nccl_symmetric\n"
         "                    (ncclMemAlloc + symmetric windows), symmem_auto and every algorithm\n"
         "  --gemm MxNxK --ag-bytes BYTES   overlap: GEMM shape and all-gather output size\n"
         "  --splits uniform|zipf|onehot   all_to_all: how each rank's bytes split over the ranks\n"
         "  host_cost: CPU time to issue one call at -b bytes per rank (-n calls per sample behind a\n"
         "             GPU spin, --reps samples), symmem against NCCL and a bare kernel launch\n"
         "  chunked_gemm: --gemm MxNxK (row-major C = A B) as one GEMM and as --chunks LIST row blocks\n"
         "             (default 2,4), on one stream and on two: what a fused all-gather + GEMM pays\n";
}

const std::vector<const char*>& settings_that_change_a_run() {
  static const std::vector<const char*> names{"SYMMEM_TUNING_FILE", "SYMMEM_ALGO",        "SYMMEM_BLOCKS",
                                              "SYMMEM_PUSH_BULK",   "SYMMEM_PDL",         "SYMMEM_CE_DIRECTION",
                                              "SYMMEM_CE_BATCH",    "SYMMEM_CE_STREAMS",  "SYMMEM_CE_PIECE_KB",
                                              "SYMMEM_MOE_COMBINE", "SYMMEM_WORKSPACE_MB"};
  return names;
}

std::string reproducing_command(const std::vector<std::pair<std::string, std::string>>& environment,
                                const std::string& command_line) {
  std::string out;
  for (const auto& [name, value] : environment) out += name + "=" + value + " ";
  return out + "symmem-bench" + (command_line.empty() ? "" : " " + command_line);
}

bool parse_args(const std::vector<std::string>& argv, Args* a, std::string* error) {
  size_t i = 0;
  for (size_t k = 0; k < argv.size(); ++k) {
    // Where the results go does not change them: left out of the recorded command.
    if ((argv[k] == "--csv" || argv[k] == "--json" || argv[k] == "--tune") && k + 1 < argv.size()) {
      ++k;
      continue;
    }
    const std::string& s = argv[k];
    a->command_line += (a->command_line.empty() ? "" : " ") + (s.find(' ') == std::string::npos ? s : "'" + s + "'");
  }
  if (i < argv.size() && !argv[i].empty() && argv[i][0] != '-') {
    a->op = argv[i++];
    if (a->op != "all_gather" && a->op != "all_reduce" && a->op != "reduce_scatter" && a->op != "overlap" &&
        a->op != "host_cost" && a->op != "chunked_gemm" && a->op != "all_to_all") {
      *error = "unknown operation '" + a->op + "'";
      return false;
    }
  }
  if (a->op == "all_reduce") a->dtype = DataType::kBFloat16;
  try {
    for (; i < argv.size(); ++i) {
      const std::string& f = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argv.size()) throw std::invalid_argument(f + " needs a value");
        return argv[++i];
      };
      if (f == "-b")
        a->min_bytes = parse_bytes(value());
      else if (f == "-e")
        a->max_bytes = parse_bytes(value());
      else if (f == "-f")
        a->factor = std::stod(value());
      else if (f == "-n")
        a->iters = std::stoi(value());
      else if (f == "-w")
        a->warmup = std::stoi(value());
      else if (f == "--reps")
        a->reps = std::stoi(value());
      else if (f == "-c")
        a->check = std::stoi(value()) != 0;
      else if (f == "-d") {
        const std::string t = value();
        if (!parse_dtype(t, &a->dtype)) throw std::invalid_argument("unknown type '" + t + "'");
      } else if (f == "-o") {
        const std::string o = value();
        if (!parse_reduce_op(o, &a->reduce_op)) throw std::invalid_argument("unknown reduction '" + o + "'");
        // Every row is checked for equality with sums of small integers, which an average is not.
        if (a->reduce_op == ReduceOp::kAvg)
          throw std::invalid_argument("-o avg: symmem-bench checks exact results (sum, max, min); nccl-tests "
                                      "through libsymmem_nccl.so measure averages");
      } else if (f == "--blocks")
        a->blocks = parse_int_list(value());
      else if (f == "--algos") {
        a->algos = split(value(), ',');
        for (const auto& name : a->algos) {
          Algo algo;
          if (!parse_algo(name, &algo)) throw std::invalid_argument("unknown algorithm '" + name + "'");
        }
      } else if (f == "--shapes") {
        for (const auto& s : split(value(), ',')) a->sizes.push_back(parse_shape(s) * dtype_size(a->dtype));
      } else if (f == "--nccl")
        a->nccl = std::stoi(value()) != 0;
      else if (f == "--nccl-ctas")
        a->nccl_ctas = parse_int_list(value());
      else if (f == "--graph")
        a->graph = true;
      else if (f == "--gpus")
        a->gpus = std::stoi(value());
      else if (f == "--simulate-nodes")
        a->simulate_nodes = std::stoi(value());
      else if (f == "--csv")
        a->csv = value();
      else if (f == "--json")
        a->json = value();
      else if (f == "--tune")
        a->tune = value();
      else if (f == "--vllm-table")
        a->vllm_table = true;
      else if (f == "--splits") {
        a->splits = value();
        if (a->splits != "uniform" && a->splits != "zipf" && a->splits != "onehot")
          throw std::invalid_argument("--splits takes uniform, zipf or onehot, not '" + a->splits + "'");
      } else if (f == "--gemm") {
        const auto dims = split(value(), 'x');
        if (dims.size() != 3) throw std::invalid_argument("--gemm takes MxNxK");
        a->gemm_m = std::stoi(dims[0]);
        a->gemm_n = std::stoi(dims[1]);
        a->gemm_k = std::stoi(dims[2]);
      } else if (f == "--chunks") {
        a->chunks.clear();
        for (const auto& c : split(value(), ',')) a->chunks.push_back(std::stoi(c));
      } else if (f == "--ag-bytes")
        a->overlap_bytes = parse_bytes(value());
      else if (f == "-h" || f == "--help") {
        *error = "";
        return false;
      } else
        throw std::invalid_argument("unknown option '" + f + "'");
    }
  } catch (const std::exception& e) {
    *error = e.what();
    return false;
  }
  if (a->min_bytes == 0 || a->max_bytes < a->min_bytes) {
    *error = "need 0 < -b <= -e";
    return false;
  }
  if (a->factor <= 1.0) {
    *error = "-f must be greater than 1";
    return false;
  }
  if (a->iters < 1 || a->warmup < 0 || a->reps < 1) {
    *error = "-n and --reps must be >= 1 and -w >= 0";
    return false;
  }
  return true;
}

std::vector<size_t> sweep_sizes(const Args& a) {
  const size_t elem = dtype_size(a.dtype);
  std::vector<size_t> sizes;
  if (!a.sizes.empty()) return a.sizes;
  for (double b = static_cast<double>(a.min_bytes); b <= static_cast<double>(a.max_bytes) * 1.000001; b *= a.factor) {
    size_t bytes = static_cast<size_t>(b) / elem * elem;
    if (bytes == 0) bytes = elem;
    if (sizes.empty() || sizes.back() != bytes) sizes.push_back(bytes);
  }
  return sizes;
}

}  // namespace symmem::bench
