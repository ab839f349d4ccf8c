// The host board: a page of pinned host memory per rank, shared by every local rank of the
// communicator (memfd, passed over the fd exchange, mapped by every process and registered with
// CUDA as mapped memory, so every GPU can read and write every page too).
//
// Why host memory: what must stay reachable when a GPU stream is blocked lives here. A host thread
// can read it and write it with plain CPU loads and stores, which never queue behind device work
// (CUDA_DEVICE_MAX_CONNECTIONS=1 puts every stream on one hardware queue, so a rescue cudaMemcpy
// would wait behind the very wait it should release). It holds:
//   - every rank's failure record (DeviceStatus), so any rank can say why another failed;
//   - the communicator's abort word (in rank 0's page), polled by every device wait;
//   - the copy-engine handshake flags (written by the peers' streams, waited on by this rank's
//     stream, releasable by this rank's watchdog with a CPU store);
//   - the copy-engine wait-state word the watchdog uses to time a wait from when the GPU reached it;
//   - a short log of each rank's recent calls (signature -> description), so that a mismatch
//     names both calls;
//   - the message of a call this rank refused (its arguments failed a check on this rank only),
//     so that every rank raises it.
// Lifetime: created collectively with the communicator, released locally by its destructor
// (unregister, unmap, close); nothing in it is freed before the communicator is destroyed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "bootstrap/fd_exchange.hpp"
#include "device/device_types.hpp"
#include "symmem/bootstrap.hpp"

namespace symmem::detail {

struct CallRecord {
  uint32_t signature;  // 0: empty
  char text[124];      // e.g. "all_gather(count=100000, float16, pull, blocks=16)"
};

struct alignas(64) BoardPage {
  static constexpr int kCallLog = 32;

  DeviceStatus status;         // this rank's failure record (written by this rank's GPU or watchdog)
  alignas(64) uint32_t abort;  // used in rank 0's page only: nonzero once any rank failed
  // Copy-engine handshake flags addressed to this rank: ready[p] / done[p] are written by peer p's
  // stream with the call's signature, waited on by this rank's stream, and reset to 0 after.
  alignas(64) uint32_t ce_ready[kMaxWorld];
  uint32_t ce_done[kMaxWorld];
  // Copy-engine wait state of this rank's stream: the stream writes 1 before a handshake wait and
  // 2 after it; the watchdog acknowledges a 1 by swapping it for 3 (starting the clock) and a 2 by
  // swapping it for 0. A 3 that stays means the same wait is still blocked
  // (board/wait_word.hpp, board/copy_engine_watchdog.hpp). The low byte is the state; with a 1 (and the 3 that
  // replaces it) the upper bytes say which wait it is (WaitWord::make): the phase (0
  // ready handshake, 1 done handshake, 2 piece), the one peer a piece wait awaits (0xFF: every
  // peer, the handshakes) and the piece. One word: every stream write costs a system-scope fence.
  alignas(64) uint32_t ce_wait_state;
  // The signature the wait expects in every awaited word, written before the (fenced) 1.
  uint32_t ce_signature;
  // Piece signals addressed to this rank: ce_piece[p * kPieceSignals + j] is written by peer p's
  // stream with the call's signature once piece j of what p made for this rank may be read
  // (matmul_reduce_scatter's partial sums), waited on by this rank's stream and reset to 0 after.
  static constexpr uint32_t kEveryPeer = 0xFFFFFFFFu;
  static constexpr int kPieceSignals = 8;
  alignas(64) uint32_t ce_piece[kMaxWorld * kPieceSignals];
  // Between-nodes wait state of this rank's network stream (src/net/between_nodes.hpp), the same
  // protocol as ce_wait_state: the stream writes net_piece and net_signature, then 1 before an NCCL
  // step and 2 after it; the network watchdog swaps 1 for 3 (clock started) and 2 for 0.
  alignas(64) uint32_t net_wait_state;
  uint32_t net_piece;
  uint32_t net_signature;
  // NCCL's text for this rank's between-nodes failure (NUL-terminated, written once before the
  // failure record's abort word), so that every local rank's error can quote it.
  char net_failure[192];
  // The message of a call this rank refused (src/comm/refusal.hpp: NUL-terminated, written by this
  // rank's host once, before its failure record says kStatusRefused), which every rank raises.
  static constexpr size_t kRefusalText = 512;
  char refusal[kRefusalText];
  // Call log, written only by this rank's host (record_call), read by every rank's host.
  alignas(64) uint32_t call_head;  // slots written so far (the newest is (call_head - 1) % kCallLog)
  CallRecord calls[kCallLog];
};

class HostBoard {
 public:
  // Collective over the local ranks.
  HostBoard(int rank, int world, Bootstrap& bootstrap, FdExchange& exchange);
  ~HostBoard();  // never throws
  HostBoard(const HostBoard&) = delete;
  HostBoard& operator=(const HostBoard&) = delete;

  // Rank `rank`'s page (0 <= rank < world): its host address in this process, and the same page as
  // this GPU addresses it (for stream memory operations and kernels).
  BoardPage* page(int rank) const { return static_cast<BoardPage*>(mappings_[rank]); }
  BoardPage* device_page(int rank) const { return device_pages_[rank]; }
  uint32_t* abort_word() const { return &page(0)->abort; }
  uint32_t* device_abort_word() const { return &device_page(0)->abort; }

  // Host side of the call log: remembers what this rank's call with `signature` was (costs a scan
  // of the last few entries when the signature was logged recently: the hot path); lookup finds
  // rank `rank`'s entry ("" when not found). record_call is for the communicator's one calling
  // thread; lookup_call may run anywhere (a seqlock check discards an entry overwritten meanwhile).
  void record_call(uint32_t signature, const std::string& text);
  // True when `signature` is among this rank's last few entries (record_call would skip it), so
  // that a caller can skip formatting the text as well.
  bool recorded_recently(uint32_t signature) const;
  std::string lookup_call(int rank, uint32_t signature) const;

 private:
  void release() noexcept;  // unregister, unmap, close: whatever was made so far

  int rank_;
  int world_;
  size_t page_bytes_ = 0;
  void* mappings_[kMaxWorld] = {};   // host address of every rank's page (MAP_SHARED)
  bool registered_[kMaxWorld] = {};  // cudaHostRegister succeeded on mappings_[r]
  BoardPage* device_pages_[kMaxWorld] = {};
  int fd_ = -1;  // this rank's memfd: closed once the peers hold theirs (the mappings keep it alive)
};

// Host-side access to board words, which GPUs write concurrently (the watchdogs' reads and swaps).
inline uint32_t load_word(const uint32_t* word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }
inline bool swap_word(uint32_t* word, uint32_t from, uint32_t to) {
  return __atomic_compare_exchange_n(word, &from, to, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

// A watchdog's failure, from the host: records `failure` in `page`'s failure record unless one is
// there already (the first failure of a rank wins: a device wait may have recorded one), with
// `text` (may be null) in page->net_failure, then sets the abort word that every wait of every
// local rank polls. The record is visible before the abort word. Never blocks.
void record_failure(BoardPage* page, uint32_t* abort_word, const DeviceStatus& failure, const char* text) noexcept;

}  // namespace symmem::detail
