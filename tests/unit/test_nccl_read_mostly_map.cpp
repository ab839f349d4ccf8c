// The shim's communicator registry map (src/nccl/read_mostly_map.hpp): lookups a thread repeats
// take no lock, and what a thread kept never outlives a change of the map.
#include <unistd.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "nccl/read_mostly_map.hpp"
#include "test.hpp"

using symmem::nccl::ReadMostlyMap;

namespace {

struct Item {
  int id = 0;
};

}  // namespace

TEST(nccl_map_repeated_lookups_take_no_lock) {
  ReadMostlyMap<int, Item> map;
  map.put(1, std::make_shared<Item>(Item{1}));
  for (int i = 0; i < 1000; ++i) {
    EXPECT(map.find(1) && map.find(1)->id == 1);
    EXPECT(!map.find(7));  // a miss is kept too
  }
  EXPECT(map.locked_lookups() <= 2);  // the first lookup of each key
}

TEST(nccl_map_a_thread_cycling_through_eight_keys_takes_no_lock) {
  // One thread driving every GPU of a node: one communicator each, looked up in turn.
  ReadMostlyMap<int, Item> map;
  for (int key = 0; key < 8; ++key) map.put(key, std::make_shared<Item>(Item{key}));
  for (int round = 0; round < 100; ++round)
    for (int key = 0; key < 8; ++key) EXPECT(map.find(key) && map.find(key)->id == key);
  EXPECT(map.locked_lookups() <= 8);
}

TEST(nccl_map_sees_every_change_at_once) {
  ReadMostlyMap<int, Item> map;
  EXPECT(!map.find(1));  // a miss kept ...
  map.put(1, std::make_shared<Item>(Item{1}));
  EXPECT(map.find(1) && map.find(1)->id == 1);  // ... is dropped by the put
  map.put(1, std::make_shared<Item>(Item{2}));
  EXPECT(map.find(1) && map.find(1)->id == 2);  // a replaced value is not the kept one
  std::shared_ptr<Item> taken = map.take(1);
  EXPECT(taken && taken->id == 2);
  EXPECT(!map.find(1));
  EXPECT(!map.take(1));
}

TEST(nccl_map_keeps_no_value_alive) {
  ReadMostlyMap<int, Item> map;
  std::weak_ptr<Item> watch;
  {
    auto item = std::make_shared<Item>(Item{3});
    watch = item;
    map.put(3, std::move(item));
  }
  EXPECT(map.find(3));  // kept by this thread now
  map.take(3);          // dropped by the map
  EXPECT(watch.expired());
}

TEST(nccl_map_made_where_another_was_is_not_confused_with_it) {
  // Maps made and destroyed in turn may share an address: what this thread kept of one must not
  // answer for the next.
  for (int round = 0; round < 8; ++round) {
    auto map = std::make_unique<ReadMostlyMap<int, Item>>();
    map->put(5, std::make_shared<Item>(Item{round}));  // (each map one change after its making)
    EXPECT(map->find(5) && map->find(5)->id == round);
  }
}

TEST(nccl_map_threads_polling_their_own_keys_take_no_lock) {
  // The case it is for: one thread per GPU, each looking up its own communicator on every call.
  ReadMostlyMap<int, Item> map;
  constexpr int kThreads = 4;
  constexpr int kLookups = 20000;
  for (int t = 0; t < kThreads; ++t) map.put(t, std::make_shared<Item>(Item{t}));
  const uint64_t before = map.locked_lookups();
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kLookups; ++i) {
        std::shared_ptr<Item> item = map.find(t);
        if (!item || item->id != t) wrong.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT(map.locked_lookups() - before <= kThreads);
}

TEST(nccl_map_lookups_racing_changes_see_a_value_of_the_key) {
  // A writer replaces and removes values while readers look up: every value found is one the map
  // held under that key (ids encode the key), and nothing crashes (clean under TSAN as well).
  ReadMostlyMap<int, Item> map;
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&] {
      while (!stop.load()) {
        for (int key = 0; key < 6; ++key) {
          std::shared_ptr<Item> item = map.find(key);
          if (item && item->id % 100 != key) wrong.fetch_add(1);
        }
      }
    });
  }
  for (int i = 0; i < 20000; ++i) {
    const int key = i % 6;
    if (i % 3 == 2)
      map.take(key);
    else
      map.put(key, std::make_shared<Item>(Item{(i % 1000) * 100 + key}));
  }
  stop = true;
  for (auto& th : readers) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(nccl_map_a_change_ordered_before_a_lookup_is_seen) {
  // A writer changes the value under a key, then hands the step over (release / acquire) to a
  // reader that looked the key up before: the reader's lookup must answer as of the step, never
  // with what it kept from the step before.
  ReadMostlyMap<int, Item> map;
  constexpr int kSteps = 4000;
  std::atomic<int> step{0}, seen{0};
  std::atomic<int> wrong{0};
  std::thread reader([&] {
    for (int s = 1; s <= kSteps; ++s) {
      while (step.load(std::memory_order_acquire) < s) std::this_thread::yield();
      std::shared_ptr<Item> item = map.find(5);
      const bool present = (s - 1) % 3 != 2;  // steps put, put, take, ...
      if (present != bool(item) || (item && item->id != s - 1)) wrong.fetch_add(1);
      seen.store(s, std::memory_order_release);
    }
  });
  std::vector<std::shared_ptr<Item>> retired;  // taken values stay alive: a stale hit would lock
  for (int s = 1; s <= kSteps; ++s) {
    if ((s - 1) % 3 == 2)
      retired.push_back(map.take(5));
    else
      map.put(5, std::make_shared<Item>(Item{s - 1}));
    step.store(s, std::memory_order_release);
    while (seen.load(std::memory_order_acquire) < s) std::this_thread::yield();
  }
  reader.join();
  EXPECT_EQ(wrong.load(), 0);
}

namespace {

ReadMostlyMap<int, Item>* exit_map = nullptr;  // made in the child below, never destroyed

// Runs after the child's thread-locals were destroyed (exit: thread-local destructors first, then
// atexit handlers and static destructors, which may still call the shim): lookups keep working and
// see every change; the thread's lookups start afresh (a first lookup takes the lock), never from
// what the destroyed ones held.
void lookups_at_exit() {
  ReadMostlyMap<int, Item>& map = *exit_map;
  const uint64_t before = map.locked_lookups();
  bool ok = map.find(1) && map.find(1)->id == 1;
  ok = ok && map.locked_lookups() - before == 1;
  map.put(2, std::make_shared<Item>(Item{2}));
  ok = ok && map.find(2) && map.find(2)->id == 2;
  ok = ok && map.take(1) && !map.find(1);
  _exit(ok ? 0 : 3);
}

}  // namespace

TEST(nccl_map_lookups_after_the_thread_locals_are_destroyed_start_afresh) {
  const auto body = [] {
    exit_map = new ReadMostlyMap<int, Item>();
    exit_map->put(1, std::make_shared<Item>(Item{1}));
    for (int i = 0; i < 3; ++i) exit_map->find(1);  // kept by this thread
  };
  EXPECT_EQ(symmem::test::exit_status_of_child(body, lookups_at_exit), 0);
}
