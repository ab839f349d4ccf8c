// All-gather by the copy engines: zero SMs. The handshake, the watchdog and how this path fails
// are described in copy_engine_state.hpp.
#include <cuda.h>

#include <algorithm>
#include <string>
#include <vector>

#include "collectives/all_gather_paths.hpp"
#include "collectives/copy_engine_state.hpp"
#include "collectives/copy_engine_steps.hpp"
#include "comm/communicator_state.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "common/driver_api.hpp"
#include "common/stream_capture.hpp"
#include "plan/plan.hpp"

namespace symmem::detail {
namespace {

using namespace std::chrono_literals;

// Watchdog polling (see copy_engine_state.hpp). A late first look at a wait only lengthens its
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
// SYMMEM_CE_PIECE_KB = 0 means no cutting; smaller pieces than a page are never useful.
constexpr size_t kNoCutting = size_t(1) << 40;
constexpr size_t kSmallestPieceSetting = 4096;

// The word of `page` that peer p writes for a wait of `phase` (host or device address alike): its
// handshake word, or its signal of piece `piece`.
uint32_t* awaited_word(BoardPage* page, uint32_t phase, uint32_t piece, int p) {
  switch (phase) {
    case CopyEngineState::kPhaseDone: return &page->ce_done[p];
    case CopyEngineState::kPhasePiece: return &page->ce_piece[p * BoardPage::kPieceSignals + piece];
    default: return &page->ce_ready[p];
  }
}

// The peers a wait awaits: every other rank (kEveryPeer), or the one a piece wait names (none
// when that is out of range or this rank).
template <typename Visit>
void for_each_awaited_peer(int rank, int world, uint32_t wait_peer, Visit visit) {
  if (wait_peer != BoardPage::kEveryPeer) {
    if (wait_peer < uint32_t(world) && int(wait_peer) != rank) visit(int(wait_peer));
    return;
  }
  for (int k = 1; k < world; ++k) visit((rank + k) % world);
}

const HostBoard& board_of(const CommunicatorState& state) {
  if (!state.board) throw Error(ErrorCode::kInternal, "copy-engine state: the host board must be created first");
  return *state.board;
}

}  // namespace

// One handshake as one batch of stream memory operations, executed in order (copy_engine_state.hpp):
// tell every peer, publish this wait, wait for every peer, mark the wait passed, reset.
void enqueue_handshake(const HostBoard& board, int rank, int world, uint32_t phase, uint32_t signature,
                       cudaStream_t stream) {
  CUstreamBatchMemOpParams ops[3 * (kMaxWorld - 1) + 6] = {};
  unsigned count = 0;
  // Every write is the default one: preceded by a system-scope fence.
  auto write = [&](const uint32_t* address, uint32_t value) { ops[count++] = stream_write_op(address, value); };
  BoardPage* mine = board.device_page(rank);
  for (int k = 1; k < world; ++k) {
    const int p = (rank + k) % world;
    write(awaited_word(board.device_page(p), phase, 0, rank), signature);
  }
  enqueue_watched_wait(mine, rank, world, phase, BoardPage::kEveryPeer, 0, signature, ops, count);
  SYMMEM_CU_CHECK(DriverApi::get().stream_batch_mem_op(stream, count, ops, 0));
}

// The watched wait of one batch (copy_engine_state.hpp): publish which wait it is, mark it entered,
// wait for every awaited word, mark it passed, reset the words. A peer writes a word again only
// after this rank's next write to it, whose fence orders these resets first.
void enqueue_watched_wait(BoardPage* mine, int rank, int world, uint32_t phase, uint32_t wait_peer, uint32_t piece,
                          uint32_t signature, CUstreamBatchMemOpParams* ops, unsigned& count) {
  auto write = [&](const uint32_t* address, uint32_t value) { ops[count++] = stream_write_op(address, value); };
  write(&mine->ce_signature, signature);
  // After S (fenced): the watchdog that reads the 1 reads S and, in the same word, which wait.
  write(&mine->ce_wait_state, CopyEngineState::wait_word(CopyEngineState::kWaitEntered, phase, wait_peer, piece));
  for_each_awaited_peer(rank, world, wait_peer, [&](int p) {
    ops[count++] = stream_wait_op(awaited_word(mine, phase, piece, p), signature, CU_STREAM_WAIT_VALUE_EQ);
  });
  write(&mine->ce_wait_state, CopyEngineState::kWaitPassed);
  for_each_awaited_peer(rank, world, wait_peer, [&](int p) { write(awaited_word(mine, phase, piece, p), 0); });
}

namespace {
void require_piece(int rank, int world, int peer, int piece) {
  if (peer < 0 || peer >= world || peer == rank || piece < 0 || piece >= BoardPage::kPieceSignals)
    throw Error(ErrorCode::kInternal, "piece signal: peer " + std::to_string(peer) + " or piece " +
                                          std::to_string(piece) + " out of range");
}
}  // namespace

void enqueue_piece_signal(const HostBoard& board, int rank, int peer, int piece, uint32_t signature,
                          const uint32_t* count, uint32_t at_least, cudaStream_t stream) {
  require_piece(rank, kMaxWorld, peer, piece);
  CUstreamBatchMemOpParams ops[2] = {
      stream_wait_op(count, at_least, CU_STREAM_WAIT_VALUE_GEQ),
      stream_write_op(awaited_word(board.device_page(peer), CopyEngineState::kPhasePiece, piece, rank), signature)};
  SYMMEM_CU_CHECK(DriverApi::get().stream_batch_mem_op(stream, 2, ops, 0));
}

void enqueue_piece_wait(const HostBoard& board, int rank, int world, int peer, int piece, uint32_t signature,
                        cudaStream_t stream) {
  require_piece(rank, world, peer, piece);
  CUstreamBatchMemOpParams ops[8] = {};
  unsigned count = 0;
  enqueue_watched_wait(board.device_page(rank), rank, world, CopyEngineState::kPhasePiece, uint32_t(peer),
                       uint32_t(piece), signature, ops, count);
  SYMMEM_CU_CHECK(DriverApi::get().stream_batch_mem_op(stream, count, ops, 0));
}

CopyEngineState::CopyEngineState(CommunicatorState& state)
    : board_(board_of(state)),
      rank_(state.rank),
      world_(state.world),
      timeout_(std::chrono::milliseconds(std::max<int64_t>(1, state.settings.timeout_ms))),
      page_(board_.page(state.rank)),
      abort_(board_.abort_word()) {
  streams_count_ = std::clamp(state.settings.copy_engine_streams, 1, kMaxStreams);
  piece_bytes_ = state.settings.copy_engine_piece_bytes == 0
                     ? kNoCutting
                     : std::max(state.settings.copy_engine_piece_bytes, kSmallestPieceSetting);
  batch_ = state.settings.copy_engine_batch;
  DeviceGuard guard(state.device);
  try {
    // Highest priority for the side streams: their copies and waits are short and the GEMMs they
    // overlap should not delay them (the own slot's copy, a kernel, gets the lowest: own_stream).
    int least = 0, greatest = 0;
    SYMMEM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    for (int i = 0; i < streams_count_; ++i)
      SYMMEM_CUDA_CHECK(cudaStreamCreateWithPriority(&streams_[i], cudaStreamNonBlocking, greatest));
    SYMMEM_CUDA_CHECK(cudaStreamCreateWithPriority(&own_stream_, cudaStreamNonBlocking, least));
    SYMMEM_CUDA_CHECK(cudaEventCreateWithFlags(&own_join_, cudaEventDisableTiming));
    SYMMEM_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    for (int i = 0; i < streams_count_; ++i)
      SYMMEM_CUDA_CHECK(cudaEventCreateWithFlags(&joins_[i], cudaEventDisableTiming));
    watchdog_.start([this](Clock::time_point now) { return poll(now); });
  } catch (...) {
    destroy_cuda_objects();
    throw;
  }
}

CopyEngineState::~CopyEngineState() {
  watchdog_.stop();
  destroy_cuda_objects();
}

void CopyEngineState::destroy_cuda_objects() noexcept {
  for (int i = 0; i < kMaxStreams; ++i) {
    if (streams_[i]) SYMMEM_CUDA_CHECK_NOTHROW(cudaStreamDestroy(streams_[i]));
    if (joins_[i]) SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(joins_[i]));
    streams_[i] = nullptr;
    joins_[i] = nullptr;
  }
  if (fork_) SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(fork_));
  fork_ = nullptr;
  if (own_stream_) SYMMEM_CUDA_CHECK_NOTHROW(cudaStreamDestroy(own_stream_));
  if (own_join_) SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(own_join_));
  own_stream_ = nullptr;
  own_join_ = nullptr;
}

