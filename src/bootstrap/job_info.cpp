#include <string>

#include "common/check.hpp"
#include "common/env.hpp"
#include "symmem/bootstrap.hpp"

namespace symmem {

JobInfo JobInfo::from_env() {
  JobInfo job;
  job.timeout_ms = env::timeout_ms();
  job.master_addr = env::get_string("MASTER_ADDR", "127.0.0.1");
  job.master_port = static_cast<int>(env::get_int("MASTER_PORT", 29500));
  if (env::get_string("RANK", "").empty()) {
    job.token = env::get_string("SYMMEM_TOKEN", "single-process");
    return job;  // a job of one
  }
  job.rank = static_cast<int>(env::get_int("RANK", 0));
  job.world = static_cast<int>(env::get_int("WORLD_SIZE", 1));
  job.local_rank = static_cast<int>(env::get_int("LOCAL_RANK", job.rank));
  job.local_world = static_cast<int>(env::get_int("LOCAL_WORLD_SIZE", job.world));
  SYMMEM_REQUIRE(job.world >= 1 && job.rank >= 0 && job.rank < job.world,
                 "RANK=" + std::to_string(job.rank) + " is outside WORLD_SIZE=" + std::to_string(job.world));
  SYMMEM_REQUIRE(job.local_world >= 1 && job.local_rank >= 0 && job.local_rank < job.local_world,
                 "LOCAL_RANK=" + std::to_string(job.local_rank) +
                     " is outside LOCAL_WORLD_SIZE=" + std::to_string(job.local_world));
  // Several nodes are accepted (the communicator spans them); an uneven split is wrong in any case.
  SYMMEM_REQUIRE(job.world % job.local_world == 0, "LOCAL_WORLD_SIZE=" + std::to_string(job.local_world) +
                                                       " does not divide WORLD_SIZE=" + std::to_string(job.world));
  SYMMEM_REQUIRE(job.master_port > 0 && job.master_port < 65536,
                 "MASTER_PORT=" + std::to_string(job.master_port) + " is not a port");
  job.token = env::get_string("SYMMEM_TOKEN", "");
  if (job.token.empty()) {
    // No secret was handed out: derive a job-scoped name so that stale clients of another job
    // (another run id or port) are refused. docs/bootstrap.md explains the difference.
    job.token = "derived:" + env::get_string("TORCHELASTIC_RUN_ID", "none") + ":" + std::to_string(job.master_port);
    detail::log_warning("SYMMEM_TOKEN is not set; the store token is derived, not secret");
  }
  return job;
}

}  // namespace symmem
