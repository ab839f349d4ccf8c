// The hierarchical all-gather's offset arithmetic, node grouping and pipeline order: every rank's
// schedule of many layouts (nodes x GPUs per node), sizes and strides is executed on host memory
// the way the streams order it, and every output byte must come from the right rank, exactly once,
// from data its source already held.
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "comm/node_agreement.hpp"
#include "plan/node_layout.hpp"
#include "plan/hierarchical_plan.hpp"
#include "symmem/error.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::detail;

namespace {

// The byte rank g holds at position i of its input: never 0 (0 marks "not written").
uint8_t shard_byte(int g, size_t i) { return static_cast<uint8_t>(1 + (g * 131 + i * 7 + i / 251) % 255); }

struct RankMemory {
  std::vector<uint8_t> in;
  std::vector<uint8_t> out;
  std::vector<int> writes;  // per output byte
};

// Runs the whole job's schedules in the order the streams and handshakes allow, and checks them.
void simulate(int nodes, int local_world, size_t bytes, size_t stride, bool in_place) {
  const int world = nodes * local_world;
  std::vector<RankMemory> mem(world);
  std::vector<HierarchicalSchedule> plan(world);
  std::vector<NodeLayout> layout(world);
  for (int g = 0; g < world; ++g) {
    layout[g] = layout_by_node_size(g, world, local_world);
    mem[g].in.resize(bytes);
    for (size_t i = 0; i < bytes; ++i) mem[g].in[i] = shard_byte(g, i);
    mem[g].out.assign(stride * world, 0);
    mem[g].writes.assign(stride * world, 0);
    if (in_place)  // the input is the own slot: it holds the data from the start
      for (size_t i = 0; i < bytes; ++i) mem[g].out[g * stride + i] = shard_byte(g, i);
    plan[g] = plan_hierarchical_all_gather(layout[g], bytes, stride, !in_place);
  }
  const std::string where = std::to_string(nodes) + "x" + std::to_string(local_world) +
                            " bytes=" + std::to_string(bytes) + " stride=" + std::to_string(stride) +
                            (in_place ? " in place" : "");
  auto write = [&](int g, size_t dst, const uint8_t* src, size_t n) {
    EXPECT(dst + n <= mem[g].out.size());
    for (size_t i = 0; i < n; ++i) {
      if (src[i] == 0) ::symmem::test::fail(__FILE__, __LINE__, where + ": a copy read bytes never written");
      mem[g].out[dst + i] = src[i];
      ++mem[g].writes[dst + i];
    }
  };
  auto local_peer = [&](int g, int p) { return layout[g].global_rank(layout[g].node, p); };
  auto run_copies = [&](int g, const std::vector<HierCopy>& copies) {
    for (const HierCopy& c : copies) {
      if (c.source == HierCopy::kOwnInput) {
        write(g, c.dst_offset, mem[g].in.data() + c.src_offset, c.bytes);
      } else {
        EXPECT(c.peer >= 0 && c.peer < local_world && c.peer != layout[g].local_rank);
        const int src = local_peer(g, c.peer);
        // An in-place rank's input is its own slot of its output.
        const uint8_t* base = c.source == HierCopy::kLocalInput
                                  ? (in_place ? mem[src].out.data() + src * stride : mem[src].in.data())
                                  : mem[src].out.data();
        write(g, c.dst_offset, base + c.src_offset, c.bytes);
      }
    }
  };

  // Own node: from the start, every rank (the ready handshake orders it after every input exists).
  for (int g = 0; g < world; ++g) run_copies(g, plan[g].own_node);
  const size_t pieces = plan[0].pieces.size();
  for (int g = 0; g < world; ++g) EXPECT_EQ(plan[g].pieces.size(), pieces);  // the handshakes pair up
  for (size_t k = 0; k < pieces; ++k) {
    // Network piece k on every rank: NCCL matches rank a's sends to b with b's receives from a in
    // order; both sides must agree on the sizes.
    std::map<std::pair<int, int>, std::vector<HierTransfer>> sent;  // (from, to) -> sends
    for (int g = 0; g < world; ++g) {
      const HierPiece& piece = plan[g].pieces[k];
      if (plan[g].network_all_gather) {
        EXPECT(piece.sends.empty() && piece.receives.empty());
        for (int from = 0; from < world; ++from)
          if (from != g) write(g, from * stride, mem[from].in.data(), bytes);
        if (!in_place) write(g, g * stride, mem[g].in.data(), bytes);
        continue;
      }
      for (const HierTransfer& t : piece.sends) {
        EXPECT(t.node != layout[g].node && t.node >= 0 && t.node < nodes);
        sent[{g, layout[g].global_rank(t.node, layout[g].local_rank)}].push_back(t);
      }
    }
    for (int g = 0; g < world; ++g) {
      std::map<int, size_t> matched;  // from -> sends consumed
      for (const HierTransfer& r : plan[g].pieces[k].receives) {
        const int from = layout[g].global_rank(r.node, layout[g].local_rank);
        auto& queue = sent[{from, g}];
        const size_t i = matched[from]++;
        if (i >= queue.size()) ::symmem::test::fail(__FILE__, __LINE__, where + ": a receive without a send");
        EXPECT_EQ(queue[i].bytes, r.bytes);
        const uint8_t* src = in_place ? mem[from].out.data() + from * stride : mem[from].in.data();
        write(g, r.offset, src + queue[i].offset, r.bytes);
      }
      for (const auto& entry : matched) {
        const size_t sends = sent[std::make_pair(entry.first, g)].size();
        EXPECT_EQ(entry.second, sends);
      }
    }
    for (const auto& [pair, queue] : sent) {
      size_t received = 0;
      for (const HierTransfer& r : plan[pair.second].pieces[k].receives)
        if (layout[pair.second].global_rank(r.node, layout[pair.second].local_rank) == pair.first) ++received;
      EXPECT_EQ(received, queue.size());  // no send left unmatched (NCCL would hang)
    }
    // Broadcast piece k: after the handshake that follows every local rank's piece k.
    for (int g = 0; g < world; ++g) run_copies(g, plan[g].pieces[k].broadcast);
  }

  for (int g = 0; g < world; ++g)
    for (int from = 0; from < world; ++from)
      for (size_t i = 0; i < stride; ++i) {
        const size_t at = from * stride + i;
        const bool own_in_place = in_place && from == g;
        const int want_writes = i < bytes && !own_in_place ? 1 : 0;
        if (mem[g].writes[at] != want_writes)
          ::symmem::test::fail(__FILE__, __LINE__,
                               where + ": rank " + std::to_string(g) + " byte " + std::to_string(i) + " of slot " +
                                   std::to_string(from) + " written " + std::to_string(mem[g].writes[at]) + " times");
        if (i < bytes && mem[g].out[at] != shard_byte(from, i))
          ::symmem::test::fail(__FILE__, __LINE__,
                               where + ": rank " + std::to_string(g) + " slot " + std::to_string(from) + " byte " +
                                   std::to_string(i) + " holds another rank's data");
      }
}

}  // namespace

