// ncclGroupStart / ncclGroupEnd as the shim keeps them. NCCL's groups are per thread: calls made
// between the outermost start and its end are launched at the end, together. The shim forwards the
// group to the real NCCL (forwarded calls join NCCL's group as usual) and keeps its own work for
// after the real ncclGroupEnd, in the order it was made:
//   - the handshakes of communicators made inside the group (their real init completes at the end);
//   - window registrations (collective);
//   - served collectives (launched on their streams in the order they were called).
// A group holds no dependency between its calls (NCCL's rule), so launching the served ones after
// the forwarded ones keeps its meaning; on each stream the served calls keep their order.
//
// One thread may drive several communicators through one group (nccl-tests -g 2, one process per
// node). Work that waits for the other ranks on the host (a handshake, a window registration, the
// first served call, which makes the symmem communicator) would then deadlock run one after the
// other, so run_per_communicator runs each communicator's work on a thread of its own whenever
// there is such work for several communicators. Pure C++: tested on the CPU.
#pragma once

#include <nccl.h>

#include <functional>
#include <thread>
#include <vector>

namespace symmem::nccl {

struct GroupItem {
  const void* comm = nullptr;  // items of one communicator run in order, on one thread
  bool waits_for_peers = false;  // blocks the host until the other ranks do the same
  std::function<ncclResult_t()> run;
};

class GroupQueue {
 public:
  void start() { ++depth_; }
  // False (and nothing changes) when no group is open. *outermost: this end closed the outermost.
  bool end(bool* outermost);
  int depth() const { return depth_; }
  bool open() const { return depth_ > 0; }
  void defer(GroupItem item) { items_.push_back(std::move(item)); }
  // Everything deferred, in order; the queue is empty afterwards.
  std::vector<GroupItem> take();
  bool has_items() const { return !items_.empty(); }

 private:
  int depth_ = 0;
  std::vector<GroupItem> items_;
};

// This thread's queue.
GroupQueue& this_thread_group();

// Runs every item: in order on this thread when they belong to one communicator or none waits for
// peers, else each communicator's items in order on a thread of its own. Returns the first failure
// in the items' order (every item runs, whatever failed before it), or ncclSuccess. A thread that
// cannot be started (the process is out of threads or memory) fails its communicator's items with
// ncclSystemError, said by ncclGetLastError; the others still run (what waits for the missing
// communicator ends at its deadline), and the call returns: it never throws for it.
ncclResult_t run_per_communicator(std::vector<GroupItem>& items);

// The same, with the threads started by `start_thread` (tests give one that fails).
using ThreadStarter = std::function<std::thread(std::function<void()>)>;
ncclResult_t run_per_communicator(std::vector<GroupItem>& items, const ThreadStarter& start_thread);

}  // namespace symmem::nccl
