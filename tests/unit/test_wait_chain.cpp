// Reading a timeout from every rank's failure record (board/wait_chain.hpp): a rank behind in an
// earlier call, waiting for a third rank, is not a mismatch; ranks waiting for each other in calls
// of different signatures are.
#include <map>

#include "board/wait_chain.hpp"
#include "test.hpp"

using namespace symmem::detail;

namespace {

DeviceStatus waiting(uint32_t code, int peer, uint32_t signature) {
  DeviceStatus s{};
  s.code = code;
  s.peer = peer;
  s.signature = signature;
  return s;
}

WaitChain follow(int first, int world, const std::map<int, DeviceStatus>& records) {
  return follow_waits(first, world, [&](int r) {
    const auto it = records.find(r);
    return it == records.end() ? DeviceStatus{} : it->second;
  });
}

}  // namespace

TEST(a_peer_behind_in_another_call_waiting_for_a_dead_rank_is_no_mismatch) {
  // Rank 0 (call 0xB) waits for rank 1, still in call 0xA waiting for rank 2, which never came.
  for (uint32_t behind : {kStatusTimeout, kStatusAborted}) {
    const WaitChain c = follow(0, 8, {{0, waiting(kStatusTimeout, 1, 0xB)}, {1, waiting(behind, 2, 0xA)}});
    EXPECT(!c.mismatch);
    EXPECT_EQ(c.cycle_start, -1);
    EXPECT_EQ(c.ranks.size(), size_t(3));
    EXPECT_EQ(c.ranks.back(), 2);
  }
  // Longer: 0 -> 3 -> 5 -> 7 (7 recorded nothing), signatures all different.
  const WaitChain c = follow(0, 8,
                             {{0, waiting(kStatusTimeout, 3, 1)},
                              {3, waiting(kStatusAborted, 5, 2)},
                              {5, waiting(kStatusTimeout, 7, 3)}});
  EXPECT(!c.mismatch);
  EXPECT_EQ(c.ranks.back(), 7);
  EXPECT_EQ(c.ranks.size(), size_t(4));
}

TEST(ranks_waiting_for_each_other_in_different_calls_are_a_mismatch) {
  // Two ranks: the first to time out, and the one that saw its abort (waiting for it).
  WaitChain c = follow(0, 2, {{0, waiting(kStatusTimeout, 1, 0xA)}, {1, waiting(kStatusAborted, 0, 0xB)}});
  EXPECT(c.mismatch);
  EXPECT_EQ(c.cycle_start, 0);
  EXPECT_EQ(c.mismatch_rank, 0);
  EXPECT_EQ(c.mismatch_peer, 1);
  // A cycle through a third rank of the same call as the first: 0 -> 1 -> 2 -> 0, rank 2 differs.
  c = follow(0, 4,
             {{0, waiting(kStatusTimeout, 1, 0xA)}, {1, waiting(kStatusAborted, 2, 0xA)},
              {2, waiting(kStatusAborted, 0, 0xC)}});
  EXPECT(c.mismatch);
  EXPECT_EQ(c.mismatch_peer, 2);
  // A cycle the first rank leads into but is not on: 0 -> 1 -> 2 -> 1.
  c = follow(0, 4,
             {{0, waiting(kStatusTimeout, 1, 0xA)}, {1, waiting(kStatusAborted, 2, 0xA)},
              {2, waiting(kStatusTimeout, 1, 0xD)}});
  EXPECT(c.mismatch);
  EXPECT_EQ(c.cycle_start, 1);
  EXPECT_EQ(c.mismatch_rank, 1);
  EXPECT_EQ(c.mismatch_peer, 2);
}

TEST(a_cycle_of_one_call_and_a_path_to_a_cause_are_no_mismatch) {
  WaitChain c = follow(0, 3, {{0, waiting(kStatusTimeout, 1, 7)}, {1, waiting(kStatusTimeout, 0, 7)}});
  EXPECT(!c.mismatch);
  EXPECT_EQ(c.cycle_start, 0);
  // The path stops at a rank that recorded a cause of its own (here a mismatch it saw in a flag).
  c = follow(0, 3, {{0, waiting(kStatusTimeout, 1, 7)}, {1, waiting(kStatusMismatch, 2, 9)}});
  EXPECT(!c.mismatch);
  EXPECT_EQ(c.ranks.back(), 1);
  // Peers outside the world end the path.
  c = follow(0, 2, {{0, waiting(kStatusTimeout, -1, 7)}});
  EXPECT_EQ(c.ranks.size(), size_t(1));
}

TEST(a_copy_engine_wait_that_named_no_peer_closes_the_path) {
  // Seen on 2 H100s: rank 1 (SM pull) timed out waiting for rank 0, whose copy-engine call the
  // abort released (its record names no peer): a mismatch, as the calls differ.
  WaitChain c = follow(1, 2, {{1, waiting(kStatusTimeout, 0, 0xA)}, {0, waiting(kStatusAborted, -1, 0xB)}});
  EXPECT(c.mismatch);
  EXPECT_EQ(c.mismatch_rank, 1);
  EXPECT_EQ(c.mismatch_peer, 0);
  // The same call on both: a timeout.
  c = follow(1, 2, {{1, waiting(kStatusTimeout, 0, 0xA)}, {0, waiting(kStatusAborted, -1, 0xA)}});
  EXPECT(!c.mismatch);
}
