// The copy-engine wait word (BoardPage::ce_wait_state): the state and which wait, in one word that
// the stream writes once and the watchdog decodes.
#include "collectives/copy_engine_state.hpp"
#include "test.hpp"

using namespace symmem::detail;
using CE = CopyEngineState;

TEST(copy_engine_wait_word_carries_the_state_and_which_wait) {
  for (uint32_t phase : {CE::kPhaseReady, CE::kPhaseDone, CE::kPhasePiece}) {
    for (uint32_t peer : {0u, 1u, 7u, BoardPage::kEveryPeer}) {
      for (uint32_t piece = 0; piece < uint32_t(BoardPage::kPieceSignals); ++piece) {
        const uint32_t entered = CE::wait_word(CE::kWaitEntered, phase, peer, piece);
        EXPECT_EQ(CE::state_of(entered), CE::kWaitEntered);
        EXPECT_EQ(CE::phase_of(entered), phase);
        EXPECT_EQ(CE::wait_peer_of(entered), peer);
        EXPECT_EQ(CE::piece_of(entered), piece);
        // The watchdog's 3 keeps which wait; it never equals a 1, a 2 or a 0 the stream writes.
        const uint32_t watched = CE::watched_of(entered);
        EXPECT_EQ(CE::state_of(watched), CE::kWaitWatched);
        EXPECT_EQ(CE::phase_of(watched), phase);
        EXPECT(watched != entered && watched != CE::kWaitPassed && watched != CE::kWaitIdle);
      }
    }
  }
}