CopyEngineState::Clock::duration CopyEngineState::poll(Clock::time_point now) noexcept {
  uint32_t* state = &page_->ce_wait_state;
  // Any rank's failure (the abort word), or this rank's own (an SM wait may have recorded one).
  const bool aborted = load_word(abort_) != 0 || load_word(&page_->status.code) != kStatusOk;
  uint32_t seen = load_word(state);
  if (state_of(seen) == kWaitEntered) {
    const uint32_t watched = watched_of(seen);
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
  if (state_of(seen) != kWaitWatched) {
    // 2: acknowledge, so that the next wait shows up as a change. A failed swap means the stream
    // already wrote the next wait's 1, which the next look handles. 0 (or anything else): idle.
    if (seen == kWaitPassed) swap_word(state, kWaitPassed, kWaitIdle);
    timing_ = false;
    if (seen == kWaitPassed && aborted) last_busy_ = now;
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
  const uint32_t phase = phase_of(seen);
  const uint32_t signature = load_word(&page_->ce_signature);
  const uint32_t wait_peer = wait_peer_of(seen);
  const uint32_t piece = std::min<uint32_t>(piece_of(seen), BoardPage::kPieceSignals - 1);
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
    record(kStatusAborted, -1, phase, signature, 0);
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

void CopyEngineState::record(uint32_t code, int peer, uint32_t phase, uint32_t signature,
                             uint32_t peer_signature) noexcept {
  record_failure(page_, abort_,
                 {code, kOpCopyEngine, rank_, peer, -1, static_cast<int32_t>(phase), signature, peer_signature},
                 nullptr);
}

void CopyEngineState::release_wait(uint32_t phase, uint32_t wait_peer, uint32_t piece, uint32_t signature) noexcept {
  // CPU stores into this rank's own page, which the blocked stream polls: no CUDA call, so nothing
  // can queue them behind the blocked stream (CUDA_DEVICE_MAX_CONNECTIONS=1 included).
  for_each_awaited_peer(rank_, world_, wait_peer, [&](int p) {
    __atomic_store_n(awaited_word(page_, phase, piece, p), signature, __ATOMIC_RELEASE);
  });
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

void enqueue_copies(CopyEngineState& ce, const std::vector<EngineCopy>& copies, const EngineCopy* own, bool batchable,
                    cudaStream_t stream) {
  const bool batch = batchable && copies.size() > 1;
  // Share 0 of the peer copies (all of them when batched or on one stream) runs on the caller's
  // stream itself: a fork and a join on the path every byte takes cost microseconds per call
  // (bench/results/h200/copy_engine_ab). The other shares fork onto side streams 0 .. n - 2, and
  // the own slot's local copy (a kernel, no peer involved) onto its own stream beside them; inside
  // one batch it delayed the NVLink copies (2 x H200, 64 MiB per rank: 287 GB/s batched with it,
  // 333 beside it; bench/results/h200/README.md). cudaMemcpyBatchAsync refuses the legacy default
  // stream: a batch for a default stream runs on side stream 0.
  const bool default_stream = stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
  const int n = batch ? 1 : ce.streams();
  auto share_of = [&](const EngineCopy& c) { return batch ? (default_stream ? 1 : 0) : c.stream % n; };
  auto stream_of = [&](int share) { return share == 0 ? stream : ce.side_stream(share - 1); };
  bool forked[CopyEngineState::kMaxStreams] = {};
  for (const EngineCopy& c : copies)
    if (const int share = share_of(c); share > 0) forked[share - 1] = true;
  const bool any_fork = own != nullptr || std::any_of(std::begin(forked), std::end(forked), [](bool f) { return f; });
  if (any_fork) SYMMEM_CUDA_CHECK(cudaEventRecord(ce.fork_event(), stream));
  for (int s = 0; s < ce.streams(); ++s)
    if (forked[s]) SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(ce.side_stream(s), ce.fork_event(), 0));
  if (own) {
    SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(ce.own_stream(), ce.fork_event(), 0));
    SYMMEM_CUDA_CHECK(cudaMemcpyAsync(own->dst, own->src, own->bytes, cudaMemcpyDeviceToDevice, ce.own_stream()));
  }
  if (batch) {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    for (const EngineCopy& c : copies) {
      dsts.push_back(c.dst);
      srcs.push_back(c.src);
      sizes.push_back(c.bytes);
    }
    // The driver spreads the copies of one batch over the copy engines.
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_index = 0;
    SYMMEM_CUDA_CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr, &attr_index, 1,
                                           stream_of(share_of(copies.front()))));
  } else {
    for (const EngineCopy& c : copies)
      SYMMEM_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, stream_of(share_of(c))));
  }
  for (int s = 0; s < ce.streams(); ++s) {
    if (!forked[s]) continue;
    SYMMEM_CUDA_CHECK(cudaEventRecord(ce.join_event(s), ce.side_stream(s)));
    SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(stream, ce.join_event(s), 0));
  }
  if (own) {
    SYMMEM_CUDA_CHECK(cudaEventRecord(ce.own_join_event(), ce.own_stream()));
    SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(stream, ce.own_join_event(), 0));
  }
}

