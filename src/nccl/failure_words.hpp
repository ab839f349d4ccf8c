// The symmem communicator's failure words as the shim reads and sets them from any thread: the
// host board's failure record of this rank and the node's abort word (board/host_board.hpp), plain
// host memory read and written atomically, never through the communicator's calls (which belong to
// the thread that uses it).
#pragma once

#include <chrono>
#include <cstdint>

#include "symmem/communicator.hpp"

namespace symmem::nccl {

// True once this rank's failure record holds a code (one of its device waits failed: a timeout, a
// mismatch, or the abort word seen while it waited; or a host-side recorder of this rank's), or the
// abort word is set and some rank recorded a cause (a timeout, mismatch, refusal, network failure,
// capacity verdict). A clean abort (ncclCommAbort: the word, no record) alone does not count: a
// rank with nothing in flight then has lost nothing (NCCL reports no error there either), and its
// next served call fails, since it needs that peer.
bool failure_to_report(const Communicator& comm) noexcept;
// Throws the failure failure_to_report() found, waiting at most `settle` for the records it names
// (CommunicatorState::ensure_usable: *provisional set when one was still missing then; such a
// verdict is not kept). The caller holds what serialises the communicator's calls.
void throw_failure(Communicator& comm, std::chrono::milliseconds settle, bool* provisional);
// The abort word (host memory, valid while the communicator lives): storing 1 there makes every
// wait of every rank of the node return at once with kAborted, and every later call fail.
uint32_t* abort_word_of(const Communicator& comm) noexcept;

}  // namespace symmem::nccl
