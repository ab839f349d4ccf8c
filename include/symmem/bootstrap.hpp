// How the ranks of a job find each other. One process per GPU is the production path (torchrun,
// mpirun or symmem-run set the variables); one process driving several GPUs on threads is
// supported through ThreadGroup.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace symmem {

struct JobInfo {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  int local_world = 1;
  std::string master_addr = "127.0.0.1";  // the store binds this address only
  int master_port = 29500;
  // Shared secret of the job: the store refuses clients without it. symmem-run sets SYMMEM_TOKEN
  // to 128 random bits; under torchrun set it yourself (see docs/bootstrap.md), otherwise it is
  // derived from TORCHELASTIC_RUN_ID and MASTER_PORT, which keeps out stale clients of other
  // jobs but is no secret.
  std::string token;
  int64_t timeout_ms = 30000;

  // RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, SYMMEM_TOKEN,
  // SYMMEM_TIMEOUT_MS. Without RANK: a job of one. Throws kInvalidArgument on inconsistent values.
  static JobInfo from_env();
};

// Collective exchange of small host blobs among the ranks of a job. Every rank calls each method
// in the same order; each call has a deadline and throws kTimeout/kBootstrap naming what is missing.
class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // all[r * bytes .. (r+1) * bytes) receives rank r's `mine`.
  virtual void all_gather(const void* mine, void* all, size_t bytes) = 0;
  virtual void barrier() = 0;
};

// TCP store bootstrap: rank 0 hosts the store on master_addr:master_port, which every node must
// reach (bind MASTER_ADDR to an address of rank 0's host that the other nodes see). A job spanning
// several nodes gets a communicator of several nodes (Communicator::create).
std::shared_ptr<Bootstrap> make_store_bootstrap(const JobInfo& job);

// In-process bootstrap: `world` threads share one ThreadGroup and each calls
// make_thread_bootstrap(group, rank).
class ThreadGroup;
std::shared_ptr<ThreadGroup> make_thread_group(int world, int64_t timeout_ms = 30000);
std::shared_ptr<Bootstrap> make_thread_bootstrap(std::shared_ptr<ThreadGroup> group, int rank);

}  // namespace symmem
