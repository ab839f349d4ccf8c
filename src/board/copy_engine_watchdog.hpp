// The copy-engine watchdog: one thread per communicator that turns a copy-engine wait (a handshake
// or a piece signal, board/handshake.hpp) whose peer is dead, slow or in another call into an error
// instead of a hang. It works on the host board with CPU loads and stores alone and never makes a
// CUDA call: nothing it does can queue behind a blocked stream.
//
// WATCHDOG (one thread per communicator, host memory only), on ce_wait_state of this rank's page
// (wait_word.hpp). The GPU only ever stores 1 and 2; the watchdog only CASes 1 -> 3 and 2 -> 0 (__atomic builtins on
// the host page; a failed CAS means the GPU moved on, and the next poll sees where). Seeing 3 means
// the same wait is still blocked: 3 is written by the watchdog alone, only over a 1, and any
// progress of the stream overwrites it (2 after the wait, then 1 before the next one), so there is
// no ABA: a new wait always shows up as a 1, which restarts the clock. The deadline
// (settings.timeout_ms) therefore counts from when the GPU reached the wait (within one poll), for
// eager calls and graph replays alike, never from host enqueue: a long queue ahead of the call
// cannot raise a false timeout. The thread polls every 200 us while a wait is in progress (every
// 1 ms once it has lasted 10 ms), and every 5 ms otherwise, so graph replays are seen without any
// hook on the enqueue path; when no copy-engine call runs it costs 200 wake-ups a second, nothing
// measurable. A late first sight of a 1 can only lengthen a deadline, never shorten it.
//
// FAILURE BEHAVIOUR. While a wait is blocked (state 3) the watchdog decides, in this order:
//   - the communicator's abort word is set (any rank failed: an SM wait's deadline, another
//     watchdog) -> kStatusAborted unless this rank recorded something first; released at once.
//     This comes first: such a wait is a consequence, and a peer that an abort released may run
//     on and leave a later call's signature in a word, which must not be taken for a mismatch;
//   - a word holds another signature: the peer made a different call (its flag cannot change
//     while it waits for this rank) -> kStatusMismatch with peer_signature, at once, not after
//     the deadline;
//   - past the deadline, a word still 0 -> kStatusTimeout naming that peer (dead, stalled, or in a
//     different collective that never writes these flags). A wait past the deadline whose words
//     are all right is passing at that moment; it expires naming no peer only 1 s later.
// It records {code, op = copy engine, rank, peer, block = -1, phase, signature} in this rank's
// failure record (CAS on code from 0: the first failure wins), sets the abort word, then releases
// the wait by storing the awaited signature into this rank's own words. Every later wait of this
// rank is released as soon as the stream reaches it, so a queue of calls drains promptly, and the
// next call, check() or synchronize() raises the error on every rank.
//   Dead peer: this rank raises kTimeout naming it within the deadline plus the polling delay
// (at most kPollIdle + kPollBlocked); every other rank raises it too (abort word). The dead rank's memory stays mapped
// here, so the copies that run after the release read it harmlessly.
//   Slow peer (slower than the deadline): treated as dead. In the default pull direction the copies
// released after the expiry only read the slow peer and write this rank's own output, which the
// error declares undefined: nothing is ever written into another rank's memory after an expiry.
// With SYMMEM_CE_DIRECTION=push the released copies WRITE into the peers' outputs, possibly while a
// slow but live peer still uses that memory: push trades this safety for its bandwidth and is
// opt-in.
//   Different call: kMismatch on every rank, naming both calls (the board's call log); the rank
// whose watchdog looks second may record kStatusAborted instead, which names no cause of its own.
//   CUDA_DEVICE_MAX_CONNECTIONS=1 (every stream on one hardware queue) changes nothing: the
// release is a CPU store into host memory the blocked wait polls, not work queued on the GPU.
// A release racing with a wait that passes by itself at the deadline may leave a stale flag; the
// communicator is unusable by then, so it can only let a later (failing) wait pass early.
#pragma once

#include <chrono>
#include <cstdint>

#include "board/host_board.hpp"
#include "common/polling_thread.hpp"

namespace symmem::detail {

class CopyEngineWatchdog {
 public:
  // Starts the thread on `rank`'s page of `board`, which must outlive this object.
  CopyEngineWatchdog(const HostBoard& board, int rank, int world, int64_t timeout_ms);
  ~CopyEngineWatchdog();  // stops and joins the thread; never throws
  CopyEngineWatchdog(const CopyEngineWatchdog&) = delete;
  CopyEngineWatchdog& operator=(const CopyEngineWatchdog&) = delete;

 private:
  using Clock = PollingThread::Clock;

  // One look at the wait state; returns how long to sleep before the next.
  Clock::duration poll(Clock::time_point now) noexcept;
  void record(uint32_t code, int peer, uint32_t phase, uint32_t signature, uint32_t peer_signature) noexcept;
  void release_wait(uint32_t phase, uint32_t wait_peer, uint32_t piece, uint32_t signature) noexcept;

  const int rank_;
  const int world_;
  const Clock::duration timeout_;
  BoardPage* const page_;  // this rank's page, host address
  uint32_t* const abort_;  // the communicator's abort word, host address

  // Thread state (touched by the thread only).
  bool timing_ = false;              // a blocked wait is being timed (this thread wrote its 3)
  Clock::time_point since_{};        // when this thread first saw that wait
  Clock::time_point released_at_{};  // last release of that wait (0: none)
  Clock::time_point last_busy_{};    // last time a wait was seen while the abort word was set
  PollingThread thread_;             // last: stopped first, while what poll() reads still exists
};

}  // namespace symmem::detail
