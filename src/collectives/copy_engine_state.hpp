// State of the copy-engine all-gather: the side streams its copies run on, the events that fork
// and join them, and the watchdog that turns a dead, slow or mismatched peer into an error. The
// handshake flags live in the host board (comm/host_board.hpp), so the watchdog works with CPU
// loads and stores alone and never makes a CUDA call: nothing it does can queue behind a blocked
// stream.
//
// HANDSHAKE. One cuStreamBatchMemOp per handshake (stream memory operations: no kernel, no SM).
// S is the call's signature (nonzero); page(r) is rank r's board page, which the GPUs address
// through its device mapping. Every write is the default one, preceded by a system-scope fence
// (the v2 API the driver gives us has no unfenced write), so each write is visible only after
// everything this stream wrote before it.
//   ready: write S into page(p).ce_ready[me] for every peer p         (my input is visible first)
//          write ce_signature = S, then ce_wait_state = 1 | which wait (phase 0) into page(me)
//                                                                     (a watchdog that reads the 1
//                                                                      reads this wait's phase and S)
//          wait until page(me).ce_ready[p] == S for every peer p
//          write ce_wait_state = 2, then page(me).ce_ready[p] = 0 for every peer p
//          -> every peer's input holds this call's data (pull); every peer's output may be written (push)
//   copies: pull (default): read every peer's input, write this rank's own output only. push
//          (SYMMEM_CE_DIRECTION=push, symmetric outputs only): write this rank's input into every
//          peer's output. One cudaMemcpyBatchAsync on the caller's stream outside capture (on
//          side stream 0 when the caller's is a default stream, which the batch API refuses), one
//          cudaMemcpyAsync per piece under capture (the first stream's share on the caller's
//          stream, the others on side streams); the own slot is copied on own_stream() beside
//          them (never inside the batch: it delayed the NVLink copies).
//   done:  the same with ce_done and phase 1, after the copies joined (the fence of the first
//          done write makes the copies' writes visible before it)
//          -> every peer finished reading my input (pull); my output holds every slot (push)
//
// PIECES (matmul_reduce_scatter, between a ready and a done handshake). Peer p's stream writes S
// into page(me).ce_piece[p][j] once piece j of what it made for me may be read; my stream writes
// S, then ce_wait_state = 1 | (phase 2, peer p, piece j), waits until that
// one word is S, writes ce_wait_state = 2 and resets the word. The watchdog times and releases it
// as a handshake wait (the same words of this rank's page: a failed or released piece wait reads
// a dead peer's memory into this rank's own, never writes a peer). Only one stream of a rank
// waits at a time (side stream 0), as ce_wait_state requires. A peer writes piece j's word of
// the next call only after passing that call's ready handshake, which needs my ready write of
// that call, which my stream issues after this call's piece resets: no signal is lost or misread.
//
// WHY FLAGS ARE NEVER LOST OR MISREAD. Peer p writes its next call's ready into my page only after
// passing this call's done wait, which needs my done write, which my stream issues after
// resetting my ready words (and the fence before that done write orders the resets before it).
// Likewise p's next done write follows its next ready wait, which needs my next ready write,
// which follows my done reset. So when my stream starts a wait, each word it waits on holds 0 (the
// peer has not arrived yet) or exactly what the peer wrote for its matching call: S when it made
// the same call, another signature when it made a different one. The argument is about order, not
// values, so carrying S instead of a constant 1 changes nothing in it; it adds the mismatch check,
// and since S is fixed per call site the flags stay right across CUDA graph replays.
//
// WATCHDOG (one thread per communicator, host memory only). ce_wait_state of this rank's page:
//   0 idle          1 the stream reached a wait     2 the stream passed it
//   3 the watchdog saw that 1 and started the clock (its CAS 1 -> 3)
// (These are the low byte; a 1 carries which wait in the upper bytes, and the 3 keeps them.)
// The GPU only ever stores 1 and 2; the watchdog only CASes 1 -> 3 and 2 -> 0 (__atomic builtins on
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

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "comm/host_board.hpp"
#include "common/polling_thread.hpp"

namespace symmem::detail {

struct CommunicatorState;

class CopyEngineState {
 public:
  static constexpr int kMaxStreams = 16;

