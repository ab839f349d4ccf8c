// Which ranks of a job share a node (one NVLink domain, one symmetric heap) and which ranks of
// other nodes this rank exchanges with over the network. Plain C++, tested on the CPU.
//
// Ranks are grouped in nodes of equal size whose ranks are consecutive (rank = node * local_world
// + local_rank), as torchrun and mpirun assign them. A rank's "column" is the ranks of equal local
// rank, one per node, ordered by node: the NCCL communicator between nodes spans one column.
#pragma once

#include <string>
#include <vector>

#include "symmem/bootstrap.hpp"

namespace symmem::detail {

struct NodeLayout {
  int rank = 0;  // in the job
  int world = 1;
  int node = 0;
  int nodes = 1;
  int local_rank = 0;  // in the node: the index of the heap, the kernels and the host board
  int local_world = 1;

  bool spans_nodes() const { return nodes > 1; }
  int global_rank(int node_index, int local) const { return node_index * local_world + local; }
  // "rank 5 (node 1, local rank 1)" for error messages.
  std::string describe_rank(int global) const;
};

// Nodes of `node_size` consecutive ranks. Throws kInvalidArgument when node_size does not divide
// the world.
NodeLayout layout_by_node_size(int rank, int world, int node_size);

// Nodes from every rank's host identity (hosts[r] for rank r): ranks with the same identity share
// a node. Throws kUnsupported, naming the ranks, unless the nodes are equal-sized runs of
// consecutive ranks.
NodeLayout layout_by_host(int rank, const std::vector<std::string>& hosts);

// Collective over the job's bootstrap: every rank's host identity and node size wish are exchanged,
// so every rank decides from the same values. The wish is `node_size` if positive; else, when the
// bootstrap covers the whole job (WORLD_SIZE ranks), SYMMEM_NODE_SIZE, else LOCAL_WORLD_SIZE; else 0
// (group by host). Throws kInvalidArgument when the ranks wish different sizes and
// kUnsupported when a node would hold ranks of different hosts.
NodeLayout agree_on_layout(int node_size, Bootstrap& job);

// This machine's identity for layout_by_host: host name and kernel boot id, so that two hosts with
// one name (containers) are still told apart.
std::string local_host_identity();

}  // namespace symmem::detail
