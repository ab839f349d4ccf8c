#include "nccl/comm_registry.hpp"

#include <mutex>
#include <vector>

#include "nccl/read_mostly_map.hpp"

namespace symmem::nccl {
namespace {

struct Registry {
  ReadMostlyMap<ncclComm_t, CommPair> pairs;  // every collective looks up here
  std::mutex retired_mutex;
  std::vector<std::shared_ptr<CommPair>> retired;
};

// Never destroyed: the process's exit must not release communicators after CUDA is gone.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

}  // namespace

void add_pair(ncclComm_t comm, std::shared_ptr<CommPair> pair) { registry().pairs.put(comm, std::move(pair)); }

std::shared_ptr<CommPair> find_pair(ncclComm_t comm) { return registry().pairs.find(comm); }

std::shared_ptr<CommPair> take_pair(ncclComm_t comm) { return registry().pairs.take(comm); }

void retire_pair(std::shared_ptr<CommPair> pair) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.retired_mutex);
  r.retired.push_back(std::move(pair));
}

void release_retired_pairs() noexcept {
  std::vector<std::shared_ptr<CommPair>> retired;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.retired_mutex);
    retired.swap(r.retired);
  }
  retired.clear();  // outside the lock: releasing synchronises the device
}

}  // namespace symmem::nccl
