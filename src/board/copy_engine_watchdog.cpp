#include "board/copy_engine_watchdog.hpp"

#include <algorithm>

#include "board/wait_word.hpp"

namespace symmem::detail {
namespace {

using namespace std::chrono_literals;

// Watchdog polling (copy_engine_watchdog.hpp). A late first look at a wait only lengthens its
// deadline; these bound how much, and how quickly a queue of waits drains after an abort.
constexpr auto kPollBlocked = 200us;    // a wait is in progress
constexpr auto kPollBlockedLong = 1ms;  // ... and has lasted kBlockedLong: a skewed or dead peer
constexpr auto kBlockedLong = 10ms;
constexpr auto kPollIdle = 5ms;       // no wait in progress (graph replays are seen at this rate)
constexpr auto kAbortLinger = 100ms;  // after an abort, keep polling fast while waits keep coming
constexpr auto kReleaseRetry = 1ms;   // a released wait still blocked: store the values again
// Past the deadline with every awaited word right, the wait is passing at this moment; expire it
// anyway (naming no peer) if it is still blocked this much later.
constexpr auto kNoCulpritGrace = 1s;

}  // namespace

CopyEngineWatchdog::CopyEngineWatchdog(const HostBoard& board, int rank, int world, int64_t timeout_ms)
    : rank_(rank),
      world_(world),
      timeout_(std::chrono::milliseconds(std::max<int64_t>(1, timeout_ms))),
      page_(board.page(rank)),
      abort_(board.abort_word()) {
  thread_.start([this](Clock::time_point now) { return poll(now); });
}

CopyEngineWatchdog::~CopyEngineWatchdog() { thread_.stop(); }

CopyEngineWatchdog::Clock::duration CopyEngineWatchdog::poll(Clock::time_point now) noexcept {
  uint32_t* state = &page_->ce_wait_state;
  // Any rank's failure (the abort word), or this rank's own (an SM wait may have recorded one).
  const bool aborted = load_word(abort_) != 0 || load_word(&page_->status.code) != kStatusOk;
  uint32_t seen = load_word(state);
  if (WaitWord::state_of(seen) == WaitWord::kEntered) {
    const uint32_t watched = WaitWord::watched_of(seen);
    if (swap_word(state, seen, watched)) {
      // The stream reached a wait since the last look: the clock starts now.
      timing_ = true;
      since_ = now;
      released_at_ = {};
      seen = watched;
    } else {
      return kPollBlocked;  // the stream moved on meanwhile; see where next time
    }
  }
  if (WaitWord::state_of(seen) != WaitWord::kWatched) {
    // 2: acknowledge, so that the next wait shows up as a change. A failed swap means the stream
    // already wrote the next wait's 1, which the next look handles. 0 (or anything else): idle.
    if (seen == WaitWord::kPassed) swap_word(state, WaitWord::kPassed, WaitWord::kIdle);
    timing_ = false;
    if (seen == WaitWord::kPassed && aborted) last_busy_ = now;
    const bool draining = aborted && last_busy_ != Clock::time_point{} && now - last_busy_ < kAbortLinger;
    return draining ? Clock::duration(kPollBlocked) : Clock::duration(kPollIdle);
  }

  // 3: the wait this thread timed is still blocked (only this thread writes 3, and any progress of
  // the stream overwrites it).
  if (!timing_) {  // cannot happen (this thread wrote the 3); start the clock rather than trust it
    timing_ = true;
    since_ = now;
    released_at_ = {};
  }
  if (aborted) last_busy_ = now;
  const uint32_t phase = WaitWord::phase_of(seen);
  const uint32_t signature = load_word(&page_->ce_signature);
  const uint32_t wait_peer = WaitWord::wait_peer_of(seen);
  const uint32_t piece = std::min<uint32_t>(WaitWord::piece_of(seen), BoardPage::kPieceSignals - 1);
  int missing = -1, foreign = -1;
  uint32_t foreign_signature = 0;
  for_each_awaited_peer(rank_, world_, wait_peer, [&](int p) {
    const uint32_t w = load_word(awaited_word(page_, phase, piece, p));
    if (w == 0) {
      if (missing < 0) missing = p;
    } else if (w != signature && foreign < 0) {
      foreign = p;
      foreign_signature = w;
    }
  });

  // The reads above are separate loads: had the stream passed this wait meanwhile (it overwrites
  // the 3), the words may already hold the next call's signatures. Decide only on a still-blocked
  // wait (the same 3 now means none of the stream's stores came in between).
  if (load_word(state) != seen) return kPollBlocked;
  const Clock::duration blocked = now - since_;
  bool release = false;
  if (released_at_ != Clock::time_point{}) {
    // Released already, and the stream has not shown it passed yet: repeat the (idempotent) stores
    // now and then. A peer that an abort released runs on through its queue and may overwrite a
    // word of this rank's with its next call's signature before this stream read the release.
    release = now - released_at_ >= kReleaseRetry;
  } else if (aborted) {
    // Another failure came first: this wait is a consequence, not a cause (a peer that an abort
    // released may even have left a later call's signature in a word: no mismatch is claimed).
    // It names the first peer whose word had not come (a word is reset to 0 after each wait), so
    // that whoever waited for this rank can follow the wait on (board/wait_chain.hpp).
    record(kStatusAborted, missing, phase, signature, 0);
    release = true;
  } else if (foreign >= 0) {
    // The peer's flag carries another call's signature, and it cannot change while that peer
    // waits for this rank: a mismatch, known now rather than at the deadline.
    record(kStatusMismatch, foreign, phase, signature, foreign_signature);
    release = true;
  } else if (blocked > timeout_ && (missing >= 0 || blocked > timeout_ + kNoCulpritGrace)) {
    record(kStatusTimeout, missing, phase, signature, 0);
    release = true;
  }
  if (release) {
    release_wait(phase, wait_peer, piece, signature);
    released_at_ = now;
  }
  if (aborted || release) return kPollBlocked;
  return blocked < kBlockedLong ? Clock::duration(kPollBlocked) : Clock::duration(kPollBlockedLong);
}

void CopyEngineWatchdog::record(uint32_t code, int peer, uint32_t phase, uint32_t signature,
                                uint32_t peer_signature) noexcept {
  record_failure(page_, abort_,
                 {code, kOpCopyEngine, rank_, peer, -1, static_cast<int32_t>(phase), signature, peer_signature},
                 nullptr);
}

void CopyEngineWatchdog::release_wait(uint32_t phase, uint32_t wait_peer, uint32_t piece, uint32_t signature) noexcept {
  // CPU stores into this rank's own page, which the blocked stream polls: no CUDA call, so nothing
  // can queue them behind the blocked stream (CUDA_DEVICE_MAX_CONNECTIONS=1 included).
  for_each_awaited_peer(rank_, world_, wait_peer, [&](int p) {
    __atomic_store_n(awaited_word(page_, phase, piece, p), signature, __ATOMIC_RELEASE);
  });
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

}  // namespace symmem::detail
