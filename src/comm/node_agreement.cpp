// How the ranks of a job agree on their node layout (node_agreement.hpp).
#include "comm/node_agreement.hpp"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/check.hpp"
#include "common/env.hpp"

namespace symmem::detail {

NodeLayout agree_on_layout(int node_size, Bootstrap& job) {
  struct Claim {
    char host[192];
    int32_t node_size;
  };
  const int rank = job.rank(), world = job.world();
  Claim mine{};
  const std::string host = local_host_identity();
  std::strncpy(mine.host, host.c_str(), sizeof(mine.host) - 1);
  // The job's variables describe the job: they apply to a communicator of the whole job only (a
  // subgroup's ranks are grouped by host).
  const bool whole_job = env::get_int("WORLD_SIZE", 0) == world;
  mine.node_size = node_size > 0 ? node_size : whole_job ? env::node_size() : 0;
  if (mine.node_size <= 0 && whole_job) mine.node_size = static_cast<int32_t>(env::get_int("LOCAL_WORLD_SIZE", 0));
  std::vector<Claim> all(world);
  job.all_gather(&mine, all.data(), sizeof(Claim));
  std::vector<std::string> hosts(world);
  for (int r = 0; r < world; ++r) {
    hosts[r] = std::string(all[r].host, strnlen(all[r].host, sizeof(all[r].host)));
    if (all[r].node_size != mine.node_size)
      throw Error(ErrorCode::kInvalidArgument,
                  "Communicator::create: rank " + std::to_string(r) + " groups ranks in nodes of " +
                      std::to_string(all[r].node_size) + ", rank " + std::to_string(rank) + " in nodes of " +
                      std::to_string(mine.node_size) +
                      " (0: by host name); set SYMMEM_NODE_SIZE / LOCAL_WORLD_SIZE identically for every rank");
  }
  if (mine.node_size <= 0) return layout_by_host(rank, hosts);
  const NodeLayout layout = layout_by_node_size(rank, world, mine.node_size);
  // Ranks of one node must share a host (its NVLink domain and shared memory); nodes may share one
  // (simulated nodes).
  for (int r = 0; r < world; ++r) {
    const int first = r / layout.local_world * layout.local_world;
    if (hosts[r] != hosts[first])
      throw Error(ErrorCode::kUnsupported,
                  "Communicator::create: a node size of " + std::to_string(layout.local_world) + " puts rank " +
                      std::to_string(r) + " (host '" + hosts[r] + "') in one node with rank " + std::to_string(first) +
                      " (host '" + hosts[first] + "'); a node's ranks must run on one host");
  }
  return layout;
}

std::string local_host_identity() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) name[0] = '\0';
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  return std::string(name) + "/" + boot_id;
}

}  // namespace symmem::detail