  // Wait states of BoardPage::ce_wait_state (see above).
  static constexpr uint32_t kWaitIdle = 0;
  static constexpr uint32_t kWaitEntered = 1;  // written by the stream before a handshake wait
  static constexpr uint32_t kWaitPassed = 2;   // written by the stream after it
  static constexpr uint32_t kWaitWatched = 3;  // written by the watchdog over a 1
  // ce_wait_state: the state in the low byte, which wait in the others (host_board.hpp).
  static constexpr uint32_t kStateMask = 0xFFu;
  static constexpr uint32_t kEveryPeerCode = 0xFFu;
  static constexpr uint32_t wait_word(uint32_t state, uint32_t phase, uint32_t wait_peer, uint32_t piece) {
    const uint32_t peer = wait_peer == BoardPage::kEveryPeer ? kEveryPeerCode : (wait_peer & 0xFFu);
    return (state & kStateMask) | (phase & 0xFFu) << 8 | peer << 16 | (piece & 0xFFu) << 24;
  }
  static_assert(kMaxWorld < kEveryPeerCode && BoardPage::kPieceSignals <= 256, "wait_word packs peer and piece in a byte");
  static constexpr uint32_t state_of(uint32_t word) { return word & kStateMask; }
  // The watchdog's acknowledgement of an entered wait: the same wait, state 3.
  static constexpr uint32_t watched_of(uint32_t word) { return (word & ~kStateMask) | kWaitWatched; }
  static constexpr uint32_t phase_of(uint32_t word) { return (word >> 8) & 0xFFu; }
  static constexpr uint32_t wait_peer_of(uint32_t word) {
    const uint32_t peer = (word >> 16) & 0xFFu;
    return peer == kEveryPeerCode ? BoardPage::kEveryPeer : peer;
  }
  static constexpr uint32_t piece_of(uint32_t word) { return word >> 24; }
  // The phase of a wait (wait_word)
  static constexpr uint32_t kPhaseReady = 0;
  static constexpr uint32_t kPhaseDone = 1;
  static constexpr uint32_t kPhasePiece = 2;  // one peer's signal of one piece (see PIECES above)

  // Needs state.board; the communicator constructs this after the board and destroys it before.
  // Creates the side streams and events on state.device and starts the watchdog.
  explicit CopyEngineState(CommunicatorState& state);
  ~CopyEngineState();  // stops and joins the watchdog, destroys streams and events; never throws
  CopyEngineState(const CopyEngineState&) = delete;
  CopyEngineState& operator=(const CopyEngineState&) = delete;

  int streams() const { return streams_count_; }
  size_t piece_bytes() const { return piece_bytes_; }
  bool batch() const { return batch_; }
  cudaStream_t side_stream(int i) const { return streams_[i]; }
  cudaEvent_t fork_event() const { return fork_; }
  cudaEvent_t join_event(int i) const { return joins_[i]; }
  // The own slot's local copy (a kernel): a stream of default priority, so that it does not
  // take SMs ahead of the caller's kernels as the highest-priority side streams would.
  cudaStream_t own_stream() const { return own_stream_; }
  cudaEvent_t own_join_event() const { return own_join_; }

 private:
  using Clock = PollingThread::Clock;

  // One look at the wait state; returns how long to sleep before the next.
  Clock::duration poll(Clock::time_point now) noexcept;
  void record(uint32_t code, int peer, uint32_t phase, uint32_t signature, uint32_t peer_signature) noexcept;
  void release_wait(uint32_t phase, uint32_t wait_peer, uint32_t piece, uint32_t signature) noexcept;
  void destroy_cuda_objects() noexcept;

  const HostBoard& board_;
  const int rank_;
  const int world_;
  const Clock::duration timeout_;
  BoardPage* const page_;  // this rank's page, host address
  uint32_t* const abort_;  // the communicator's abort word, host address

  int streams_count_ = 4;
  size_t piece_bytes_ = 0;
  bool batch_ = true;
  cudaStream_t streams_[kMaxStreams] = {};
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t joins_[kMaxStreams] = {};
  cudaStream_t own_stream_ = nullptr;
  cudaEvent_t own_join_ = nullptr;

  // Watchdog thread state (touched by that thread only).
  bool timing_ = false;              // a blocked wait is being timed (this thread wrote its 3)
  Clock::time_point since_{};        // when this thread first saw that wait
  Clock::time_point released_at_{};  // last release of that wait (0: none)
  Clock::time_point last_busy_{};    // last time a wait was seen while the abort word was set
  PollingThread watchdog_;           // last: stopped first, while what poll() reads still exists
};

}  // namespace symmem::detail
