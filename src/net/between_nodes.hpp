// Between nodes: the NCCL communicator among this rank's column (the ranks of equal local rank,
// one per node), the stream its steps run on, and the watchdog that turns a dead remote rank, a
// broken network or a stalled step into an error instead of a hang.
//
// CREATION is collective over the job: the column's first rank (node 0) makes the NCCL unique id,
// every rank publishes what it has through the job's bootstrap, and each takes its column's. The
// NCCL communicator is non-blocking, so its creation and every group end are polled against the
// communicator's deadline and never block forever.
//
// STEPS run on stream() (forked from the caller's stream by the hierarchical all-gather). Each is
// bracketed by stream writes into this rank's host board page: net_piece and net_signature, then
// net_wait_state = 1 before the NCCL calls, 2 after them (the copy-engine protocol of
// board/wait_word.hpp; the stream writes only 1 and 2, the watchdog only swaps 1 -> 3, 2 -> 0).
//
// WATCHDOG (one thread; host memory and NCCL's own thread-safe calls only). It fails the
// communicator, in this order, when
//   - NCCL reports an asynchronous error (ncclCommGetAsyncError: a remote rank died, the network
//     broke): kStatusNetwork with NCCL's text, naming the column's other rank when there are two
//     nodes (with more, NCCL's text names the peer's address);
//   - the abort word is set while a step is blocked (another local rank failed first): kStatusAborted;
//   - a step is still blocked past the deadline counted from when the stream reached it (a stalled
//     or never-arriving remote rank): kStatusTimeout.
// Failing records {code, op = kOpBetweenNodes, rank, peer (a job rank, or -1), phase = piece} in
// this rank's failure record, sets the abort word (so every local rank's waits release) and calls
// ncclCommAbort, which makes NCCL's kernels return, so the blocked stream and everything waiting on
// its events drain. The next call, check() or synchronize() raises the error on every local rank;
// the other nodes learn it from their own NCCL (the aborted connections) or their own deadline.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "board/host_board.hpp"
#include "plan/node_layout.hpp"
#include "common/polling_thread.hpp"
#include "plan/hierarchical_plan.hpp"
#include "symmem/bootstrap.hpp"

namespace symmem::detail {

class BetweenNodes {
 public:
  // Collective over the job's bootstrap; `board` is the node's host board (this rank's page and
  // the abort word), which must outlive this object.
  BetweenNodes(const NodeLayout& layout, Bootstrap& job, int device, int64_t timeout_ms, const HostBoard& board);
  ~BetweenNodes();  // stops the watchdog; aborts NCCL unless close() finalised it; never throws
  BetweenNodes(const BetweenNodes&) = delete;
  BetweenNodes& operator=(const BetweenNodes&) = delete;

  cudaStream_t stream() const { return stream_; }
  // Fork: stream() waits for everything enqueued on `caller` so far.
  void fork_from(cudaStream_t caller);
  // Join: `caller` waits for piece `index`'s step (0 <= index < kHierMaxPieces).
  void join_piece(int index, cudaStream_t caller);
  // After a failed step: `caller` waits for everything on stream() (what NCCL still had queued
  // writes the caller's output; a capture ends only once every fork is joined). Never throws.
  void join_all(cudaStream_t caller) noexcept;

  // One piece's network step on stream(): its sends of `in` and receives into `out`, then its
  // event. Throws (and fails the communicator) when NCCL refuses the calls.
  void exchange(const HierPiece& piece, int index, const void* in, void* out, uint32_t signature);
  // One NCCL all-gather over the column (one GPU per node: the column is the job, in slot order).
  void all_gather(const void* in, void* out, size_t bytes, uint32_t signature);

  // NCCL's text for the failure this watchdog recorded ("" if none).
  std::string failure_text() const;
  // Collective over the column: finalises and destroys the NCCL communicator (bounded by the
  // deadline; aborts it past that).
  void close();

 private:
  using Clock = PollingThread::Clock;

  template <typename Enqueue>
  void step(int index, uint32_t signature, Enqueue&& enqueue);
  void mark(uint32_t state, uint32_t piece, uint32_t signature);
  // Waits out ncclInProgress (bounded); throws after failing the communicator on an error.
  void settle(ncclResult_t result, const char* what);
  Clock::duration poll(Clock::time_point now) noexcept;
  void fail(uint32_t code, int peer, uint32_t piece, uint32_t signature, const std::string& text) noexcept;
  void abort_nccl() noexcept;  // with mutex_ held; never blocks (release_detached)
  void release_detached(ncclComm_t comm, bool abort) noexcept;
  void connect_eagerly();
  std::string column_ranks() const;

  NodeLayout layout_;
  int device_;
  Clock::duration timeout_;
  BoardPage* page_;
  uint32_t* abort_word_;
  BoardPage* device_page_;

  ncclComm_t comm_ = nullptr;
  bool nccl_aborted_ = false;
  std::atomic<bool> captured_{false};  // a step was captured into a CUDA graph (release_detached)
  cudaStream_t stream_ = nullptr;
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t pieces_[kHierMaxPieces] = {};

  mutable std::mutex mutex_;  // NCCL calls of the calling thread vs the watchdog's abort; failure_
  std::string failure_;
  // Watchdog state (its thread only).
  bool timing_ = false;
  Clock::time_point since_{};
  PollingThread watchdog_;  // last: stopped first, while what poll() reads still exists
};

}  // namespace symmem::detail