TEST(hierarchical_schedule_lands_every_byte_once_at_its_offset) {
  const std::vector<std::pair<int, int>> layouts = {{1, 1}, {1, 2}, {2, 1}, {1, 4}, {2, 2}, {4, 1}, {3, 2},
                                                    {2, 3}, {4, 2}, {2, 4}, {3, 3}, {8, 1}, {2, 8}, {5, 1}};
  // Sizes from one byte to several pipeline pieces, with and without a staged stride.
  const std::vector<size_t> sizes = {1, 3, 4096, 12345, (size_t(2) << 20) + 7, (size_t(5) << 20) + 4099};
  for (const auto& [nodes, local] : layouts)
    for (size_t bytes : sizes)
      for (bool in_place : {false, true}) {
        simulate(nodes, local, bytes, bytes, in_place);
        if (bytes < (size_t(1) << 20)) simulate(nodes, local, bytes, bytes + 100, in_place);
      }
}

TEST(hierarchical_schedule_pipelines_large_shards_within_limits) {
  const NodeLayout l = layout_by_node_size(3, 4, 2);  // node 1, local rank 1
  const size_t bytes = size_t(64) << 20;
  const HierarchicalSchedule s = plan_hierarchical_all_gather(l, bytes, bytes, true);
  EXPECT_EQ(s.pieces.size(), static_cast<size_t>(kHierMaxPieces));
  size_t covered = 0;
  for (const HierPiece& p : s.pieces) {
    EXPECT_EQ(p.offset, covered);
    EXPECT(p.offset % 4096 == 0);
    EXPECT(p.bytes >= kHierMinPieceBytes || &p == &s.pieces.back());
    covered += p.bytes;
    EXPECT_EQ(p.sends.size(), size_t(1));
    EXPECT_EQ(p.receives.size(), size_t(1));
    EXPECT_EQ(p.receives[0].offset, size_t(1) * bytes + p.offset);  // rank 1 = (node 0, local 1)
    EXPECT_EQ(p.broadcast.size(), size_t(1));
    EXPECT_EQ(p.broadcast[0].dst_offset, size_t(0) * bytes + p.offset);  // rank 0's slot, from local peer 0
  }
  EXPECT_EQ(covered, bytes);
  // One GPU per node: nothing to broadcast, so no pipelining; one NCCL all-gather.
  const HierarchicalSchedule flat = plan_hierarchical_all_gather(layout_by_node_size(1, 2, 1), bytes, bytes, true);
  EXPECT(flat.network_all_gather);
  EXPECT_EQ(flat.pieces.size(), size_t(1));
  EXPECT(flat.own_node.empty());
  // One node: the copy engine's all-gather alone.
  const HierarchicalSchedule one = plan_hierarchical_all_gather(layout_by_node_size(0, 2, 2), bytes, bytes, true);
  EXPECT(one.pieces.empty());
  EXPECT_EQ(one.own_node.size(), size_t(2));
}

TEST(node_layout_from_node_size_and_hosts) {
  const NodeLayout l = layout_by_node_size(5, 8, 4);
  EXPECT_EQ(l.node, 1);
  EXPECT_EQ(l.nodes, 2);
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.global_rank(0, 1), 1);
  EXPECT(l.describe_rank(6) == "rank 6 (node 1, local rank 2)");
  EXPECT_ERROR(layout_by_node_size(0, 6, 4), ErrorCode::kInvalidArgument, "does not divide");

  const NodeLayout h = layout_by_host(3, {"a", "a", "b", "b", "c", "c"});
  EXPECT_EQ(h.nodes, 3);
  EXPECT_EQ(h.node, 1);
  EXPECT_EQ(h.local_rank, 1);
  EXPECT_EQ(layout_by_host(0, {"a", "a"}).nodes, 1);
  EXPECT_EQ(layout_by_host(1, {"a", "b"}).local_world, 1);
  EXPECT_ERROR(layout_by_host(0, {"a", "a", "b"}), ErrorCode::kUnsupported, "equal nodes");
  EXPECT_ERROR(layout_by_host(0, {"a", "b", "a", "b"}), ErrorCode::kUnsupported, "consecutive");
  EXPECT_ERROR(layout_by_host(0, {"a", "a", "b", "b", "a", "a"}), ErrorCode::kUnsupported, "share host");
  EXPECT(!local_host_identity().empty());
}
