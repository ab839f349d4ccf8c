#include "plan/hierarchical_plan.hpp"

#include <algorithm>

#include "common/check.hpp"

namespace symmem::detail {
namespace {

constexpr size_t kPieceAlignment = 4096;

std::vector<std::pair<size_t, size_t>> cut_pieces(size_t bytes, bool pipelined) {
  if (!pipelined || bytes < 2 * kHierMinPieceBytes) return {{0, bytes}};
  const size_t count = std::min<size_t>(kHierMaxPieces, bytes / kHierMinPieceBytes);
  const size_t piece = (bytes / count + kPieceAlignment - 1) / kPieceAlignment * kPieceAlignment;
  std::vector<std::pair<size_t, size_t>> pieces;
  for (size_t at = 0; at < bytes; at += piece) pieces.emplace_back(at, std::min(piece, bytes - at));
  return pieces;
}

}  // namespace

HierarchicalSchedule plan_hierarchical_all_gather(const NodeLayout& l, size_t bytes, size_t stride, bool copy_own) {
  SYMMEM_REQUIRE(stride >= bytes, "hierarchical all_gather: slot stride " + std::to_string(stride) +
                                      " is shorter than a rank's " + std::to_string(bytes) + " bytes");
  HierarchicalSchedule s;
  const int n = l.node, j = l.local_rank, L = l.local_world;
  auto slot = [&](int node, int local) { return static_cast<size_t>(l.global_rank(node, local)) * stride; };

  s.network_all_gather = l.nodes > 1 && L == 1 && stride == bytes;
  // NCCL's all-gather copies the own slot itself (out of place) or leaves it (in place).
  if (copy_own && !s.network_all_gather) s.own_node.push_back({HierCopy::kOwnInput, -1, 0, slot(n, j), bytes});
  for (int k = 1; k < L; ++k) {
    const int p = (j + k) % L;  // start with the next peer: ranks spread over the sources
    s.own_node.push_back({HierCopy::kLocalInput, p, 0, slot(n, p), bytes});
  }
  if (l.nodes == 1 || bytes == 0) return s;

  for (const auto& [offset, size] : cut_pieces(bytes, L > 1)) {
    HierPiece piece{offset, size, {}, {}, {}};
    if (!s.network_all_gather) {
      for (int k = 1; k < l.nodes; ++k) {
        // Node n sends to n+1, n+2, ... and receives from n-1, n-2, ...: every pair's first
        // transfer is matched first, and the ring order spreads the load over the nodes.
        piece.sends.push_back({(n + k) % l.nodes, offset, size});
        const int from = (n - k + l.nodes) % l.nodes;
        piece.receives.push_back({from, slot(from, j) + offset, size});
      }
    }
    for (int k = 1; k < l.nodes; ++k) {
      const int m = (n - k + l.nodes) % l.nodes;
      for (int q = 1; q < L; ++q) {
        const int p = (j + q) % L;
        piece.broadcast.push_back({HierCopy::kLocalOutput, p, slot(m, p) + offset, slot(m, p) + offset, size});
      }
    }
    s.pieces.push_back(std::move(piece));
  }
  return s;
}

}  // namespace symmem::detail
