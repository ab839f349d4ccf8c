// Starts N local processes of one program with the variables a symmem (or torchrun) job expects,
// forwards their output line by line with a "[rank N] " prefix, and ends the job as a unit: the
// first process that fails makes the launcher stop the others (SIGTERM, then SIGKILL after a
// grace period), so no rank is ever left behind. No CUDA here.
//
// Tests that kill a rank on purpose (tests/gpu/test_kill.cpp) name it with --expect-killed: its
// death by SIGKILL is then no failure and stops nothing; the other ranks must still exit 0 within
// the job's timeout. Such a rank ending any other way is a failure (exit 0 included).
#pragma once

#include <string>
#include <vector>

namespace symmem::launch {

struct LaunchOptions {
  int processes = 1;
  double timeout_s = 0;  // whole-job limit; 0: none. On expiry every rank is killed (rc 124).
  double grace_s = 5;    // between SIGTERM and SIGKILL
  bool prefix_output = true;
  std::string master_addr;         // default: MASTER_ADDR or 127.0.0.1
  std::vector<int> expect_killed;  // ranks whose death by SIGKILL is expected (kill tests)
  // Simulated nodes on this host (0: none): consecutive groups of processes / simulate_nodes ranks
  // get SYMMEM_NODE_SIZE (symmem's node size) and their own NCCL_HOSTID (so NCCL moves data
  // between the groups over its network transport), NCCL_SOCKET_IFNAME=lo when unset. LOCAL_RANK
  // stays the GPU index.
  int simulate_nodes = 0;
};

// Returns the job's exit code: 0 when every rank exited 0 (or, for a rank in expect_killed, died
// by SIGKILL); else the first failure's exit code (128 + signal for a signal; 1 for an
// expect_killed rank that exited 0), or 124 on timeout. Throws std::runtime_error when it cannot
// start.
int run(const LaunchOptions& options, const std::vector<std::string>& command);

// Parses "symmem-run" arguments:
//   [-n N] [--timeout S] [--no-prefix] [--expect-killed RANK]... [--simulate-nodes K] [--] program [args...].
// Returns false with a message in *error for bad arguments.
bool parse_args(const std::vector<std::string>& args, LaunchOptions* options, std::vector<std::string>* command,
                std::string* error);

// The environment variables that keep NVLink multicast off everywhere (set when unset).
void disable_multicast_in_environment();

}  // namespace symmem::launch
