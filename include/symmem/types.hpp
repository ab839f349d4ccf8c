// Element types, reductions, algorithms and per-call options shared by every collective.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace symmem {

// Ranks of one NVLink domain (a node) that a communicator supports.
constexpr int kMaxWorld = 8;

enum class DataType { kFloat32, kFloat16, kBFloat16, kInt32, kUInt8 };
// kAvg: the float32 sum times 1 / world (a correctly rounded float32) before the one rounding to
// the element type (floating types only), in the reduction kernels themselves. The fused
// matmul_reduce_scatter has no average (symmem.torch divides its rounded sum: fused.md).
enum class ReduceOp { kSum, kMax, kMin, kAvg };

// What a collective runs. kAuto asks the planner (tuning table, then built-in rules);
// SYMMEM_ALGO=<name> overrides kAuto for every call. Each collective accepts a subset and
// rejects the others with kInvalidArgument. Each enumerator keys a row of the table of algorithms
// (src/plan/algorithms.cpp), which says what it needs and which kernel runs it.
enum class Algo {
  kAuto,
  kPull,               // all-gather: every rank reads its peers' inputs with SM loads;
                       // reduce-scatter: every rank reads its slice of every input and reduces it
  kPush,               // all-gather: every rank stores its input into its peers' outputs;
                       // reduce-scatter: every rank stores slice p of its input into rank p's
                       // receive area, then reduces what it received (one barrier)
  kCopyEngine,         // all-gather: the copy engines move the data; zero SMs
  kOneShot,            // all-reduce: every rank reads every input and reduces all of it
  kOneShotPush,        // all-reduce: every rank stores its input into every peer; one barrier
  kTwoShot,            // all-reduce: each rank reduces 1/world, then all-gathers (reduce-scatter:
                       // the earlier name of its pull)
  kTwoShotPush,        // all-reduce: two-shot whose NVLink traffic is stores only (reduce-scatter:
                       // the earlier name of its push)
  kLowLatency,         // all-reduce, all-gather, reduce-scatter: data and flag in one store; no barriers
  kLowLatencyTwoShot,  // all-reduce: low latency, each rank reducing 1/world (mid sizes)
  kHierarchical,       // all-gather across nodes: NCCL between nodes, copy engines inside each (zero SMs);
                       // what kAuto runs whenever the communicator spans nodes
  kPipelined,          // all-reduce, reduce-scatter: two-shot in rounds through fixed slots, stores only;
                       // local operands without staging, any size in one kernel
};

size_t dtype_size(DataType type);
const char* dtype_name(DataType type);                      // "float32", "float16", "bfloat16", "int32", "uint8"
bool parse_dtype(const std::string& name, DataType* type);  // also "fp32", "half", "bf16", ...
// Element i of host memory holding `type` values, as a double (for references and checks).
double element_to_double(const void* data, DataType type, size_t i);
const char* reduce_op_name(ReduceOp op);
bool parse_reduce_op(const std::string& name, ReduceOp* op);
const char* algo_name(Algo algo);  // "auto", "pull", "push", "copy_engine", ...
bool parse_algo(const std::string& name, Algo* algo);

struct CollectiveOptions {
  Algo algo = Algo::kAuto;
  // Thread blocks (SMs) for SM algorithms; 0 lets the planner choose.
  int blocks = 0;
  // Upper bound on SMs the planner may use; 0 means "no SMs": all-gather takes the copy engine.
  // Negative means no bound.
  int max_blocks = -1;
};

}  // namespace symmem