void all_gather_copy_engine(CommunicatorState& state, const CopyEngineCall& call, cudaStream_t stream) {
  if (!state.copy_engine || !state.board)
    throw Error(ErrorCode::kInternal, "all_gather(copy_engine): the copy-engine state is missing");
  if (call.signature == 0)
    throw Error(ErrorCode::kInternal, "all_gather(copy_engine): signature 0 cannot be told from an empty flag");
  CopyEngineState& ce = *state.copy_engine;
  const HostBoard& board = *state.board;
  const int world = state.world;
  const int rank = state.rank;
  if (call.bytes == 0) return;  // equal on every rank (the signature covers the count): nothing to order
  for (int p = 0; p < world; ++p) {
    if (p != rank && (call.push ? call.out_peers[p] == nullptr : call.in_peers[p] == nullptr))
      throw Error(ErrorCode::kInternal, std::string("all_gather(copy_engine): no ") + (call.push ? "output" : "input") +
                                            " address of rank " + std::to_string(p));
  }

  const bool capturing = stream_is_capturing(stream);

  if (world > 1) enqueue_handshake(board, rank, world, CopyEngineState::kPhaseReady, call.signature, stream);
  // Invariant: every peer's input holds this call's data and its output may be overwritten.

  // Batched copies cannot be captured; a batch of one copy (two ranks) only adds the batch call's
  // cost (2 x H200, 1 MiB per rank: 27.3 us batched, 25.8 plain).
  const bool batchable = ce.batch() && !capturing;
  const auto pieces = plan_copy_engine(rank, world, call.bytes, batchable ? 1 : ce.streams(), ce.piece_bytes());
  // Pull (the default) writes only this rank's output; push writes this rank's slot of every
  // peer's output (copy_engine_state.hpp says what that risks after a timeout).
  char* out = static_cast<char*>(call.out);
  const char* in = static_cast<const char*>(call.in);
  const size_t stride = call.slot_stride;
  std::vector<EngineCopy> copies;
  copies.reserve(pieces.size());
  for (const auto& piece : pieces) {
    if (call.push)
      copies.push_back({static_cast<char*>(call.out_peers[piece.peer]) + size_t(rank) * stride + piece.offset,
                        in + piece.offset, piece.bytes, piece.stream});
    else
      copies.push_back({out + size_t(piece.peer) * stride + piece.offset,
                        static_cast<const char*>(call.in_peers[piece.peer]) + piece.offset, piece.bytes, piece.stream});
  }
  const EngineCopy own{out + size_t(rank) * stride, in, call.bytes, 0};
  enqueue_copies(ce, copies, call.copy_own ? &own : nullptr, batchable, stream);

  if (world > 1) enqueue_handshake(board, rank, world, CopyEngineState::kPhaseDone, call.signature, stream);
  // Invariant: no peer reads this rank's input any more (pull); every slot of this rank's output
  // arrived (push: the peers' done writes follow their copies).
}

}  // namespace symmem::detail
