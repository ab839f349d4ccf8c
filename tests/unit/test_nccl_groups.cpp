// libsymmem_nccl.so's group bookkeeping (src/nccl/group_queue.hpp, group_streams.hpp) and window lookups
// (src/nccl/windows.hpp).
#include <atomic>
#include <cstdint>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "nccl/group_queue.hpp"
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
