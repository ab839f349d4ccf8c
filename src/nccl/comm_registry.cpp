#include "nccl/comm_registry.hpp"

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace symmem::nccl {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<ncclComm_t, std::shared_ptr<CommPair>> pairs;
  std::vector<std::shared_ptr<CommPair>> retired;
  // Bumped (under the mutex) after every change of `pairs`: a thread's last lookup holds while it
  // is unchanged.
  std::atomic<uint64_t> generation{0};
};

// This thread's last lookup: every collective looks its communicator up, and the registry's mutex,
// taken by every rank's thread of a process each call, cost forwarded calls a few percent of
// NCCL's ~10 us host time. A weak reference: the cache never keeps a destroyed pair alive.
struct LastLookup {
  ncclComm_t comm = nullptr;
  std::weak_ptr<CommPair> pair;
  bool found = false;
  uint64_t generation = ~uint64_t(0);
};

// Never destroyed: the process's exit must not release communicators after CUDA is gone.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

void add_pair(ncclComm_t comm, std::shared_ptr<CommPair> pair) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.pairs[comm] = std::move(pair);
  r.generation.fetch_add(1, std::memory_order_release);
}

std::shared_ptr<CommPair> find_pair(ncclComm_t comm) {
  Registry& r = registry();
  thread_local LastLookup last;
  if (last.comm == comm && last.generation == r.generation.load(std::memory_order_acquire))
    return last.found ? last.pair.lock() : nullptr;
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.pairs.find(comm);
  std::shared_ptr<CommPair> pair = it == r.pairs.end() ? nullptr : it->second;
  last = {comm, pair, pair != nullptr, r.generation.load(std::memory_order_relaxed)};
  return pair;
}

std::shared_ptr<CommPair> take_pair(ncclComm_t comm) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.pairs.find(comm);
  if (it == r.pairs.end()) return nullptr;
  std::shared_ptr<CommPair> pair = std::move(it->second);
  r.pairs.erase(it);
  r.generation.fetch_add(1, std::memory_order_release);
  return pair;
}

void retire_pair(std::shared_ptr<CommPair> pair) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.retired.push_back(std::move(pair));
}

void release_retired_pairs() noexcept {
  std::vector<std::shared_ptr<CommPair>> retired;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    retired.swap(r.retired);
  }
  retired.clear();  // outside the lock: releasing synchronises the device
}

}  // namespace symmem::nccl
