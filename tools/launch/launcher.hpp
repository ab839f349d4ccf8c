// Starts N local processes of one program with the variables a symmem (or torchrun) job expects,
// forwards their output line by line with a "[rank N] " prefix, and ends the job as a unit: the
// first process that fails makes the launcher stop the others (SIGTERM, then SIGKILL after a
// grace period), so no rank is ever left behind. No CUDA here.
#pragma once

#include <string>
#include <vector>

namespace symmem::launch {

struct LaunchOptions {
  int processes = 1;
  double timeout_s = 0;  // whole-job limit; 0: none. On expiry every rank is killed (rc 124).
  double grace_s = 5;    // between SIGTERM and SIGKILL
  bool prefix_output = true;
  std::string master_addr;  // default: MASTER_ADDR or 127.0.0.1
};

// Returns the job's exit code: 0 when every rank exited 0; else the first failure's exit code
// (128 + signal for a signal), or 124 on timeout. Throws std::runtime_error when it cannot start.
int run(const LaunchOptions& options, const std::vector<std::string>& command);

// Parses "symmem-run" arguments: [-n N] [--timeout S] [--no-prefix] [--] program [args...].
// Returns false with a message in *error for bad arguments.
bool parse_args(const std::vector<std::string>& args, LaunchOptions* options, std::vector<std::string>* command,
                std::string* error);

// The environment variables that keep NVLink multicast off everywhere (set when unset).
void disable_multicast_in_environment();

}  // namespace symmem::launch
