// Collectives routed per call, groups, windows, and the errors the program reads back.
#include <algorithm>
#include <memory>
#include <set>
#include <vector>

#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "common/exit_safe_thread_local.hpp"
#include "nccl/comm_registry.hpp"
#include "nccl/error_map.hpp"
#include "nccl/group_queue.hpp"
#include "nccl/group_streams.hpp"
#include "nccl/route_log.hpp"
#include "nccl/shim.hpp"

namespace symmem::nccl {
namespace {

// A call routed to symmem inside a group: launched at the outermost ncclGroupEnd, or forwarded
// there (inside the real group, still open) when its communicator cannot serve it after all.
struct DeferredCall {
  std::shared_ptr<CommPair> pair;
  NcclCall call;
  const void* send;
  void* recv;
  ncclComm_t comm;
  cudaStream_t stream;
  bool served = false;
};

std::vector<DeferredCall>& deferred_calls() { return detail::exit_safe_thread_local<std::vector<DeferredCall>>(); }

// The streams of the open group's calls that went to the real NCCL on a communicator the shim
// keeps (group_streams.hpp: they join the group's served calls).
std::vector<GroupStreamUse>& forwarded_in_group() {
  return detail::exit_safe_thread_local<std::vector<GroupStreamUse>>();
}

// Why a call routed to symmem went to NCCL after all.
constexpr const char* kNoSymmemSide =
    "routed to symmem, but its communicator could not be made now (under capture, or it failed)";

ncclResult_t aborted_call() {
  set_last_error("symmem NCCL shim: the communicator was aborted while this call was being prepared");
  return ncclRemoteError;
}

void keep_first_failure(ncclResult_t* first, ncclResult_t result) {
  if (result != ncclSuccess && (*first == ncclSuccess || *first == ncclInProgress)) *first = result;
}

}  // namespace

const RealNccl& real_nccl() {
  const RealNccl* real = RealNccl::get();
  if (!real)
    throw Error(ErrorCode::kSystemError, "symmem NCCL shim: no real NCCL could be loaded (set SYMMEM_NCCL_LIBRARY): " +
                                             RealNccl::load_failure());
  return *real;
}

ncclResult_t forwarded(ncclResult_t result) {
  if (result != ncclSuccess && result != ncclInProgress) clear_last_error();
  return result;
}

namespace {

// The real function of call.op with the program's arguments; kUnsupported (ncclInvalidUsage) when
// the real library lacks it.
ncclResult_t forward_to_real(const NcclCall& call, const void* send, void* recv, ncclComm_t comm, cudaStream_t stream) {
  const RealNccl& real = real_nccl();
  switch (call.op) {
    case Collective::kAllReduce:
      return require_real(real.ncclAllReduce, "ncclAllReduce")(send, recv, call.count, call.type, call.redop, comm,
                                                               stream);
    case Collective::kReduceScatter:
      return require_real(real.ncclReduceScatter, "ncclReduceScatter")(send, recv, call.count, call.type, call.redop,
                                                                       comm, stream);
    case Collective::kAllGather:
      return require_real(real.ncclAllGather, "ncclAllGather")(send, recv, call.count, call.type, comm, stream);
    case Collective::kAlltoAll:
      return require_real(real.ncclAlltoAll, "ncclAlltoAll")(send, recv, call.count, call.type, comm, stream);
    default:
      throw Error(ErrorCode::kInternal, std::string("symmem NCCL shim: no forward for ") + collective_name(call.op));
  }
}

}  // namespace

ncclResult_t collective(NcclCall call, const void* send, void* recv, ncclComm_t comm, cudaStream_t stream) {
  // What forwarding this call means (no closure: the forwarded path allocates nothing).
  auto forward = [&] { return forward_to_real(call, send, recv, comm, stream); };
  std::shared_ptr<CommPair> pair = find_pair(comm);
  if (!pair) return forwarded(forward());
  GroupQueue& group = this_thread_group();
  if (!pair->handshake_done()) {
    // A non-blocking communicator meets its peers at its first collective outside a group (every
    // rank's first collective is the same call, so every rank forwards what comes before alike).
    if (group.open()) return forwarded(forward());
    pair->handshake();
    // An abort that ended the handshake came from another thread, which is tearing the real
    // communicator down: forwarding would hand it a communicator being freed.
    if (pair->aborted()) return aborted_call();
  }
  const Decision decision = pair->route(call, send, recv);
  if (decision.route == Route::kNccl) {
    log_route(call, Route::kNccl, decision.why);
    if (group.open()) forwarded_in_group().push_back({pair.get(), stream, false});
    return forwarded(forward());
  }
  if (group.open()) {
    deferred_calls().push_back({std::move(pair), call, send, recv, comm, stream});
    return ncclSuccess;
  }
  if (!pair->prepare(stream)) {
    // An abort that ended the making of the side came from another thread, which is tearing the
    // real communicator down: forwarding would hand it a communicator being freed.
    if (pair->aborted()) return aborted_call();
    log_route(call, Route::kNccl, kNoSymmemSide);
    return forwarded(forward());
  }
  log_route(call, Route::kSymmem, decision.why);
  return pair->launch(call, send, recv, stream);
}

void note_forwarded_in_group(ncclComm_t comm, cudaStream_t stream) noexcept {
  try {
    if (!this_thread_group().open()) return;
    if (std::shared_ptr<CommPair> pair = find_pair(comm)) forwarded_in_group().push_back({pair.get(), stream, false});
  } catch (...) {
    // (a failed note leaves the group as before the join existed: never worse than NCCL's error)
  }
}

ncclResult_t group_start() {
  const RealNccl& real = real_nccl();
  this_thread_group().start();
  return forwarded(real.ncclGroupStart());
}

ncclResult_t group_end() {
  const RealNccl& real = real_nccl();
  GroupQueue& group = this_thread_group();
  bool outermost = false;
  if (!group.end(&outermost) || !outermost) return forwarded(real.ncclGroupEnd());
  if (deferred_calls().empty() && !group.has_items()) {
    // Nothing served and nothing deferred: NCCL's group alone (the streams of its forwarded calls
    // join served calls only).
    forwarded_in_group().clear();
    return forwarded(real.ncclGroupEnd());
  }
  std::vector<DeferredCall> calls;
  calls.swap(deferred_calls());
  std::vector<GroupStreamUse> uses;
  uses.swap(forwarded_in_group());
  ncclResult_t first = ncclSuccess;

  // 1. The symmem sides these calls need (collective over each node: one thread per communicator
  //    when this thread drives several). One that is not made forwards its calls in step 2; guarded:
  //    a throw here (out of memory) would skip the real group's end below.
  (void)guarded([&] {
    std::vector<GroupItem> prepares;
    std::set<CommPair*> seen;
    for (const DeferredCall& c : calls) {
      if (!seen.insert(c.pair.get()).second || c.pair->has_symmem()) continue;
      std::shared_ptr<CommPair> pair = c.pair;
      cudaStream_t stream = c.stream;
      prepares.push_back({pair.get(), true, [pair, stream] {
                            pair->prepare(stream);
                            return ncclSuccess;
                          }});
    }
    run_per_communicator(prepares);
    return ncclSuccess;
  });
  // 2. What cannot be served joins the real group, still open, on this thread.
  for (DeferredCall& c : calls) {
    c.served = c.pair->has_symmem();
    if (!c.served && c.pair->aborted()) {
      keep_first_failure(&first, aborted_call());
      continue;
    }
    log_route(c.call, c.served ? Route::kSymmem : Route::kNccl, c.served ? "in a group" : kNoSymmemSide);
    // (guarded: a throw here would skip the real group's end below)
    if (!c.served)
      keep_first_failure(&first,
                         guarded([&] { return forwarded(forward_to_real(c.call, c.send, c.recv, c.comm, c.stream)); }));
  }
  // 3. The real group: forwarded calls launch, communicators made in it finish their init.
  const ncclResult_t real_end = forwarded(real.ncclGroupEnd());
  keep_first_failure(&first, real_end);
  // 4. Handshakes of communicators made in the group, window registrations.
  std::vector<GroupItem> items = group.take();
  keep_first_failure(&first, run_per_communicator(items));
  // 5. The served calls, in the order they were made; a communicator's calls on several streams
  //    join them first (group_streams.hpp). A non-blocking communicator's forwarded calls may
  //    still be on their way to their streams here (docs/nccl.md, limits).
  //    A join that fails (a stream the program destroyed, streams not all in one capture) fails the
  //    group, but the communicator's served calls still launch, in order on the leader (one
  //    communicator's calls must never run at once), so that no peer waits for a call this rank
  //    never made.
  for (const DeferredCall& c : calls) uses.push_back({c.pair.get(), c.stream, c.served});
  std::vector<StreamJoin> joins = plan_stream_joins(uses);
  auto join = [&](const StreamJoin& j, bool leader_waits) {
    try {
      detail::DeviceGuard guard(static_cast<const CommPair*>(j.comm)->device());  // (uses hold pairs)
      for (cudaStream_t other : j.others) {
        if (leader_waits)
          stream_waits_for(j.leader, other);
        else
          stream_waits_for(other, j.leader);
      }
      return true;
    } catch (const Error& e) {
      if (first == ncclSuccess || first == ncclInProgress)
        set_last_error(std::string("symmem NCCL shim: joining a group's streams: ") + e.what());
      keep_first_failure(&first, to_nccl_result(e.code()));
      return false;
    }
  };
  std::vector<bool> joined;
  for (const StreamJoin& j : joins) joined.push_back(join(j, true));
  for (DeferredCall& c : calls)
    if (c.served)
      keep_first_failure(&first, c.pair->launch(c.call, c.send, c.recv, served_stream(joins, c.pair.get(), c.stream)));
  for (size_t i = 0; i < joins.size(); ++i)
    if (joined[i]) join(joins[i], false);
  return first == ncclSuccess && real_end == ncclInProgress ? ncclInProgress : first;
}

ncclResult_t group_simulate_end(ncclSimInfo_t* info) {
  const RealNccl& real = real_nccl();
  if (!real.ncclGroupSimulateEnd) throw Error(ErrorCode::kUnsupported, real.path + " has no ncclGroupSimulateEnd");
  GroupQueue& group = this_thread_group();
  bool outermost = false;
  if (!group.end(&outermost) || !outermost) return forwarded(real.ncclGroupSimulateEnd(info));
  deferred_calls().clear();  // a simulated group launches nothing
  forwarded_in_group().clear();
  ncclResult_t first = forwarded(real.ncclGroupSimulateEnd(info));
  std::vector<GroupItem> items = group.take();
  keep_first_failure(&first, run_per_communicator(items));
  return first;
}

ncclResult_t window_register(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int flags) {
  const RealNccl& real = real_nccl();
  if (!real.ncclCommWindowRegister) throw Error(ErrorCode::kUnsupported, real.path + " has no ncclCommWindowRegister");
  const ncclResult_t result = real.ncclCommWindowRegister(comm, buff, size, win, flags);
  std::shared_ptr<CommPair> pair = find_pair(comm);
  // Only symmetric windows promise equal offsets on every rank, which zero copy needs.
  if (result != ncclSuccess || !pair || !win || !(flags & NCCL_WIN_COLL_SYMMETRIC)) return forwarded(result);
  // The real registration completes (and *win is set) at the group's end inside a group.
  GroupItem item{pair.get(), true, [pair, win, buff, size] {
                   if (!pair->handshake_done()) pair->handshake();
                   if (pair->aborted()) return aborted_call();  // (the real communicator is going)
                   // A non-blocking communicator fills *win only once its group's work is done:
                   // wait for it on every rank alike (not on the group end's result, which may
                   // differ by rank).
                   pair->wait_until_real_ready();
                   pair->register_window(*win, buff, size);
                   return ncclSuccess;
                 }};
  GroupQueue& group = this_thread_group();
  if (group.open()) {
    group.defer(std::move(item));
    return ncclSuccess;
  }
  return item.run();
}

ncclResult_t window_deregister(ncclComm_t comm, ncclWindow_t win) {
  const RealNccl& real = real_nccl();
  if (!real.ncclCommWindowDeregister)
    throw Error(ErrorCode::kUnsupported, real.path + " has no ncclCommWindowDeregister");
  if (std::shared_ptr<CommPair> pair = find_pair(comm)) pair->deregister_window(win);
  return forwarded(real.ncclCommWindowDeregister(comm, win));
}

ncclResult_t get_async_error(ncclComm_t comm, ncclResult_t* error) {
  const RealNccl& real = real_nccl();
  const ncclResult_t result = real.ncclCommGetAsyncError(comm, error);
  // The real NCCL failed last: ncclGetLastError must return its message, not an older one of ours.
  if (result == ncclSuccess && error && *error != ncclSuccess && *error != ncclInProgress) clear_last_error();
  if (result != ncclSuccess || !error || *error != ncclSuccess) return result;
  if (std::shared_ptr<CommPair> pair = find_pair(comm)) {
    const ncclResult_t mine = pair->async_error();
    if (mine != ncclSuccess) *error = mine;
  }
  return result;
}

const char* get_last_error(ncclComm_t comm) {
  if (comm) {
    if (std::shared_ptr<CommPair> pair = find_pair(comm))
      // A copy: another thread's ncclCommDestroy may free the pair once we return.
      if (const char* message = pair->failure_message()) return handed_out(message);
  }
  if (!last_error().empty()) return handed_out(last_error().c_str());
  if (const char* message = process_last_error()) return message;
  const RealNccl* real = RealNccl::get();
  return real ? real->ncclGetLastError(comm) : RealNccl::load_failure().c_str();
}

}  // namespace symmem::nccl
