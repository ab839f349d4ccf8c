#include "plan/node_layout.hpp"

#include <string>
#include <vector>

#include "common/check.hpp"

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

}  // namespace symmem::detail
