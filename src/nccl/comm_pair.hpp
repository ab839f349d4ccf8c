// An NCCL communicator as the shim holds it: the real one, and beside it, when all its ranks share
// one node, a symmem communicator bootstrapped through it (no port, store or variable).
//
// LIFE
//   made       right after the real init (or split, shrink) returned; its rendezvous listened since
//              before that call (local_rendezvous.hpp).
//   handshake  once the real communicator is ready: at once after a blocking init, at the outermost
//              ncclGroupEnd for one made inside a group, at the first collective for a non-blocking
//              one. The host's ranks meet and compare settings. The pair serves only when every rank
//              of the communicator is on this host with the same settings; otherwise it forwards
//              everything. Every rank sees the same hellos, so every rank decides alike.
//   symmem     made at the first call routed to it (SYMMEM_NCCL_INIT=lazy, the default), at a window
//              registration, or at the handshake (eager). Collective over the node's ranks, never
//              inside a CUDA graph capture (such a call is forwarded: the ranks of a program capture
//              alike). A failure is agreed: every rank then forwards everything.
//   broken     a failure the device found (a rank timed out or called something else), or a
//              bootstrap step that failed: calls routed to symmem return NCCL's code for it with
//              symmem's message, and ncclCommGetAsyncError reports it (PyTorch's watchdog aborts).
//              A peer's clean abort breaks this rank only where it had a call in flight (whose
//              waits then fail); a rank with nothing in flight reports no error (as NCCL), and its
//              next served call fails at once (it needs that peer). A cause some rank recorded (a
//              timeout, a mismatch) is reported everywhere. PyTorch aborts its communicators at
//              exit when a program did not destroy its process groups: that must not fail the
//              ranks still running.
//   released   ncclCommDestroy / ncclCommFinalize release the symmem side locally (the peers' own
//              mappings keep alive what they still use). ncclCommAbort and ncclCommRevoke first set
//              the abort word, which releases every wait of every rank of the node at once; the
//              aborted side is kept (not synchronised, which could wait on other communicators'
//              hung work) until the next ncclCommDestroy releases it. An abort while the side is
//              being made ends its exchanges over the host's star at once (LocalBootstrap::
//              interrupt; its descriptor exchange still runs to its deadline), and no side is made
//              after it.
//
// MEMORY (per rank, for a communicator whose symmem side exists; none before): the workspace
// budget (SYMMEM_NCCL_WORKSPACE_MB, 64 MiB by default: four staging areas of 16 MiB), the
// low-latency area (32 MiB), the control area (2 MiB), one host page per rank, and the registered
// windows' mappings of the peers' memory (no copy). The heap reserves virtual address space only.
//
// Threads: a communicator is used by one thread at a time (NCCL's rule); PyTorch's watchdog polls
// ncclCommGetAsyncError from another, which never blocks on `mutex_` (try_lock) and reads the
// failure words atomically.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "nccl/local_rendezvous.hpp"
#include "nccl/serve_plan.hpp"
#include "nccl/shim_settings.hpp"
#include "nccl/windows.hpp"
#include "symmem/communicator.hpp"

namespace symmem::nccl {

// How long async_error waits for the abort word, then for the records of the ranks a failure
// names (the program's own calls wait up to CommunicatorState's kFailureRecordsSettle): a live rank
// writes its record within milliseconds of its failure; a verdict reached while one is still
// missing is provisional.
inline constexpr std::chrono::milliseconds kWatchdogSettle{10};

class CommPair {
 public:
  // `rendezvous` listened before the real init that made `real` (nullptr: it could not; the pair
  // then forwards); `table` is the cutover table the settings' hash names.
  CommPair(ncclComm_t real, const RendezvousKey& key, const ShimSettings& settings, const CutoverTable* table,
           std::unique_ptr<LocalRendezvous> rendezvous);
  ~CommPair();  // local release; never throws
  CommPair(const CommPair&) = delete;
  CommPair& operator=(const CommPair&) = delete;

  ncclComm_t real() const { return real_; }
  const RendezvousKey& key() const { return key_; }
  const ShimSettings& settings() const { return settings_; }
  // The key of the next child this communicator makes (every rank of it counts alike).
  RendezvousKey next_child_key(int64_t color);

  bool handshake_done() const { return handshake_done_.load(std::memory_order_acquire); }
  // Waits until the real communicator finished what it was given (a non-blocking init, or a
  // group's window registrations, fill their handles only then). Throws past the deadline.
  void wait_until_real_ready() const;
  // Collective over the host's ranks, once the real communicator is ready (waits for a
  // non-blocking init to finish). Idempotent. Never throws: a failure leaves the pair forwarding.
  void handshake();

