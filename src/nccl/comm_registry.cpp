#include "nccl/comm_registry.hpp"

#include <mutex>
#include <unordered_map>
#include <vector>

namespace symmem::nccl {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<ncclComm_t, std::shared_ptr<CommPair>> pairs;
  std::vector<std::shared_ptr<CommPair>> retired;
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
}

std::shared_ptr<CommPair> find_pair(ncclComm_t comm) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.pairs.find(comm);
  return it == r.pairs.end() ? nullptr : it->second;
}

std::shared_ptr<CommPair> take_pair(ncclComm_t comm) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.pairs.find(comm);
  if (it == r.pairs.end()) return nullptr;
  std::shared_ptr<CommPair> pair = std::move(it->second);
  r.pairs.erase(it);
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
