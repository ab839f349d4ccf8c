// The copy-engine wait word (BoardPage::ce_wait_state): the state and which wait, in one word that
// the stream writes once and the watchdog decodes.
#include "board/wait_word.hpp"
#include "test.hpp"

using namespace symmem::detail;
using W = WaitWord;

TEST(copy_engine_wait_word_carries_the_state_and_which_wait) {
  for (uint32_t phase : {W::kPhaseReady, W::kPhaseDone, W::kPhasePiece}) {
    for (uint32_t peer : {0u, 1u, 7u, BoardPage::kEveryPeer}) {
      for (uint32_t piece = 0; piece < uint32_t(BoardPage::kPieceSignals); ++piece) {
        const uint32_t entered = W::make(W::kEntered, phase, peer, piece);
        EXPECT_EQ(W::state_of(entered), W::kEntered);
        EXPECT_EQ(W::phase_of(entered), phase);
        EXPECT_EQ(W::wait_peer_of(entered), peer);
        EXPECT_EQ(W::piece_of(entered), piece);
        // The watchdog's 3 keeps which wait; it never equals a 1, a 2 or a 0 the stream writes.
        const uint32_t watched = W::watched_of(entered);
        EXPECT_EQ(W::state_of(watched), W::kWatched);
        EXPECT_EQ(W::phase_of(watched), phase);
        EXPECT(watched != entered && watched != W::kPassed && watched != W::kIdle);
      }
    }
  }
}
