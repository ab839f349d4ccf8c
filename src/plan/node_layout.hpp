// Which ranks of a job share a node (one NVLink domain, one symmetric heap) and which ranks of
// other nodes this rank exchanges with over the network. Plain C++, tested on the CPU; how the
// ranks agree on it is comm/node_agreement.hpp.
//
// Ranks are grouped in nodes of equal size whose ranks are consecutive (rank = node * local_world
// + local_rank), as torchrun and mpirun assign them. A rank's "column" is the ranks of equal local
// rank, one per node, ordered by node: the NCCL communicator between nodes spans one column.
#pragma once

#include <string>
#include <vector>

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

}  // namespace symmem::detail
