// Oracles and load for the GPU tests of ownership, mismatches and stress:
//   NcclOracle  NCCL's answer on the same inputs, on NCCL's own buffers, compared bit-exactly on
//               the device (no host synchronisation, so thousands of calls can be checked);
//   Flood       a stream that keeps the GPU busy (copies, optionally a kernel on part of the SMs);
//   fresh_communicator / run_and_synchronize / expect_mismatch_everywhere
//               for tests that make a communicator fail: a communicator of their own with a short
//               deadline, and an agreement over every rank on what each one raised.
// Raw pointers only here (no symmem::Operand), so this builds against the old API as well.
#pragma once

#include <cuda_runtime_api.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fixture.hpp"

namespace symmem::test {

ncclDataType_t nccl_type(DataType type);
ncclRedOp_t nccl_op(ReduceOp op);

class NcclOracle {
 public:
  NcclOracle(size_t max_in_bytes, size_t max_out_bytes);
  // Copies the `bytes` of input the call under test is about to read. Call it before that call:
  // in place, the call overwrites its input.
  void take_input(const void* in, size_t bytes, cudaStream_t stream);
  // NCCL on the input taken, on fx.stream (count as in the symmem call of the same name).
  void all_gather(size_t count, DataType type, Fixture& fx);
  void all_reduce(size_t count, DataType type, ReduceOp op, Fixture& fx);
  void reduce_scatter(size_t count, DataType type, ReduceOp op, Fixture& fx);
  // *mismatches += bytes of `got` (bytes long) that differ from NCCL's output.
  void count_differences(const void* got, size_t bytes, unsigned long long* mismatches, cudaStream_t stream) const;

 private:
  DeviceBuffer in_;
  DeviceBuffer out_;
};

class Flood {
 public:
  // Batches of `copies` device-to-device copies of `copy_bytes`, each batch led by a kernel that
  // fills `busy_sms` SMs for `busy_ms` (none when 0).
  Flood(size_t copy_bytes, int copies, int busy_sms = 0, int busy_ms = 0);
  ~Flood();  // waits for what it enqueued
  Flood(const Flood&) = delete;
  Flood& operator=(const Flood&) = delete;
  // Enqueues batches until two are in flight; never waits.
  void top_up();
  int batches() const { return batches_; }

 private:
  size_t bytes_;
  int copies_;
  int busy_sms_;
  int busy_ms_;
  cudaStream_t stream_ = nullptr;
  void* src_ = nullptr;
  void* dst_ = nullptr;
  int* release_ = nullptr;  // the busy kernel's release flag: never set, it stops on its clock
  std::deque<cudaEvent_t> in_flight_;
  std::vector<cudaEvent_t> spare_;
  int batches_ = 0;
};

// A communicator of this test's own (the bootstrap and device of the fixture): a communicator
// that failed is unusable, so a test that expects a failure must not use fx.comm.
// `workspace_bytes` 0: the default budget.
std::unique_ptr<Communicator> fresh_communicator(int64_t timeout_ms, size_t workspace_bytes = 0);
// Collective. Waits for this device, then closes `comm` when it is healthy on every rank, or only
// releases it locally when any rank saw it fail (a failed communicator cannot close collectively).
void release_communicator(std::unique_ptr<Communicator>& comm);

struct Outcome {
  bool threw = false;
  bool mismatch = false;  // symmem::Error with kMismatch
  bool aborted = false;   // symmem::Error with kAborted
  std::string message;
  double seconds = 0;  // from the call to the throw (or to the end of the synchronisation)
};

// Runs `call`, then comm.synchronize(stream); records what was raised and when.
Outcome run_and_synchronize(Communicator& comm, cudaStream_t stream, const std::function<void()>& call);

// Collective (every rank calls it once for the same case). Expects: every rank raised kMismatch
// or kAborted within `limit_s`; at least one rank raised kMismatch; every kMismatch message names
// rank 0 and another rank and contains each string of `names` (a string listed k times must occur
// k times, e.g. twice "all_gather(" for two calls described). Prints each problem with `what`.
// Returns the number of problems over all ranks (the same on every rank).
long expect_mismatch_everywhere(const std::string& what, const Outcome& mine, double limit_s,
                                const std::vector<std::string>& names);

// Occurrences of `needle` in `text` (overlapping ones counted).
int occurrences(const std::string& text, const std::string& needle);

}  // namespace symmem::test
