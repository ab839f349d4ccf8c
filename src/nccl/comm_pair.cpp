#include "nccl/comm_pair.hpp"

#include <chrono>
#include <thread>

#include "comm/communicator_state.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "common/stream_capture.hpp"
#include "nccl/error_map.hpp"
#include "nccl/real_nccl.hpp"
#include "nccl/failure_words.hpp"
#include "nccl/served_calls.hpp"

namespace symmem::nccl {
namespace {

std::string rank_text(int rank) { return "rank " + std::to_string(rank); }

// Waits until the real communicator finished its (non-blocking) init. Throws on its failure, past
// the deadline, or once `aborted` (another thread is tearing the communicator down).
void wait_until_ready(ncclComm_t comm, int64_t timeout_ms, const std::atomic<bool>& aborted) {
  const RealNccl* real = RealNccl::get();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (aborted.load()) throw Error(ErrorCode::kAborted, "the NCCL communicator was aborted during its init");
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = real->ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress)
      throw Error(ErrorCode::kBootstrap, std::string("the NCCL communicator failed to initialise: ") +
                                             real->ncclGetErrorString(state));
    if (std::chrono::steady_clock::now() >= deadline)
      throw Error(ErrorCode::kTimeout, "the NCCL communicator was still initialising after " +
                                           std::to_string(timeout_ms) + " ms");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

CommPair::CommPair(ncclComm_t real, const RendezvousKey& key, const ShimSettings& settings,
                   const CutoverTable* table, std::unique_ptr<LocalRendezvous> rendezvous)
    : real_(real), key_(key), settings_(settings), table_(table), rendezvous_(std::move(rendezvous)) {}

CommPair::~CommPair() { release(); }

RendezvousKey CommPair::next_child_key(int64_t color) { return key_.child(children_++, color); }

void CommPair::wait_until_real_ready() const { wait_until_ready(real_, settings_.timeout_ms, aborted_); }

void CommPair::forward_only(Forwarding kind, const std::string& why) {
  servable_ = false;
  why_forwarding_ = why;
  if (bootstrap_) bootstrap_->close();  // never used again: every rank forwards alike
  set_bootstrap(nullptr);
  // A rank that leaves before joining stops listening: a host root that has not probed it yet
  // then counts it out (one that has waits for its hello until the deadline, and forwards).
  rendezvous_.reset();
  // Said per cause (no address in it): a program of many communicators hears a cause once.
  const std::string message = "NCCL shim: a communicator (" + rank_text(rank_) + " of " + std::to_string(world_) +
                              ") forwards every call to NCCL: " + why;
  if (kind == Forwarding::kFailure) return detail::warn_once(message);
  detail::log_warning(message);
}

void CommPair::handshake() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (handshake_done_.load()) return;
  // Marked done at once: whatever happens below, this rank never meets its peers again for it
  // (a failure leaves the pair forwarding, as on every rank).
  handshake_done_.store(true, std::memory_order_release);
  if (released_) return forward_only(Forwarding::kExpected, "finalized or destroyed before its first collective");
  try {
    wait_until_ready(real_, settings_.timeout_ms, aborted_);
    const RealNccl* real = RealNccl::get();
    if (real->ncclCommUserRank(real_, &rank_) != ncclSuccess || real->ncclCommCount(real_, &world_) != ncclSuccess ||
        real->ncclCommCuDevice(real_, &device_) != ncclSuccess)
      throw Error(ErrorCode::kBootstrap, "the NCCL communicator does not say its rank, size or device");
    if (!rendezvous_) return forward_only(Forwarding::kFailure, "this rank could not listen for its peers");
    Hello mine;
    mine.secret = key_.secret;
    mine.rank = rank_;
    mine.world = world_;
    mine.device = device_;
    mine.settings = settings_;
    std::vector<Hello> hellos;
    {
      // Stops listening when the last holder lets go (this block, or an abort_waits under way).
      std::shared_ptr<LocalRendezvous> rendezvous(std::move(rendezvous_));
      {
        std::lock_guard<std::mutex> lock(interrupt_mutex_);
        joining_ = rendezvous;
      }
      // abort_waits stores the flag before reading joining_ under interrupt_mutex_: either it
      // interrupts this join or the join sees the flag (LocalRendezvous::join checks it first).
      if (aborted_.load()) rendezvous->interrupt();
      struct StopJoining {
        CommPair* pair;
        ~StopJoining() {
          std::lock_guard<std::mutex> lock(pair->interrupt_mutex_);
          pair->joining_.reset();
        }
      } stop_joining{this};
      set_bootstrap(rendezvous->join(mine, settings_.timeout_ms, &hellos));
    }
    spans_nodes_ = static_cast<int>(hellos.size()) < world_;
    for (const Hello& h : hellos) {
      const std::string difference = describe_difference(h.settings, h.rank, settings_, rank_);
      if (!difference.empty()) return forward_only(Forwarding::kFailure, "the ranks' settings differ: " + difference);
    }
    if (settings_.shim_mode() == Mode::kOff) return forward_only(Forwarding::kExpected, "SYMMEM_NCCL=off");
    if (spans_nodes_)
      return forward_only(Forwarding::kExpected, std::to_string(hellos.size()) + " of its " + std::to_string(world_) +
                                                     " ranks share this host; across nodes the shim forwards");
    if (world_ < settings_.min_world()) return forward_only(Forwarding::kExpected, "a communicator of one rank");
    if (world_ > kMaxWorld)
      return forward_only(Forwarding::kExpected, std::to_string(world_) + " ranks exceed the " +
                                                     std::to_string(kMaxWorld) + " of one NVLink domain");
    servable_ = true;
  } catch (const std::exception& e) {
    if (bootstrap_) bootstrap_->close();
    set_bootstrap(nullptr);
    return forward_only(failure_unless_aborted(), std::string("the handshake failed: ") + e.what());
  }
  if (settings_.eager) create_symmem();
}

Decision CommPair::route(NcclCall& call, const void* send, const void* recv) const {
  std::lock_guard<std::mutex> lock(mutex_);
  call.world = world_;
  call.spans_nodes = spans_nodes_;
  call.buffers = !windows_.empty() && windows_.find(send, send_bytes(call)) && windows_.find(recv, recv_bytes(call))
                     ? BufferKind::kWindow
                     : BufferKind::kStaged;
  if (!servable_ || creation_failed_) return {Route::kNccl, "this communicator forwards everything"};
  ServeRules rules;
  rules.mode = settings_.shim_mode();
  rules.workspace_bytes = settings_.workspace_bytes;
  rules.table = table_;
  rules.min_world = settings_.min_world();
  return decide(call, rules);
}

void CommPair::create_symmem() {
  // Released (finalized, destroyed), or a handshake that made no bootstrap: never made.
  if (released_ || !bootstrap_) {
    creation_failed_ = true;
    return;
  }
  if (aborted_.load()) {
    // abort_waits stored the flag before reading bootstrap_ under interrupt_mutex_, which
    // set_bootstrap also takes: either it interrupted this bootstrap or this sees the flag. Closing
    // the bootstrap fails the peers' next exchange at once, so every rank forwards.
    bootstrap_->close();
    creation_failed_ = true;
    return forward_only(Forwarding::kExpected, "aborted before its symmem side was made");
  }
  std::unique_ptr<Communicator> made;
  try {
    CommConfig config;
    config.timeout_ms = settings_.timeout_ms;
    config.workspace_bytes = settings_.workspace_bytes;
    config.node_size = world_;  // the handshake found every rank on this host
    made = Communicator::create(bootstrap_, device_, config);
  } catch (const std::exception& e) {
    // Close this rank's end: a peer still inside a collective step of the creation fails at once
    // instead of at its deadline, and every rank ends up here.
    bootstrap_->close();
    creation_failed_ = true;
    return forward_only(failure_unless_aborted(), std::string("making its symmem communicator failed: ") + e.what());
  }
  // Every rank made it if every rank reaches this exchange; a rank that failed closed its end.
  try {
    const uint8_t made_here = 1;
    std::vector<uint8_t> everywhere(world_);
    bootstrap_->all_gather(&made_here, everywhere.data(), 1);
  } catch (const std::exception& e) {
    made.reset();
    bootstrap_->close();
    creation_failed_ = true;
    return forward_only(failure_unless_aborted(),
                        std::string("another rank failed to make its symmem communicator: ") + e.what());
  }
  symmem_ = std::move(made);
  uint32_t* word = abort_word_of(*symmem_);
  abort_word_.store(word);
  // An abort that came while the side was being made found no word to set: set it now (with
  // abort_waits' order of the two stores, one of them sees the other's).
  if (aborted_.load() && word) __atomic_store_n(word, 1u, __ATOMIC_RELEASE);
}

bool CommPair::prepare(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (symmem_) return true;
  if (creation_failed_ || released_ || !servable_ || aborted_.load()) return false;
  // The ranks capture alike: every rank forwards this call and makes the side at its next eager one.
  if (detail::stream_is_capturing(stream)) return false;
  create_symmem();
  return symmem_ != nullptr;
}

ncclResult_t CommPair::launch(const NcclCall& call, const void* send, void* recv, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (const int code = failure_code_.load(std::memory_order_acquire); code != ncclSuccess) {
    set_last_error(failure_message_);
    return static_cast<ncclResult_t>(code);
  }
  if (!symmem_) throw Error(ErrorCode::kInternal, "the NCCL shim launched a call on an unprepared communicator");
  try {
    // The communicator's device (one thread may drive several GPUs' communicators in a group): the
    // average's scaling kernel launches on the current one.
    detail::DeviceGuard guard(device_);
    run_served_call(*symmem_, call, send, recv, stream, windows_);
    return ncclSuccess;
  } catch (const Error& e) {
    const ncclResult_t code = to_nccl_result(e.code());
    set_last_error(e.what());
    // Bad arguments launch nothing and leave the communicator usable; anything else broke the
    // sequence of calls the ranks share.
    if (e.code() != ErrorCode::kInvalidArgument) fail(code, e.what());
    return code;
  }
}

void CommPair::register_window(ncclWindow_t window, void* ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  Window w;
  w.handle = window;
  w.begin = static_cast<const char*>(ptr);
  w.bytes = bytes;
  if (servable_ && !creation_failed_ && !released_ && failure_code_.load() == ncclSuccess) {
    if (!symmem_) create_symmem();
    if (symmem_) {
      try {
        w.buffer = symmem_->import(ptr, bytes);
      } catch (const Error& e) {
        // Every rank failed alike (the import agrees on its outcome): staged on every rank.
        detail::log_warning(std::string("NCCL shim: a window is staged, not mapped: ") + e.what());
        if (e.code() != ErrorCode::kUnsupported && e.code() != ErrorCode::kInvalidArgument &&
            e.code() != ErrorCode::kCudaError)
          fail(to_nccl_result(e.code()), e.what());
      }
    }
  }
  windows_.add(w);
}

void CommPair::deregister_window(ncclWindow_t window) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::optional<Window> w = windows_.remove(window);
  if (!w || !w->buffer || !symmem_) return;
  try {
    symmem_->release_import(w->buffer);
  } catch (const std::exception& e) {
    detail::log_warning(std::string("NCCL shim: releasing a window: ") + e.what());
  }
}

