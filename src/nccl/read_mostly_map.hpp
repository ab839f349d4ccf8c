// A map that many threads read on every call and few threads change: the shim's communicator
// registry (comm_registry.hpp), looked up by every collective and by every
// ncclCommGetAsyncError, which programs poll in a loop while they wait (nccl-tests, PyTorch's
// watchdog). With one mutex for every lookup, a thread polling its communicator delays another
// thread's launches on its own communicator (one process driving several GPUs); here a lookup a
// thread repeats takes no lock.
//
// Each thread keeps its last lookups, hits and misses, for one generation of the map: every change
// gives the map a new generation (under the lock), and a thread that sees another generation drops
// what it kept. Generations are unique across the maps of one type, which share a thread's kept
// lookups (a map made where another was destroyed never matches what a thread kept of the old
// one). The thread keeps weak references: it never keeps a value alive, and a value found is the
// map's at the moment the generation was read (as a locked lookup's is at its unlock). A thread
// keeps the last 8 keys of one map at a time: a thread cycling through more keys, or alternating
// between two maps, looks up under the lock. A kept weak reference holds a taken value's memory
// (not the value) until the thread's next change of generation or its exit.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "common/exit_safe_thread_local.hpp"

namespace symmem::nccl {

template <class Key, class Value>
class ReadMostlyMap {
 public:
  void put(const Key& key, std::shared_ptr<Value> value) {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = std::move(value);
    changed();
  }

  // The value under `key` (null when none), removed from the map.
  std::shared_ptr<Value> take(const Key& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = values_.find(key);
    if (it == values_.end()) return nullptr;
    std::shared_ptr<Value> value = std::move(it->second);
    values_.erase(it);
    changed();
    return value;
  }

  std::shared_ptr<Value> find(const Key& key) const {
    // (Exit-safe: static destructors and atexit handlers, which run after the thread-locals'
    // destructors, may still call the shim.)
    Kept& kept = detail::exit_safe_thread_local<Kept>();
    const uint64_t now = generation_.load(std::memory_order_acquire);
    std::shared_ptr<Value> value;
    if (kept.generation != now) {
      kept.reset(now);
    } else if (kept.find(key, &value)) {
      return value;
    }
    value = locked_find(key);
    // Kept under the generation read before the lock: a change in between makes the next lookup
    // drop it unused.
    kept.put(key, value);
    return value;
  }

  // Lookups that took the lock since the map was made (tests: repeated lookups take none).
  uint64_t locked_lookups() const { return locked_lookups_.load(std::memory_order_relaxed); }

 private:
  std::shared_ptr<Value> locked_find(const Key& key) const {
    std::lock_guard<std::mutex> lock(mutex_);
    locked_lookups_.fetch_add(1, std::memory_order_relaxed);
    auto it = values_.find(key);
    return it == values_.end() ? nullptr : it->second;
  }

  // Counted for the maps of this type: each value is one generation of one map.
  static uint64_t new_generation() {
    static std::atomic<uint64_t> last{0};
    return last.fetch_add(1, std::memory_order_relaxed) + 1;
  }

  // A thread's last lookups in one generation. Eight: a thread driving every GPU of a node (one
  // communicator each) finds each of them here.
  struct Kept {
    static constexpr int kEntries = 8;
    uint64_t generation = 0;  // (0: none; generations start at 1)
    int next = 0;
    std::array<Key, kEntries> keys{};
    std::array<bool, kEntries> filled{};
    std::array<std::weak_ptr<Value>, kEntries> values;

    // Whether `key` is kept; *value is its value (null: a miss kept, or a value taken out since
    // the generation was read: either answers as a lookup after the take would).
    bool find(const Key& key, std::shared_ptr<Value>* value) const {
      for (int i = 0; i < kEntries; ++i) {
        if (filled[i] && keys[i] == key) {
          *value = values[i].lock();
          return true;
        }
      }
      return false;
    }
    void put(const Key& key, const std::shared_ptr<Value>& value) {
      keys[next] = key;
      values[next] = value;
      filled[next] = true;
      next = (next + 1) % kEntries;
    }
    void reset(uint64_t now) {
      generation = now;
      filled.fill(false);
      for (auto& v : values) v.reset();
    }
  };

  void changed() { generation_.store(new_generation(), std::memory_order_release); }

  mutable std::mutex mutex_;
  std::unordered_map<Key, std::shared_ptr<Value>> values_;
  std::atomic<uint64_t> generation_{new_generation()};
  mutable std::atomic<uint64_t> locked_lookups_{0};
};

}  // namespace symmem::nccl
