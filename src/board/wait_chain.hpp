// Why a timeout happened, read from every rank's failure record (no CUDA: tests/unit runs it).
//
// A rank that timed out waiting for a peer may have waited for a peer that was itself waiting for a
// third rank, in an earlier call: ranks run ahead of each other by whole calls. A waiting rank
// records a timeout when its own deadline passes, or `aborted` when another rank's failure reached
// it first; both name whom it waited for (a copy-engine wait names the first peer whose word had
// not come). Following those records from rank to awaited rank tells the causes apart:
//   - the path ends at a rank that recorded nothing (dead, stalled, or never launched): that rank
//     is the one that never came, whatever calls the ranks on the way ran;
//   - the path ends at a rank that recorded a cause of its own (a mismatch it saw in a flag, a
//     capacity verdict, a call it refused, a failure between nodes, whose peer is a remote rank):
//     that is the cause;
//   - the path comes back to a rank already on it, and the ranks on that cycle ran calls of
//     different signatures: a mismatch no flag could show (two protocols, each waiting for what
//     the other never writes). A cycle of one call is a plain timeout.
// A timeout is read as a mismatch only on such a cycle: a peer behind in an earlier call, waiting
// for someone else, is not one (seen at 8 ranks on one GPU before this rule).
// A wait that names no peer at all (a copy-engine wait for every word, all of which came) may
// have waited for any rank of its call: it closes the path into a cycle at its start.
#pragma once

#include <functional>
#include <vector>

#include "device/device_types.hpp"

namespace symmem::detail {

struct WaitChain {
  std::vector<int> ranks;             // ranks[0] is where the path began; each waited for the next
  std::vector<DeviceStatus> records;  // their records, as read (code kStatusOk: none)
  int cycle_start = -1;               // >= 0: ranks.back() waited for ranks[cycle_start]
  bool mismatch = false;              // the cycle's ranks ran calls of different signatures
  // With `mismatch`: the first rank on the cycle and the first after it whose call differs.
  int mismatch_rank = -1, mismatch_peer = -1;
};

// Follows the records from `first` (whose record is a timeout) through timeouts and aborts.
// `record(r)` returns rank r's record (code kStatusOk when it recorded nothing, or nothing yet; it
// may wait a moment for a live one). Visits each rank at most once.
WaitChain follow_waits(int first, int world, const std::function<DeviceStatus(int)>& record);

// The failure to report, given the record of `who` (this rank's own cause, else the first rank's
// that recorded one).
struct FailureVerdict {
  int who = -1;         // whose record describes it
  DeviceStatus record;  // that record, its code kStatusMismatch where the waits close such a cycle
  // Where the path runs through ranks waiting in turn to one that recorded nothing: the ranks
  // after the first awaited one, the last being the one that never came (empty otherwise).
  std::vector<int> waited_through;
};
FailureVerdict judge_failure(int who, int world, const std::function<DeviceStatus(int)>& record);

}  // namespace symmem::detail