void CommPair::fail(ncclResult_t code, const std::string& message) {
  if (failure_code_.load(std::memory_order_acquire) != ncclSuccess) return;
  failure_message_ = message;
  failure_code_.store(code, std::memory_order_release);
  // The process's (not this thread's, which may be PyTorch's watchdog: its own slot would then
  // hide a later failure of the real NCCL): the watchdog asks ncclGetLastError(NULL).
  set_process_last_error(message);
}

ncclResult_t CommPair::async_error() {
  if (const int code = failure_code_.load(std::memory_order_acquire); code != ncclSuccess) {
    // Again (a real NCCL's failure of another communicator may have cleared it meanwhile): the
    // watchdog asks ncclGetLastError(NULL) about the error it is given now.
    set_process_last_error(failure_message_);
    return static_cast<ncclResult_t>(code);
  }
  // The device's failure words, read without waiting for the lock (the watchdog thread must never
  // wait: a program's call holding it reports the failure itself).
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || !symmem_ || !failure_to_report(*symmem_)) return ncclSuccess;
  // Nor long for the records of the ranks the failure names (a check gives them up to
  // kFailureRecordsSettle): a live rank writes its own within milliseconds, a dead one never. This
  // poll reports: PyTorch polls a call only until it completes, and a call that timed out completes.
  bool provisional = false;
  try {
    throw_failure(*symmem_, kWatchdogSettle, &provisional);
  } catch (const Error& e) {
    // A wait this rank's own abort or revoke ended: NCCL reports no asynchronous error for it. (A
    // failure recorded before, a peer's timeout say, is still reported.)
    if (aborted_.load() && e.code() == ErrorCode::kAborted) return ncclSuccess;
    if (provisional) {
      // Reported, not kept: the program's next call, or the next poll, judges with every record.
      set_process_last_error(e.what());
      return to_nccl_result(e.code());
    }
    fail(to_nccl_result(e.code()), e.what());
    return static_cast<ncclResult_t>(failure_code_.load());
  }
  return ncclSuccess;
}

