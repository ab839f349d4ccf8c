// The hierarchical all-gather's schedule for one rank of a job that spans nodes: which bytes move,
// from where to where, in which step. Plain C++, so that a CPU test runs every rank's schedule of
// many layouts on host memory and checks the result (tests/unit/test_hierarchical_plan.cpp).
//
// Job of N nodes x L GPUs; this rank is (node n, local rank j); every rank gives `bytes`; rank g's
// slot of the output starts at g * stride (stride > bytes when the output is one chunk of a staged
// call). Steps, in stream order on this rank:
//   own node    the node's L shards by copy engine, pulled from the local peers' inputs (and the
//               own slot from the input), from the start: it runs beside the network step.
//   network k   piece k of this rank's input to the rank of equal local rank on every other node,
//               and piece k of theirs straight into their slots (NCCL send/recv within the column).
//               With L = 1 and contiguous slots the column is the whole job in slot order: one
//               NCCL all-gather, exactly the flat one.
//   broadcast k once every local peer holds its piece k from every other node (a copy-engine
//               handshake), pull those pieces from the local peers' outputs into the same offsets
//               of this rank's output. Piece k+1 crosses the network meanwhile.
// Every byte lands at its final offset once; nothing is shuffled afterwards. Per rank, the network
// carries (N - 1) x bytes each way, and NVLink (L - 1) x N x bytes into each GPU.
#pragma once

#include <cstddef>
#include <vector>

#include "plan/node_layout.hpp"

namespace symmem::detail {

// A copy into this rank's output. `peer` is a local rank; src_offset is within that peer's input
// (kLocalInput), its output (kLocalOutput), or this rank's input (kOwnInput, peer = -1).
struct HierCopy {
  enum Source { kOwnInput, kLocalInput, kLocalOutput };
  Source source;
  int peer;
  size_t src_offset;
  size_t dst_offset;
  size_t bytes;
};

// A network transfer with the column rank on node `node`: send this rank's input at `offset`, or
// receive into this rank's output at `offset`.
struct HierTransfer {
  int node;
  size_t offset;
  size_t bytes;
};

struct HierPiece {
  size_t offset;  // within a rank's bytes
  size_t bytes;
  std::vector<HierTransfer> sends;  // in the order NCCL is given them (matched per peer in order)
  std::vector<HierTransfer> receives;
  std::vector<HierCopy> broadcast;  // after every local peer's receives of this piece
};

struct HierarchicalSchedule {
  std::vector<HierCopy> own_node;   // copy engine, first
  bool network_all_gather = false;  // one NCCL all-gather over the job replaces the pieces' transfers
  std::vector<HierPiece> pieces;    // empty on one node
};

// Pieces cut the network step so that the broadcast of piece k overlaps piece k + 1. At most
// kHierMaxPieces, none under kHierMinPieceBytes (each costs an NCCL group and a handshake), offsets
// multiples of 4 KiB.
constexpr int kHierMaxPieces = 8;
constexpr size_t kHierMinPieceBytes = size_t(1) << 20;

// `copy_own`: copy this rank's input into its own slot (out of place, or a staged output).
HierarchicalSchedule plan_hierarchical_all_gather(const NodeLayout& layout, size_t bytes, size_t stride, bool copy_own);

}  // namespace symmem::detail
