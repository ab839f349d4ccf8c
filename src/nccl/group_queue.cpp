#include "nccl/group_queue.hpp"

#include <cuda_runtime_api.h>

#include <map>
#include <thread>

#include "common/exit_safe_thread_local.hpp"
#include "nccl/error_map.hpp"

namespace symmem::nccl {

bool GroupQueue::end(bool* outermost) {
  if (depth_ == 0) return false;
  --depth_;
  *outermost = depth_ == 0;
  return true;
}

std::vector<GroupItem> GroupQueue::take() {
  std::vector<GroupItem> items;
  items.swap(items_);
  return items;
}

GroupQueue& this_thread_group() { return detail::exit_safe_thread_local<GroupQueue>(); }

namespace {

ncclResult_t run_item(GroupItem& item) noexcept {
  try {
    return item.run();
  } catch (...) {
    return ncclInternalError;  // items report their own errors; this only keeps a thread alive
  }
}

}  // namespace

ncclResult_t run_per_communicator(std::vector<GroupItem>& items) {
  return run_per_communicator(items, [](std::function<void()> work) { return std::thread(std::move(work)); });
}

ncclResult_t run_per_communicator(std::vector<GroupItem>& items, const ThreadStarter& start_thread) {
  std::vector<ncclResult_t> results(items.size(), ncclSuccess);
  std::map<const void*, std::vector<size_t>> by_comm;  // item indices, in order
  bool waits = false;
  for (size_t i = 0; i < items.size(); ++i) {
    by_comm[items[i].comm].push_back(i);
    waits = waits || items[i].waits_for_peers;
  }
  if (by_comm.size() <= 1 || !waits) {
    for (size_t i = 0; i < items.size(); ++i) results[i] = run_item(items[i]);
  } else {
    // The caller's device for each thread: a new thread's is device 0, and the device guards of
    // the items restore what they found, which would make a context on GPU 0 in a process that
    // never uses it.
    int device = 0;
    const bool has_device = cudaGetDevice(&device) == cudaSuccess;
    std::vector<std::thread> threads;
    threads.reserve(by_comm.size());
    for (auto& [comm, indices] : by_comm) {
      try {
        threads.push_back(start_thread([&items, &results, &indices, device, has_device] {
          // A failure leaves device 0, as before, and no error for a later cudaGetLastError.
          if (has_device && cudaSetDevice(device) != cudaSuccess) (void)cudaGetLastError();
          for (size_t i : indices) results[i] = run_item(items[i]);
        }));
      } catch (...) {
        // (never leave a started thread unjoined: its std::thread would end the process)
        for (size_t i : indices) results[i] = ncclSystemError;
        set_last_error("symmem NCCL shim: could not start a thread for a communicator's part of the group's "
                       "work (out of threads or memory); that part did not run, and what its peers wait for "
                       "ends at their deadline");
      }
    }
    for (auto& t : threads) t.join();
  }
  for (ncclResult_t r : results)
    if (r != ncclSuccess) return r;
  return ncclSuccess;
}

}  // namespace symmem::nccl
