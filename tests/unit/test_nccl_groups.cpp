// libsymmem_nccl.so's group bookkeeping (src/nccl/group_queue.hpp, group_streams.hpp) and window lookups
// (src/nccl/windows.hpp).
#include <atomic>
#include <cstdint>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "nccl/group_queue.hpp"
#include "nccl/error_map.hpp"
#include "nccl/group_streams.hpp"
#include "nccl/windows.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::nccl;

namespace {

// Two parties meet, or give up after a while (so that a broken schedule fails instead of hanging).
class Meeting {
 public:
  bool meet() {
    std::unique_lock<std::mutex> lock(mutex_);
    ++arrived_;
    cv_.notify_all();
    return cv_.wait_for(lock, std::chrono::seconds(5), [&] { return arrived_ >= 2; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
};

}  // namespace

TEST(nccl_group_depth_counts_nested_groups) {
  GroupQueue g;
  bool outermost = true;
  EXPECT(!g.end(&outermost));  // no group open
  g.start();
  g.start();
  EXPECT(g.open());
  EXPECT(g.end(&outermost) && !outermost);
  EXPECT(g.open());
  EXPECT(g.end(&outermost) && outermost);
  EXPECT(!g.open());
}

TEST(nccl_group_keeps_items_in_order) {
  GroupQueue g;
  std::vector<int> ran;
  g.start();
  for (int i = 0; i < 5; ++i) g.defer({nullptr, false, [&ran, i] {
                                         ran.push_back(i);
                                         return ncclSuccess;
                                       }});
  std::vector<GroupItem> items = g.take();
  EXPECT(g.take().empty());
  EXPECT_EQ(run_per_communicator(items), ncclSuccess);
  EXPECT(ran == std::vector<int>({0, 1, 2, 3, 4}));
}

TEST(nccl_group_runs_launches_inline_in_order) {
  // Items that do not wait for peers (launches) run on this thread in the order they were made,
  // even across communicators.
  int a = 0, b = 0;
  std::vector<int> order;
  const std::thread::id me = std::this_thread::get_id();
  bool same_thread = true;
  std::vector<GroupItem> items;
  for (int i = 0; i < 6; ++i) {
    const void* comm = (i % 2) ? static_cast<const void*>(&a) : static_cast<const void*>(&b);
    items.push_back({comm, false, [&, i] {
                       same_thread = same_thread && std::this_thread::get_id() == me;
                       order.push_back(i);
                       return ncclSuccess;
                     }});
  }
  EXPECT_EQ(run_per_communicator(items), ncclSuccess);
  EXPECT(same_thread);
  EXPECT(order == std::vector<int>({0, 1, 2, 3, 4, 5}));
}

TEST(nccl_group_runs_communicators_that_wait_for_peers_at_once) {
  // One thread drives two ranks (two communicators) through a group: each rank's handshake waits
  // for the other's. Run one after the other they would never meet.
  int a = 0, b = 0;
  Meeting meeting;
  std::atomic<int> met{0};
  std::vector<int> order_a, order_b;
  std::vector<GroupItem> items;
  for (int step = 0; step < 2; ++step) {
    for (int* comm : {&a, &b}) {
      std::vector<int>& order = comm == &a ? order_a : order_b;
      items.push_back({comm, true, [&, step] {
                         if (step == 0 && meeting.meet()) ++met;
                         order.push_back(step);
                         return ncclSuccess;
                       }});
    }
  }
  EXPECT_EQ(run_per_communicator(items), ncclSuccess);
  EXPECT_EQ(met.load(), 2);
  EXPECT(order_a == std::vector<int>({0, 1}));  // each communicator's items in order
  EXPECT(order_b == std::vector<int>({0, 1}));
}

TEST(nccl_group_reports_the_first_failure_and_runs_everything) {
  int ran = 0;
  std::vector<GroupItem> items;
  items.push_back({nullptr, false, [&] { return ++ran, ncclSuccess; }});
  items.push_back({nullptr, false, [&] { return ++ran, ncclRemoteError; }});
  items.push_back({nullptr, false, [&]() -> ncclResult_t {
                     ++ran;
                     throw std::runtime_error("an item that throws");
                   }});
  items.push_back({nullptr, false, [&] { return ++ran, ncclInvalidArgument; }});
  EXPECT_EQ(run_per_communicator(items), ncclRemoteError);
  EXPECT_EQ(ran, 4);
}

// A thread that cannot be started (threads or memory exhausted) used to leave the first, started
// std::thread joinable when its vector unwound (std::terminate), or to throw out of ncclGroupEnd
// before the real group's end (NCCL's group left open on this thread). Now that communicator's
// items fail with ncclSystemError, said, and the others run.
TEST(nccl_group_survives_a_thread_that_cannot_start) {
  static int comms[3];  // map order = address order: the second communicator's thread fails
  std::atomic<int> ran{0};
  std::vector<GroupItem> items;
  for (int& c : comms) items.push_back({&c, true, [&] { return ++ran, ncclSuccess; }});
  int started = 0;
  const ThreadStarter failing_second = [&](std::function<void()> work) {
    if (++started == 2) throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    return std::thread(std::move(work));
  };
  clear_last_error();
  EXPECT_EQ(run_per_communicator(items, failing_second), ncclSystemError);
  EXPECT_EQ(ran.load(), 2);
  EXPECT(last_error().find("could not start a thread") != std::string::npos);
}

TEST(nccl_windows_find_operands_inside_mapped_windows) {
  static char memory[4096];
  Buffer* mapped = reinterpret_cast<Buffer*>(&memory[0]);  // any non-null: lookups only
  Windows w;
  EXPECT(w.empty());
  w.add({reinterpret_cast<ncclWindow_t>(1), memory + 1024, 1024, mapped});
  w.add({reinterpret_cast<ncclWindow_t>(2), memory + 2048, 512, nullptr});  // staged
  w.add({reinterpret_cast<ncclWindow_t>(3), memory + 3072, 1024, mapped});
  EXPECT(w.find(memory + 1024, 1024) != nullptr);
  EXPECT(w.find(memory + 1500, 500) != nullptr);
  EXPECT(w.find(memory + 2047, 1) != nullptr);
  EXPECT(w.find(memory + 1500, 549) == nullptr);  // runs past the window
  EXPECT(w.find(memory + 1023, 2) == nullptr);    // starts before it
  EXPECT(w.find(memory, 16) == nullptr);
  EXPECT(w.find(memory + 2048, 16) == nullptr);  // a window without a buffer
  EXPECT(w.find(memory + 3072, 0) != nullptr);
  EXPECT(w.find(memory + 3072 + 1024, 1) == nullptr);
  const auto removed = w.remove(reinterpret_cast<ncclWindow_t>(1));
  EXPECT(removed && removed->begin == memory + 1024);
  EXPECT(w.find(memory + 1500, 1) == nullptr);
  EXPECT(!w.remove(reinterpret_cast<ncclWindow_t>(1)));
}

// ncclCommWindowRegister twice at one address: each handle releases its own window (the first was
// overwritten by the second, and its import leaked until the communicator died).
TEST(nccl_windows_keep_a_window_registered_twice_at_one_address) {
  static char memory[1024];
  Buffer* mapped = reinterpret_cast<Buffer*>(&memory[0]);
  Windows w;
  w.add({reinterpret_cast<ncclWindow_t>(1), memory, 1024, mapped});
  w.add({reinterpret_cast<ncclWindow_t>(2), memory, 512, nullptr});
  EXPECT(w.find(memory + 600, 100) != nullptr);  // the first still serves what the second cannot
  const auto first = w.remove(reinterpret_cast<ncclWindow_t>(1));
  EXPECT(first && first->handle == reinterpret_cast<ncclWindow_t>(1) && first->buffer == mapped);
  EXPECT(w.find(memory + 600, 100) == nullptr);
  const auto second = w.remove(reinterpret_cast<ncclWindow_t>(2));
  EXPECT(second && second->handle == reinterpret_cast<ncclWindow_t>(2));
  EXPECT(w.empty());
}

// Windows nest (a pool registered whole and a part of it again): an operand must resolve to the
// same window on every rank, whatever its rank-dependent offset. An in-place reduce-scatter's output
// lies at send + rank x N: on rank 0 inside the pool only, on rank 1 inside the inner window too,
// which the nearest-below rule picked, so that the ranks disagreed on the call's layout.
TEST(nccl_windows_resolve_nested_windows_to_the_outermost) {
  static char memory[4096];
  Buffer* pool = reinterpret_cast<Buffer*>(&memory[0]);
  Buffer* part = reinterpret_cast<Buffer*>(&memory[1]);
  for (int order = 0; order < 2; ++order) {  // the inner window registered after the pool, then before
    Windows w;
    const Window outer{reinterpret_cast<ncclWindow_t>(1), memory, 4096, pool};
    const Window inner{reinterpret_cast<ncclWindow_t>(2), memory + 1024, 1024, part};
    if (order == 0) {
      w.add(outer);
      w.add(inner);
    } else {
      w.add(inner);
      w.add(outer);
    }
    const Window* rank0_out = w.find(memory, 1024);       // recv = send + 0 x 1024
    const Window* rank1_out = w.find(memory + 1024, 1024);  // recv = send + 1 x 1024
    EXPECT(rank0_out && rank0_out->buffer == pool);
    EXPECT(rank1_out && rank1_out->buffer == pool);
    const Window* inside_both = w.find(memory + 1536, 100);
    EXPECT(inside_both && inside_both->buffer == pool);
    // The inner window alone (the pool released) still serves its own range.
    EXPECT(w.remove(reinterpret_cast<ncclWindow_t>(1)));
    const Window* inner_alone = w.find(memory + 1024, 1024);
    EXPECT(inner_alone && inner_alone->buffer == part);
    EXPECT(w.find(memory, 1024) == nullptr);
  }
}

// An outer window that stayed staged (its import failed on every rank) keeps every operand inside
// it staged, also those an inner mapped window holds: else rank 0's operand (outside the inner
// window) is staged and rank 1's (inside it) served, and the ranks route the call differently.
TEST(nccl_windows_inside_a_staged_outer_window_stay_staged) {
  static char memory[4096];
  Buffer* part = reinterpret_cast<Buffer*>(&memory[1]);
  Windows w;
  w.add({reinterpret_cast<ncclWindow_t>(1), memory, 4096, nullptr});
  w.add({reinterpret_cast<ncclWindow_t>(2), memory + 1024, 1024, part});
  EXPECT(w.find(memory, 1024) == nullptr);
  EXPECT(w.find(memory + 1024, 1024) == nullptr);
  EXPECT(w.remove(reinterpret_cast<ncclWindow_t>(1)));
  const Window* alone = w.find(memory + 1024, 1024);  // the pool released: the part serves its range
  EXPECT(alone && alone->buffer == part);
  // A window far below a small one: the scan's bound (the largest window) stops before it.
  w.add({reinterpret_cast<ncclWindow_t>(3), memory, 16, part});
  EXPECT(w.find(memory + 1024, 1024) == alone);
  EXPECT(w.find(memory + 8, 8) != nullptr);
  EXPECT(w.find(memory + 8, 9) == nullptr);
}

// group_streams.hpp: a communicator's served calls join the group's other streams of that
// communicator; one stream per communicator needs nothing.
TEST(nccl_group_joins_the_streams_of_a_communicator_with_served_calls) {
  const void* a = reinterpret_cast<const void*>(0xa);
  const void* b = reinterpret_cast<const void*>(0xb);
  auto s = [](int i) { return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(0x100 + i)); };
  // One stream per communicator (PyTorch, nccl-tests): nothing to join.
  EXPECT(plan_stream_joins({{a, s(1), true}, {a, s(1), false}, {b, s(2), true}}).empty());
  // a: served on s1 and s2, a forwarded call on s3; b: forwarded only, on two streams.
  const std::vector<StreamJoin> joins = plan_stream_joins(
      {{b, s(5), false}, {a, s(3), false}, {a, s(1), true}, {b, s(6), false}, {a, s(2), true}, {a, s(3), false}});
  EXPECT_EQ(joins.size(), size_t(1));
  EXPECT(joins[0].comm == a && joins[0].leader == s(1));
  EXPECT(joins[0].others == (std::vector<cudaStream_t>{s(3), s(2)}));
  EXPECT(served_stream(joins, a, s(2)) == s(1));
  EXPECT(served_stream(joins, b, s(6)) == s(6));
}
