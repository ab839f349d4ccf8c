// What every GPU test of one rank shares: the job's bootstrap, a communicator, an NCCL
// communicator on the same GPUs (the oracle) and a stream. Ranks run the same cases in the same
// order; results are agreed across ranks so that every rank reports the same verdict.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device_memory.hpp"
#include "symmem/symmem.hpp"

namespace symmem::test {

#define TEST_NCCL(expr)                                                                             \
  do {                                                                                              \
    ncclResult_t r_ = (expr);                                                                       \
    if (r_ != ncclSuccess)                                                                          \
      ::symmem::test::fail(__FILE__, __LINE__, std::string(#expr) + ": " + ncclGetErrorString(r_)); \
  } while (0)

struct Fixture {
  JobInfo job;
  std::shared_ptr<Bootstrap> bootstrap;
  std::unique_ptr<Communicator> comm;
  ncclComm_t nccl = nullptr;
  cudaStream_t stream = nullptr;
  int sm_count = 0;

  static Fixture& get();
  int rank() const { return job.rank; }
  int world() const { return job.world; }

  long sum(long mine);                   // over ranks
  bool all(bool mine);                   // AND over ranks
  bool same_everywhere(uint64_t value);  // identical on every rank
  void sync() const;                     // stream synchronize (throws on CUDA errors)
};

// A device counter that the check kernels add mismatches to without synchronising, so that
// thousands of calls can be checked back to back.
class MismatchCounter {
 public:
  MismatchCounter();
  ~MismatchCounter();
  MismatchCounter(const MismatchCounter&) = delete;
  MismatchCounter& operator=(const MismatchCounter&) = delete;
  unsigned long long* get() const { return count_; }
  void reset(cudaStream_t stream);
  long read(cudaStream_t stream);  // synchronises the stream

 private:
  unsigned long long* count_ = nullptr;
};

uint64_t mix_seed(int rank, uint64_t a, uint64_t b = 0);
std::vector<uint8_t> download(const void* device, size_t bytes);
uint64_t hash_bytes(const std::vector<uint8_t>& bytes);

}  // namespace symmem::test
