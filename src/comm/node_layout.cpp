#include "comm/node_layout.hpp"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/check.hpp"
#include "common/env.hpp"

namespace symmem::detail {

std::string NodeLayout::describe_rank(int global) const {
  return "rank " + std::to_string(global) + " (node " + std::to_string(global / local_world) + ", local rank " +
         std::to_string(global % local_world) + ")";
}

NodeLayout layout_by_node_size(int rank, int world, int node_size) {
  SYMMEM_REQUIRE(world >= 1 && rank >= 0 && rank < world,
                 "node layout: rank " + std::to_string(rank) + " is outside world " + std::to_string(world));
  SYMMEM_REQUIRE(node_size >= 1 && world % node_size == 0, "node layout: a node size of " + std::to_string(node_size) +
                                                               " does not divide world " + std::to_string(world));
  NodeLayout l;
  l.rank = rank;
  l.world = world;
  l.local_world = node_size;
  l.nodes = world / node_size;
  l.node = rank / node_size;
  l.local_rank = rank % node_size;
  return l;
}

NodeLayout layout_by_host(int rank, const std::vector<std::string>& hosts) {
  const int world = static_cast<int>(hosts.size());
  SYMMEM_REQUIRE(rank >= 0 && rank < world,
                 "node layout: rank " + std::to_string(rank) + " is outside world " + std::to_string(world));
  // The first node's size is the run of ranks sharing rank 0's host; every node must repeat it.
  int size = 1;
  while (size < world && hosts[size] == hosts[0]) ++size;
  for (int r = 0; r < world; ++r) {
    const int first = r / size * size;
    const bool same_as_first = hosts[r] == hosts[first];
    const bool new_host = r % size != 0 || r == 0 || hosts[r] != hosts[r - 1];
    if (world % size != 0 || !same_as_first || !new_host)
      throw Error(ErrorCode::kUnsupported,
                  "node layout: ranks are not grouped in equal nodes of consecutive ranks (rank " + std::to_string(r) +
                      " runs on '" + hosts[r] + "', rank " + std::to_string(first) + " on '" + hosts[first] + "', " +
                      "and ranks 0.." + std::to_string(size - 1) +
                      " share a host); launch the same number of ranks on every node with consecutive ranks per node "
                      "(torchrun does), or set SYMMEM_NODE_SIZE");
  }
  // Two nodes on one host would be one NVLink domain cut in two: a launch error, not a layout.
  for (int first = size; first < world; first += size)
    for (int other = 0; other < first; other += size)
      if (hosts[first] == hosts[other])
        throw Error(ErrorCode::kUnsupported, "node layout: ranks " + std::to_string(other) + " and " +
                                                 std::to_string(first) + " share host '" + hosts[first] +
                                                 "' but not a run of consecutive ranks; launch the ranks of each "
                                                 "node consecutively, or set SYMMEM_NODE_SIZE");
  return layout_by_node_size(rank, world, size);
}

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
