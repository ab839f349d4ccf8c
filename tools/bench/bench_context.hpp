// What every benchmark of one rank shares: the communicator, NCCL communicators on the same
// GPUs (plain, symmetric windows, zero-CTA copy engine, fixed CTA counts), a stream, timing by
// CUDA events (median of batches, slowest rank), and deterministic test data.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "args.hpp"
#include "report.hpp"
#include "symmem/symmem.hpp"

namespace symmem::bench {

#define BENCH_NCCL_CHECK(expr)                                                                           \
  do {                                                                                                   \
    ncclResult_t r_ = (expr);                                                                            \
    if (r_ != ncclSuccess) throw std::runtime_error(std::string(#expr) + ": " + ncclGetErrorString(r_)); \
  } while (0)

#define BENCH_CUDA_CHECK(expr)                                                                         \
  do {                                                                                                 \
    cudaError_t e_ = (expr);                                                                           \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#expr) + ": " + cudaGetErrorName(e_)); \
  } while (0)

using Launch = std::function<void(cudaStream_t)>;

class BenchContext {
 public:
  explicit BenchContext(const Args& args);
  ~BenchContext();

  int rank() const { return comm_->rank(); }
  int world() const { return comm_->world(); }
  Communicator& comm() { return *comm_; }
  cudaStream_t stream() const { return stream_; }
  const Args& args() const { return args_; }
  Meta meta() const;

  ncclComm_t nccl() const { return nccl_; }                 // plain: buffers never registered
  ncclComm_t nccl_symmetric() const { return nccl_sym_; }   // symmetric windows
  ncclComm_t nccl_copy_engine() const { return nccl_ce_; }  // symmetric windows + zero-CTA policy
  ncclComm_t nccl_with_ctas(int ctas);                      // created on first use
  // Registers [p, p + bytes) as a symmetric window on `comm` (once per comm and pointer).
  bool register_window(ncclComm_t comm, void* p, size_t bytes);
  void release_windows();  // before the registered buffers are freed

  // Median over 3 batches of `iters` back-to-back calls (or one graph of them), microseconds per
  // call, of the slowest rank. A device barrier lines the ranks up before each batch.
  double time_us(const Launch& launch, bool graph);
  // Max over ranks.
  double slowest(double mine);
  long sum_over_ranks(long mine);
  bool same_on_all_ranks(uint64_t value);
  void host_barrier() { comm_->bootstrap().barrier(); }
  void progress(const std::string& what) const;  // rank 0, stderr

 private:
  Args args_;
  std::unique_ptr<Communicator> comm_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  ncclComm_t nccl_ = nullptr;
  ncclComm_t nccl_sym_ = nullptr;
  ncclComm_t nccl_ce_ = nullptr;
  std::map<int, ncclComm_t> nccl_ctas_;
  ncclUniqueId make_unique_id();
  ncclComm_t init_nccl(int cta_policy, int ctas);
  std::map<std::pair<ncclComm_t, void*>, ncclWindow_t> windows_;
  std::string gpu_name_;
};

// Deterministic data for rank r at a given size. kBits: every bit random (gathers compare
// bytes). kIntegers: small integers in [-16, 15] stored in the type, so sums of up to 8 ranks are
// exact in every type and reductions can be checked for equality.
enum class Fill { kBits, kIntegers };
uint64_t seed_for(int rank, size_t bytes, int salt);
std::vector<uint8_t> host_data(size_t count, DataType type, uint64_t seed, Fill fill);
void upload(void* device, const std::vector<uint8_t>& host, cudaStream_t stream);
std::vector<uint8_t> download(const void* device, size_t bytes);
void poison(void* device, size_t bytes, cudaStream_t stream);  // 0xFF bytes: NaN / -1 / 255
uint64_t hash_bytes(const std::vector<uint8_t>& bytes);

}  // namespace symmem::bench
