// What every benchmark of one rank shares: the communicator, NCCL communicators on the same
// GPUs (plain, symmetric windows, zero-CTA copy engine, fixed CTA counts), a stream, interleaved
// timing by CUDA events with the -c checks around every batch (median and spread over batches,
// slowest rank each), and deterministic test data with exact references.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "args.hpp"
#include "check.hpp"
#include "report.hpp"
#include "symmem/symmem.hpp"

namespace symmem::bench {

#define BENCH_NCCL_CHECK(expr)                                                                           \
  do {                                                                                                   \
    ncclResult_t r_ = (expr);                                                                            \
    if (r_ != ncclSuccess) throw std::runtime_error(std::string(#expr) + ": " + ncclGetErrorString(r_)); \
  } while (0)

using Launch = std::function<void(cudaStream_t)>;

// One configuration of an interleaved comparison, and what -c checks of it.
struct Config {
  Launch launch;
  // The output: poisoned (0xFF) before every batch, outside the timed region, and compared bit
  // for bit with `expected` (device memory, out_bytes) after it; then, unless each rank holds its
  // own part of the result (reduce-scatter), every rank must hold the same bits.
  // out == nullptr: nothing to check (wrong = -1).
  void* out = nullptr;
  size_t out_bytes = 0;
  const void* expected = nullptr;
  size_t elem_bytes = 1;
  bool same_on_every_rank = true;
  // Left alone by the poison: this rank's input when it lies inside `out` (in-place all-gather).
  size_t keep_offset = 0, keep_bytes = 0;
};

struct Measurement {
  double median_us = 0, min_us = 0, max_us = 0;  // per call, over the batches (slowest rank each)
  long wrong = -1;  // most elements wrong after any check, summed over ranks; -1: not checked
};

class BenchContext {
 public:
  explicit BenchContext(const Args& args);
  ~BenchContext();

  int rank() const { return comm_->rank(); }
  int world() const { return comm_->world(); }
  Communicator& comm() { return *comm_; }
  int nodes() const { return comm_->nodes(); }
  cudaStream_t stream() const { return stream_; }
  const Args& args() const { return args_; }
  Meta meta() const;

  ncclComm_t nccl() const { return nccl_; }                 // plain: buffers never registered
  ncclComm_t nccl_symmetric() const { return nccl_sym_; }   // symmetric windows
  ncclComm_t nccl_copy_engine() const { return nccl_ce_; }  // symmetric windows + zero-CTA policy
  ncclComm_t nccl_with_ctas(int ctas);                      // created on first use
  // Registers each [p, p + bytes) as a symmetric window of `comm` (NCCL_WIN_COLL_SYMMETRIC), once
  // per comm and pointer. Collective; true on every rank when every rank succeeded, so that all
  // ranks run the same rows. The windows stay until release_windows().
  bool register_windows(ncclComm_t comm, const std::vector<std::pair<void*, size_t>>& ranges);
  void release_windows();  // before the registered buffers are freed

  // Times every configuration: a first call checked on its own, -w warm-up calls, then --reps
  // repetitions that each run one batch of -n back-to-back calls (or one CUDA graph of them) of
  // every configuration in turn (ABAB...), with -c checks around every batch. A host and a device
  // barrier line the ranks up before each batch. Collective.
  std::vector<Measurement> measure(const std::vector<Config>& configs, bool graph);
  long sum_over_ranks(long mine);
  bool same_on_all_ranks(uint64_t value);
  void host_barrier() { comm_->bootstrap().barrier(); }
  // Lines the ranks up on the device: symmem's barrier inside one node; across nodes, where symmem
  // offers no barrier, a one-element NCCL all-reduce.
  void device_barrier(cudaStream_t stream);
  void progress(const std::string& what) const;  // rank 0, stderr

 private:
  Args args_;
  std::unique_ptr<Communicator> comm_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  ncclComm_t nccl_ = nullptr;
  ncclComm_t nccl_sym_ = nullptr;
  ncclComm_t nccl_ce_ = nullptr;
  ncclComm_t line_up_comm_ = nullptr;  // across nodes: the device barrier's (nccl_ unless --nccl 0)
  float* line_up_ = nullptr;           // its one element
  std::map<int, ncclComm_t> nccl_ctas_;
  ncclUniqueId make_unique_id();
  ncclComm_t init_nccl(int cta_policy, int ctas);
  long check_output(const Config& config);  // collective: wrong elements summed over ranks
  std::map<std::pair<ncclComm_t, void*>, ncclWindow_t> windows_;
  std::string gpu_name_;
};

// The blocks a symmem plan description reports ("... blocks=16 ..."), or 0 (copy engine).
int blocks_of(const std::string& plan);
// Every symmem row passes heap Buffers (symmetric operands) so that it measures the zero-copy
// path; throws std::runtime_error naming the row when its plan stages an operand all the same.
void require_zero_copy(const std::string& impl, const std::string& plan);
ncclDataType_t nccl_type(DataType type);
ncclRedOp_t nccl_op(ReduceOp op);

// A row of this run with its identity filled in (mode from --graph).
Row new_row(const BenchContext& ctx, const std::string& op, const std::string& impl, DataType type,
            size_t bytes_per_rank, size_t count, int blocks);
// Sets the row's times and #wrong from a measurement, then its bandwidths.
void apply(const Measurement& m, Row* row);

// One implementation measured at one size: its row name, blocks, and what it launches.
struct Candidate {
  std::string impl;
  int blocks;  // -1: NCCL's / planner's own choice
  Launch launch;
};
// The rows of `cases` at one size from their measurements (in the same order), compared with
// NCCL's, printed (rank 0) and appended to `rows`.
void report_size(const BenchContext& ctx, const std::string& op, DataType type, size_t bytes, size_t count,
                 const std::vector<Candidate>& cases, const std::vector<Measurement>& measured, std::vector<Row>* rows);

// Device memory from ncclMemAlloc, what NCCL's symmetric kernels are documented to run on
// (registered with BenchContext::register_windows). Local; freed on destruction.
class NcclMemory {
 public:
  explicit NcclMemory(size_t bytes);
  ~NcclMemory();
  NcclMemory(const NcclMemory&) = delete;
  NcclMemory& operator=(const NcclMemory&) = delete;
  void* get() const { return p_; }
  size_t size() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Deterministic data for rank r at a given size. kBits: every bit random (gathers compare
// bytes). kIntegers: nonzero integers in [-16, 16] stored in the type, so any partial sum of up to
// 8 ranks is an integer of magnitude <= 128, exact in every type (bf16 holds integers up to 256),
// whatever the order of the additions: reductions are checked for equality with a float64
// reference, and a lost or doubled contribution always shows.
enum class Fill { kBits, kIntegers };
uint64_t seed_for(int rank, size_t bytes, int salt);
std::vector<uint8_t> host_data(size_t count, DataType type, uint64_t seed, Fill fill);
void upload(void* device, const std::vector<uint8_t>& host, cudaStream_t stream);
void poison(void* device, size_t bytes, cudaStream_t stream);  // 0xFF bytes: NaN / -1 / 255

// The float64 reference of `op` over the ranks r < world of host_data(in_count, type,
// seed_of(r), Fill::kIntegers), elements [first, first + count).
std::vector<double> reduce_over_ranks(int world, size_t in_count, size_t first, size_t count, DataType type,
                                      ReduceOp op, const std::function<uint64_t(int)>& seed_of);
// `values` stored as `type`; throws std::runtime_error naming the first value `type` cannot hold
// exactly (the checks demand equality, so the reference itself must be exact).
std::vector<uint8_t> exact_in_type(const std::vector<double>& values, DataType type);

}  // namespace symmem::bench