  // Where `call` goes; fills in its world, node span and buffer kind (windows registered on this
  // communicator holding both operands: zero copy). Only after the handshake.
  Decision route(NcclCall& call, const void* send, const void* recv) const;

  // Makes the symmem side when it is missing and can be made now: not after a failed attempt, not
  // under capture on `stream` (making it allocates and synchronises). Collective over the node's
  // ranks when it makes it. True when the side exists; otherwise calls routed to symmem are
  // forwarded (every rank alike: the ranks capture alike and agree on a failure).
  bool prepare(cudaStream_t stream);
  bool has_symmem() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return symmem_ != nullptr;
  }
  // ncclCommAbort, ncclCommRevoke or an aborting shrink reached this communicator: the real one is
  // being torn down (maybe by another thread, PyTorch's watchdog), so a call routed to symmem whose
  // side the abort kept from being made is not forwarded to it either.
  bool aborted() const { return aborted_.load(); }
  int device() const { return device_; }
  // Runs a call routed to symmem on the prepared side. Returns NCCL's result.
  ncclResult_t launch(const NcclCall& call, const void* send, void* recv, cudaStream_t stream);

  // Collective (ncclCommWindowRegister): makes [ptr, ptr + bytes) symmetric for symmem under
  // `window`. Never fails the registration: where it cannot, calls on the window are staged (every
  // rank alike). Deregistration is local.
  void register_window(ncclWindow_t window, void* ptr, size_t bytes);
  void deregister_window(ncclWindow_t window) noexcept;

  // A failure the device or a bootstrap step found; ncclSuccess when none. Thread-safe. It waits
  // for no lock and at most kWatchdogSettle twice for the failing ranks' records: PyTorch's watchdog
  // polls it holding the lock its program's next call needs, once per call still in flight, so the
  // first poll that sees a failure must report it (provisionally, if a record is still missing).
  ncclResult_t async_error();
  // Its message (symmem's, naming the rank and the cause), stable for the pair's life; nullptr
  // when none. Thread-safe.
  const char* failure_message() const;

  // Releases every wait of every rank of the node (the abort word) and this rank's bootstrap
  // exchanges under way (making the side), without waiting for anything; the side is never made
  // afterwards. From any thread.
  void abort_waits() noexcept;
  // Local release of the symmem side (synchronises this device first).
  void release() noexcept;

 private:
  void create_symmem();
  void fail(ncclResult_t code, const std::string& message);
  // Why a pair forwards everything: a choice or a limit (SYMMEM_NCCL=off, one rank, several
  // nodes, too many ranks, an abort) stays in the debug log; a failure (a peer that never came,
  // settings that differ, a creation that failed) is said once: the program asked for symmem.
  enum class Forwarding { kExpected, kFailure };
  void forward_only(Forwarding kind, const std::string& why);
  // A step that threw: a failure, unless an abort interrupted it.
  Forwarding failure_unless_aborted() const {
    return aborted_.load() ? Forwarding::kExpected : Forwarding::kFailure;
  }
  void set_bootstrap(std::shared_ptr<LocalBootstrap> bootstrap);  // with abort_waits' copy

  const ncclComm_t real_;
  RendezvousKey key_;
  ShimSettings settings_;
  const CutoverTable* table_;
  std::unique_ptr<LocalRendezvous> rendezvous_;
  int rank_ = 0;
  int world_ = 1;
  int device_ = 0;
  uint64_t children_ = 0;

  std::atomic<bool> handshake_done_{false};
  bool servable_ = false;  // one node, agreed settings, mode not off
  bool spans_nodes_ = false;
  std::string why_forwarding_;  // for SYMMEM_DEBUG
  std::shared_ptr<LocalBootstrap> bootstrap_;  // written under both mutexes (set_bootstrap)
  std::shared_ptr<LocalRendezvous> joining_;    // while handshake() joins: abort_waits interrupts it
  std::mutex interrupt_mutex_;  // abort_waits' read of bootstrap_, joining_; never held long
  std::atomic<bool> aborted_{false};
  std::unique_ptr<Communicator> symmem_;
  bool creation_failed_ = false;
  bool released_ = false;  // release() ran (finalize, destroy): the side is never made again
  Windows windows_;

  mutable std::mutex mutex_;  // the symmem side: calls, registration, check()
  // The symmem side's abort word while it exists. abort_waits stores through it without a lock (a
  // signal handler may abort), counted in abort_stores_: release() clears it, then waits for the
  // stores in flight before it unmaps the side (both sequentially consistent: either a store sees
  // the cleared word, or release() sees the store's count).
  std::atomic<uint32_t*> abort_word_{nullptr};
  std::atomic<int> abort_stores_{0};
  std::atomic<int> failure_code_{ncclSuccess};
  std::string failure_message_;  // written once, before failure_code_
};

}  // namespace symmem::nccl
