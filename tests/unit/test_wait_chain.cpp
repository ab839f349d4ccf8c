// Reading a timeout from every rank's failure record (board/wait_chain.hpp): a rank behind in an
// earlier call, waiting for a third rank, is not a mismatch; ranks waiting for each other in calls
// of different signatures are.
#include <functional>
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

using Records = std::map<int, DeviceStatus>;

// The records as the board shows them: a rank with none has code kStatusOk.
std::function<DeviceStatus(int)> board(const Records& records) {
  return [&records](int r) {
    const auto it = records.find(r);
    return it == records.end() ? DeviceStatus{} : it->second;
  };
}

WaitChain follow(int first, int world, const Records& records) { return follow_waits(first, world, board(records)); }

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

TEST(a_copy_engine_wait_released_by_an_abort_is_followed_to_whom_it_waited_for) {
  // Seen on 2 H100s: rank 1 (SM pull) timed out waiting for rank 0, whose copy-engine call the
  // abort released, waiting for rank 1's word: a mismatch, as the calls differ.
  WaitChain c = follow(1, 2, {{1, waiting(kStatusTimeout, 0, 0xA)}, {0, waiting(kStatusAborted, 1, 0xB)}});
  EXPECT(c.mismatch);
  EXPECT_EQ(c.mismatch_rank, 1);
  EXPECT_EQ(c.mismatch_peer, 0);
  // Seen on 4 H100s sharing one GPU: rank 1 waited for live rank 2, whose copy-engine wait the
  // abort released while it waited for absent rank 3: rank 3 is the end, no mismatch.
  c = follow(1, 4, {{1, waiting(kStatusTimeout, 2, 0xA)}, {2, waiting(kStatusAborted, 3, 0xA)}});
  EXPECT(!c.mismatch);
  EXPECT_EQ(c.ranks.back(), 3);
  // A wait that names no one closes the path at its start, and only a path of two ranks or more.
  c = follow(1, 2, {{1, waiting(kStatusTimeout, 0, 0xA)}, {0, waiting(kStatusAborted, -1, 0xB)}});
  EXPECT(c.mismatch);
  EXPECT_EQ(c.cycle_start, 0);
  c = follow(1, 2, {{1, waiting(kStatusAborted, -1, 0xA)}});
  EXPECT_EQ(c.cycle_start, -1);
}

TEST(a_lead_in_from_another_call_into_a_cycle_of_one_call_is_no_mismatch) {
  // 0 (call B) waits for 1; 1 and 2 (call A) wait for each other: the cycle is of one call.
  const WaitChain c = follow(0, 3,
                             {{0, waiting(kStatusTimeout, 1, 0xB)}, {1, waiting(kStatusTimeout, 2, 0xA)},
                              {2, waiting(kStatusAborted, 1, 0xA)}});
  EXPECT_EQ(c.cycle_start, 1);
  EXPECT(!c.mismatch);
}

namespace {

DeviceStatus between_nodes(uint32_t code, uint32_t signature) {
  DeviceStatus s = waiting(code, -1, signature);
  s.op = kOpBetweenNodes;
  return s;
}

FailureVerdict judge(int who, int world, const Records& records) { return judge_failure(who, world, board(records)); }

}  // namespace

TEST(the_verdict_names_the_rank_that_never_came_or_the_cause_down_the_path) {
  // A dead rank behind a peer in an earlier call: a timeout, through the path to the dead rank.
  FailureVerdict v =
      judge(0, 4, {{0, waiting(kStatusTimeout, 1, 0xB)}, {1, waiting(kStatusAborted, 2, 0xA)},
                   {2, waiting(kStatusTimeout, 3, 0xA)}});
  EXPECT_EQ(v.who, 0);
  EXPECT_EQ(v.record.code, uint32_t(kStatusTimeout));
  EXPECT_EQ(v.record.peer, 1);
  EXPECT_EQ(v.waited_through.size(), size_t(2));
  EXPECT_EQ(v.waited_through.back(), 3);
  // The awaited rank itself recorded nothing: no path to tell (the message names it as before).
  v = judge(0, 2, {{0, waiting(kStatusTimeout, 1, 0xB)}});
  EXPECT(v.waited_through.empty());
  EXPECT_EQ(v.record.peer, 1);
  // Ranks waiting for each other in different calls: a mismatch, described from the cycle's start.
  v = judge(1, 2, {{1, waiting(kStatusTimeout, 0, 0xA)}, {0, waiting(kStatusAborted, 1, 0xB)}});
  EXPECT_EQ(v.record.code, uint32_t(kStatusMismatch));
  EXPECT_EQ(v.who, 1);
  EXPECT_EQ(v.record.peer, 0);
  EXPECT_EQ(v.record.peer_signature, 0xBu);
  EXPECT_EQ(v.record.signature, 0xAu);
  // A mismatch a peer saw in a flag, down the path: that record is the cause.
  DeviceStatus seen = waiting(kStatusMismatch, 2, 0xA);
  seen.peer_signature = 0xC;
  v = judge(0, 3, {{0, waiting(kStatusTimeout, 1, 0xA)}, {1, seen}});
  EXPECT_EQ(v.who, 1);
  EXPECT_EQ(v.record.code, uint32_t(kStatusMismatch));
  EXPECT_EQ(v.record.peer_signature, 0xCu);
  // A local rank behind in the step between nodes (its peer a remote rank): that step is the cause,
  // a timeout too, and no mismatch whatever its signature.
  for (uint32_t code : {kStatusTimeout, kStatusNetwork}) {
    v = judge(0, 2, {{0, waiting(kStatusTimeout, 1, 0xA)}, {1, between_nodes(code, 0xB)}});
    EXPECT_EQ(v.who, 1);
    EXPECT_EQ(v.record.code, code);
    EXPECT_EQ(v.record.op, uint32_t(kOpBetweenNodes));
  }
  // A failure that is not a timeout is reported as it is.
  v = judge(0, 2, {{0, waiting(kStatusCapacity, -1, 0xA)}});
  EXPECT_EQ(v.record.code, uint32_t(kStatusCapacity));
}

TEST(a_refusal_down_the_path_is_the_cause) {
  // A rank whose wait timed out (its abort came late) behind the rank that refused the call: the
  // refusal is the cause, whatever the signatures (the refused call was never signed).
  DeviceStatus refused = waiting(kStatusRefused, 1, 0x5EF05ED);
  refused.block = 0;  // the refusing rank's ErrorCode (kInvalidArgument)
  FailureVerdict v = judge(0, 2, {{0, waiting(kStatusTimeout, 1, 0xA)}, {1, refused}});
  EXPECT_EQ(v.who, 1);
  EXPECT_EQ(v.record.code, uint32_t(kStatusRefused));
  // Through a third rank released by the abort, waiting for the refusing one.
  v = judge(0, 3, {{0, waiting(kStatusTimeout, 2, 0xA)}, {2, waiting(kStatusAborted, 1, 0xA)}, {1, refused}});
  EXPECT_EQ(v.who, 1);
  EXPECT_EQ(v.record.code, uint32_t(kStatusRefused));
  EXPECT(v.waited_through.empty());
  // The refusing rank's own record is reported as it is.
  v = judge(1, 2, {{1, refused}});
  EXPECT_EQ(v.record.code, uint32_t(kStatusRefused));
}
