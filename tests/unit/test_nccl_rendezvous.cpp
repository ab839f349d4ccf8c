// How the ranks of an NCCL communicator on one host find each other (src/nccl/local_rendezvous.hpp),
// with ranks as threads: the candidates listen "before the real init" (a barrier here stands for
// it), then join.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "bootstrap/socket.hpp"
#include "nccl/local_rendezvous.hpp"
#include "symmem/error.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::nccl;

namespace {

struct Joined {
  std::shared_ptr<LocalBootstrap> bootstrap;
  std::vector<Hello> hellos;
  std::string error;
};

// Candidates `listening` of `candidates` listen, then all of them join at once. ranks[i] is the
// communicator rank of candidate listening[i].
std::vector<Joined> join_all(const RendezvousKey& key, int candidates, const std::vector<int>& listening,
                             const std::vector<int>& ranks, int world, int64_t timeout_ms = 10000) {
  std::vector<std::unique_ptr<LocalRendezvous>> rendezvous;
  for (int index : listening) rendezvous.push_back(std::make_unique<LocalRendezvous>(key, index, candidates));
  std::vector<Joined> out(listening.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < listening.size(); ++i) {
    threads.emplace_back([&, i] {
      Hello mine;
      mine.secret = key.secret;
      mine.rank = ranks[i];
      mine.world = world;
      mine.device = static_cast<int>(i);
      try {
        out[i].bootstrap = rendezvous[i]->join(mine, timeout_ms, &out[i].hellos);
      } catch (const Error& e) {
        out[i].error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

void run_on_all(std::vector<Joined>& joined, const std::function<void(Joined&)>& body) {
  std::vector<std::thread> threads;
  for (auto& j : joined) threads.emplace_back([&] { body(j); });
  for (auto& t : threads) t.join();
}

}  // namespace

TEST(nccl_rendezvous_connects_the_ranks_of_a_host) {
  const RendezvousKey key = RendezvousKey::random();
  // Candidates are parent ranks; communicator ranks come in another order (a split's keys).
  std::vector<Joined> joined = join_all(key, 4, {0, 1, 2, 3}, {2, 0, 3, 1}, 4);
  for (const Joined& j : joined) {
    EXPECT_EQ(j.error, std::string());
    EXPECT_EQ(j.hellos.size(), size_t(4));
    for (int r = 0; r < 4; ++r) EXPECT_EQ(j.hellos[r].rank, r);  // ordered by communicator rank
    EXPECT_EQ(j.bootstrap->world(), 4);
  }
  // The bootstrap's ranks are the communicator's: rank r's block lands at r.
  std::atomic<int> good{0};
  run_on_all(joined, [&](Joined& j) {
    const int rank = j.bootstrap->rank();
    for (int round = 0; round < 3; ++round) {
      std::vector<uint64_t> mine(5, uint64_t(rank) * 100 + round), all(20);
      j.bootstrap->all_gather(mine.data(), all.data(), 5 * sizeof(uint64_t));
      bool ok = true;
      for (int r = 0; r < 4; ++r)
        for (int k = 0; k < 5; ++k) ok = ok && all[r * 5 + k] == uint64_t(r) * 100 + round;
      if (ok) ++good;
    }
    j.bootstrap->barrier();
  });
  EXPECT_EQ(good.load(), 12);
}

TEST(nccl_rendezvous_sees_only_the_ranks_of_its_host) {
  // Candidates 1 and 3 are "on another host": they never listen here. The others find each other
  // and see a communicator larger than their host (it spans nodes).
  const RendezvousKey key = RendezvousKey::random();
  std::vector<Joined> joined = join_all(key, 4, {0, 2}, {0, 2}, 4);
  for (const Joined& j : joined) {
    EXPECT_EQ(j.error, std::string());
    EXPECT_EQ(j.hellos.size(), size_t(2));
    EXPECT_EQ(j.bootstrap->world(), 2);
  }
  // A host with one rank of the communicator: a bootstrap of one.
  std::vector<Joined> alone = join_all(RendezvousKey::random(), 4, {3}, {3}, 4);
  EXPECT_EQ(alone[0].error, std::string());
  EXPECT_EQ(alone[0].hellos.size(), size_t(1));
}

TEST(nccl_rendezvous_refuses_strangers) {
  // A process that knows the socket name but not the communicator's origin is dropped; the ranks
  // still meet.
  const RendezvousKey key = RendezvousKey::random();
  std::vector<std::unique_ptr<LocalRendezvous>> rendezvous;
  for (int i = 0; i < 2; ++i) rendezvous.push_back(std::make_unique<LocalRendezvous>(key, i, 2));
  std::thread stranger([&] {
    detail::Socket s = detail::unix_connect(key.socket_name(0), detail::deadline_after_ms(2000));
    Hello h;
    h.secret = key.secret + 1;
    h.index = 1;
    detail::send_all(s, &h, sizeof(h), detail::deadline_after_ms(2000));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the stranger comes first
  std::vector<Joined> joined(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      Hello mine;
      mine.secret = key.secret;
      mine.rank = i;
      mine.world = 2;
      try {
        joined[i].bootstrap = rendezvous[i]->join(mine, 5000, &joined[i].hellos);
      } catch (const Error& e) {
        joined[i].error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  stranger.join();
  for (const Joined& j : joined) {
    EXPECT_EQ(j.error, std::string());
    EXPECT_EQ(j.hellos.size(), size_t(2));
  }
}

TEST(nccl_rendezvous_names_a_rank_that_never_joins) {
  // Candidate 1 listens (it entered the real init) but never joins: the root names it in time.
  const RendezvousKey key = RendezvousKey::random();
  LocalRendezvous absent(key, 1, 2);
  std::vector<Joined> joined = join_all(key, 2, {0}, {0}, 2, 400);
  EXPECT(joined[0].error.find("did not hear from candidate(s) 1") != std::string::npos);
}

TEST(nccl_rendezvous_failure_reaches_every_rank_at_once) {
  // A rank that fails a collective step closes its end: the others' exchanges fail at once, not at
  // their deadline.
  const RendezvousKey key = RendezvousKey::random();
  std::vector<Joined> joined = join_all(key, 3, {0, 1, 2}, {0, 1, 2}, 3, 60000);
  for (const Joined& j : joined) EXPECT_EQ(j.error, std::string());
  std::atomic<int> failed{0};
  const auto start = std::chrono::steady_clock::now();
  run_on_all(joined, [&](Joined& j) {
    if (j.bootstrap->rank() == 2) {
      j.bootstrap->close();
      return;
    }
    try {
      uint32_t mine = 1, all[3];
      j.bootstrap->all_gather(&mine, all, sizeof(mine));
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kBootstrap) ++failed;
    }
  });
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(failed.load(), 2);
  EXPECT(elapsed < std::chrono::seconds(10));  // the deadline is 60 s
}

namespace {

// Exchanges of `waiting` ranks of `joined` (the others never come) while another thread interrupts
// rank `interrupted` after 300 ms: how many failed with kBootstrap, and how long it took.
std::pair<int, std::chrono::steady_clock::duration> exchange_interrupted(std::vector<Joined>& joined,
                                                                          const std::vector<int>& waiting,
                                                                          int interrupted) {
  std::atomic<int> failed{0};
  const auto start = std::chrono::steady_clock::now();
  std::thread watchdog([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (Joined& j : joined)
      if (j.bootstrap->rank() == interrupted) j.bootstrap->interrupt();
  });
  run_on_all(joined, [&](Joined& j) {
    if (std::find(waiting.begin(), waiting.end(), j.bootstrap->rank()) == waiting.end()) return;
    try {
      uint32_t mine = 1, all[8];
      j.bootstrap->all_gather(&mine, all, sizeof(mine));
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kBootstrap) ++failed;
    }
  });
  watchdog.join();
  return {failed.load(), std::chrono::steady_clock::now() - start};
}

}  // namespace

TEST(nccl_rendezvous_interrupt_ends_exchanges_from_another_thread) {
  // ncclCommAbort from PyTorch's watchdog while the program's thread waits in an exchange (making
  // the symmem side) for a rank that never comes (rank 2): the interrupted rank fails at once, not
  // at the 60 s deadline, and so does every rank waiting on it (the host's root holds every link).
  std::vector<Joined> joined = join_all(RendezvousKey::random(), 3, {0, 1, 2}, {0, 1, 2}, 3, 60000);
  for (const Joined& j : joined) EXPECT_EQ(j.error, std::string());
  auto [failed, elapsed] = exchange_interrupted(joined, {0, 1}, /*interrupted=*/0);
  EXPECT_EQ(failed, 2);
  EXPECT(elapsed < std::chrono::seconds(10));
  // A later exchange of the interrupted rank fails too (its failed exchange closed its end).
  bool later_failed = false;
  try {
    uint32_t mine = 1, all[3];
    joined[0].bootstrap->all_gather(&mine, all, sizeof(mine));
  } catch (const Error&) {
    later_failed = true;
  }
  EXPECT(later_failed);
  // A rank other than the root, interrupted while it waits for the root's answer.
  std::vector<Joined> pair = join_all(RendezvousKey::random(), 2, {0, 1}, {0, 1}, 2, 60000);
  std::tie(failed, elapsed) = exchange_interrupted(pair, {1}, /*interrupted=*/1);
  EXPECT_EQ(failed, 1);
  EXPECT(elapsed < std::chrono::seconds(10));
}

namespace {

// Candidate `index`'s join (of `candidates`, rank = index) on a thread of its own; its error, if any,
// in `error` (empty when it joined), with the time it took.
struct Joining {
  std::string error;
  ErrorCode code = ErrorCode::kInternal;  // (read only when error is set)
  std::chrono::steady_clock::duration took{};
  std::thread thread;
  Joining(LocalRendezvous& rendezvous, const RendezvousKey& key, int index, int candidates, int64_t timeout_ms = 60000) {
    thread = std::thread([this, &rendezvous, key, index, candidates, timeout_ms] {
      Hello mine;
      mine.secret = key.secret;
      mine.rank = index;
      mine.world = candidates;
      std::vector<Hello> hellos;
      const auto start = std::chrono::steady_clock::now();
      try {
        rendezvous.join(mine, timeout_ms, &hellos);
      } catch (const Error& e) {
        error = e.what();
        code = e.code();
      }
      took = std::chrono::steady_clock::now() - start;
    });
  }
};

}  // namespace

TEST(nccl_rendezvous_interrupt_ends_a_join_from_another_thread) {
  // ncclCommAbort while the program's thread joins and a peer that entered the real init never
  // joins (candidate 2): the interrupted root throws kAborted at once, not at its 60 s deadline
  // (whether the interrupt comes before or during its join), and the rank connected to it fails
  // too (told by the root, or finding it gone when the interrupt came first; its own 5 s deadline
  // bounds the case where it starts after the root has gone and waits for candidate 2 itself).
  {
    const RendezvousKey key = RendezvousKey::random();
    LocalRendezvous root(key, 0, 3), member(key, 1, 3), absent(key, 2, 3);
    Joining r(root, key, 0, 3), m(member, key, 1, 3, 5000);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    root.interrupt();
    r.thread.join();
    m.thread.join();
    EXPECT(r.code == ErrorCode::kAborted);
    EXPECT(r.error.find("interrupted") != std::string::npos);
    EXPECT(r.took < std::chrono::seconds(10));
    EXPECT(!m.error.empty());
    EXPECT(m.code == ErrorCode::kAborted || m.code == ErrorCode::kBootstrap || m.code == ErrorCode::kTimeout);
  }
  {
    // A rank other than the root, waiting for an answer from a root that never joins.
    const RendezvousKey key = RendezvousKey::random();
    LocalRendezvous silent_root(key, 0, 2), member(key, 1, 2);
    Joining m(member, key, 1, 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    member.interrupt();
    m.thread.join();
    EXPECT(m.code == ErrorCode::kAborted);
    EXPECT(m.took < std::chrono::seconds(10));
  }
  {
    // An abort before the join: the join throws at once.
    const RendezvousKey key = RendezvousKey::random();
    LocalRendezvous alone(key, 0, 2), other(key, 1, 2);
    alone.interrupt();
    Joining a(alone, key, 0, 2);
    a.thread.join();
    EXPECT(a.code == ErrorCode::kAborted);
    EXPECT(a.took < std::chrono::seconds(5));
  }
}

TEST(nccl_rendezvous_an_aborted_root_tells_the_ranks_connected_to_it) {
  // The member joins first and waits for the root's answer; the root's join starts after it and is
  // interrupted while it waits for candidate 2: the member hears kAborted naming the root, not a
  // closed socket. (Its root's join has 1.5 s to start before the interrupt.)
  const RendezvousKey key = RendezvousKey::random();
  LocalRendezvous root(key, 0, 3), member(key, 1, 3), absent(key, 2, 3);
  Joining m(member, key, 1, 3, 5000);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  Joining r(root, key, 0, 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  root.interrupt();
  r.thread.join();
  m.thread.join();
  EXPECT(r.code == ErrorCode::kAborted);
  EXPECT(m.code == ErrorCode::kAborted);
  EXPECT(m.error.find("the host's root (candidate 0) was aborted") != std::string::npos);
}

TEST(nccl_rendezvous_keys_are_derived_alike) {
  char id[128];
  for (int i = 0; i < 128; ++i) id[i] = static_cast<char>(i * 7);
  const RendezvousKey a = RendezvousKey::of_unique_ids(id, sizeof(id));
  const RendezvousKey b = RendezvousKey::of_unique_ids(id, sizeof(id));
  EXPECT(a.name == b.name && a.secret == b.secret);
  EXPECT(a.name != a.secret);
  id[5] ^= 1;
  EXPECT(RendezvousKey::of_unique_ids(id, sizeof(id)).name != a.name);
  // Children: the same split on every rank gives the same key; another split or colour another.
  EXPECT(a.child(0, 1).name == b.child(0, 1).name && a.child(0, 1).secret == b.child(0, 1).secret);
  EXPECT(a.child(0, 1).name != a.child(1, 1).name);
  EXPECT(a.child(0, 1).name != a.child(0, 2).name);
  EXPECT(a.socket_name(3).find("@symmem-nccl-") == 0);
  EXPECT(a.socket_name(3).rfind("-3") == a.socket_name(3).size() - 2);
}