const char* CommPair::failure_message() const {
  return failure_code_.load(std::memory_order_acquire) != ncclSuccess ? failure_message_.c_str() : nullptr;
}

void CommPair::abort_waits() noexcept {
  // Without `mutex_`: the caller may be PyTorch's watchdog while the program's thread holds it,
  // waiting in a served call, in the handshake or in the making of the symmem side. The device's
  // waits end through the abort word; the host's, in the rendezvous and the side's bootstrap
  // exchanges, through their interrupt().
  aborted_.store(true);
  abort_stores_.fetch_add(1);
  if (uint32_t* word = abort_word_.load()) __atomic_store_n(word, 1u, __ATOMIC_RELEASE);
  abort_stores_.fetch_sub(1);
  std::shared_ptr<LocalBootstrap> bootstrap;
  std::shared_ptr<LocalRendezvous> joining;
  {
    std::lock_guard<std::mutex> lock(interrupt_mutex_);
    bootstrap = bootstrap_;
    joining = joining_;
  }
  if (joining) joining->interrupt();
  if (bootstrap) bootstrap->interrupt();
}

void CommPair::release() noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  released_ = true;  // never made again (its bootstrap is closed below): later calls forward
  windows_.clear();
  // Before the unmap: an abort_waits from now on stores nothing, and one under way has finished.
  abort_word_.store(nullptr);
  while (abort_stores_.load() != 0) std::this_thread::yield();
  symmem_.reset();  // local release: synchronises this device, unmaps, closes descriptors
  if (bootstrap_) bootstrap_->close();
  set_bootstrap(nullptr);
  rendezvous_.reset();
}

void CommPair::set_bootstrap(std::shared_ptr<LocalBootstrap> bootstrap) {
  std::lock_guard<std::mutex> lock(interrupt_mutex_);
  bootstrap_ = std::move(bootstrap);
}

}  // namespace symmem::nccl
