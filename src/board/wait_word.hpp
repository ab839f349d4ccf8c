// The words of a board page that the copy-engine waits use (board/handshake.hpp writes and waits
// on them from streams, board/copy_engine_watchdog.hpp times and releases them from the host):
//
//   ce_wait_state, one word: the state in the low byte, and with a 1 (and the 3 that replaces it)
//   which wait it is in the upper bytes: the phase, the one peer a piece wait awaits (0xFF: every
//   peer, the handshakes) and the piece. One word, because every stream write costs a system-scope
//   fence.
//     0 idle          1 the stream reached a wait     2 the stream passed it
//     3 the watchdog saw that 1 and started the clock (its CAS 1 -> 3)
//   The GPU only ever stores 1 and 2; the watchdog only swaps 1 -> 3 and 2 -> 0.
//
//   the awaited words: ce_ready[p] and ce_done[p] (the handshakes, written by peer p) and
//   ce_piece[p][j] (peer p's signal of piece j), each holding the call's signature once the peer
//   wrote it, 0 after the waiting stream reset it.
#pragma once

#include <cstdint>

#include "board/host_board.hpp"

namespace symmem::detail {

struct WaitWord {
  // States (the low byte).
  static constexpr uint32_t kIdle = 0;
  static constexpr uint32_t kEntered = 1;  // written by the stream before a wait
  static constexpr uint32_t kPassed = 2;   // written by the stream after it
  static constexpr uint32_t kWatched = 3;  // written by the watchdog over a 1
  // Phases: which awaited words a wait is on.
  static constexpr uint32_t kPhaseReady = 0;  // the ready handshake
  static constexpr uint32_t kPhaseDone = 1;   // the done handshake
  static constexpr uint32_t kPhasePiece = 2;  // one peer's signal of one piece (matmul_reduce_scatter)

  static constexpr uint32_t kStateMask = 0xFFu;
  static constexpr uint32_t kEveryPeerCode = 0xFFu;
  static constexpr uint32_t make(uint32_t state, uint32_t phase, uint32_t wait_peer, uint32_t piece) {
    const uint32_t peer = wait_peer == BoardPage::kEveryPeer ? kEveryPeerCode : (wait_peer & 0xFFu);
    return (state & kStateMask) | (phase & 0xFFu) << 8 | peer << 16 | (piece & 0xFFu) << 24;
  }
  static_assert(kMaxWorld < kEveryPeerCode && BoardPage::kPieceSignals <= 256,
                "the word packs peer and piece in a byte");
  static constexpr uint32_t state_of(uint32_t word) { return word & kStateMask; }
  // The watchdog's acknowledgement of an entered wait: the same wait, state 3.
  static constexpr uint32_t watched_of(uint32_t word) { return (word & ~kStateMask) | kWatched; }
  static constexpr uint32_t phase_of(uint32_t word) { return (word >> 8) & 0xFFu; }
  static constexpr uint32_t wait_peer_of(uint32_t word) {
    const uint32_t peer = (word >> 16) & 0xFFu;
    return peer == kEveryPeerCode ? BoardPage::kEveryPeer : peer;
  }
  static constexpr uint32_t piece_of(uint32_t word) { return word >> 24; }
};

// The word of `page` that peer p writes for a wait of `phase` (host or device address alike): its
// handshake word, or its signal of piece `piece`.
inline uint32_t* awaited_word(BoardPage* page, uint32_t phase, uint32_t piece, int p) {
  switch (phase) {
    case WaitWord::kPhaseDone: return &page->ce_done[p];
    case WaitWord::kPhasePiece: return &page->ce_piece[p * BoardPage::kPieceSignals + piece];
    default: return &page->ce_ready[p];
  }
}

// The peers a wait awaits: every other rank (kEveryPeer), or the one a piece wait names (none when
// that is out of range or this rank).
template <typename Visit>
void for_each_awaited_peer(int rank, int world, uint32_t wait_peer, Visit visit) {
  if (wait_peer != BoardPage::kEveryPeer) {
    if (wait_peer < uint32_t(world) && int(wait_peer) != rank) visit(int(wait_peer));
    return;
  }
  for (int k = 1; k < world; ++k) visit((rank + k) % world);
}

}  // namespace symmem::detail
