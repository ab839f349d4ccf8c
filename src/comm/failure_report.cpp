// How a failure recorded on any rank (a device wait's timeout or mismatch, a capacity verdict, a
// refusal, a failed step between nodes) becomes the error every rank raises: ensure_usable() finds
// the root cause in the host board's records, follows the chain of ranks that waited for each other
// (board/wait_chain.hpp) and names the rank that never came, then marks the communicator unusable.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "board/wait_chain.hpp"
#include "comm/communicator_state.hpp"
#include "plan/capacity_failure.hpp"

namespace symmem::detail {

namespace {

// `waited_through`: the ranks the awaited one waited for in turn, the last of which never came
// (board/wait_chain.hpp); the message then leads with that rank.
std::string describe_failure(const CommunicatorState& st, int who, const DeviceStatus& s,
                             const std::vector<int>& waited_through = {}) {
  const bool spans = st.layout.spans_nodes();
  // Failure records name local ranks, except the between-nodes step's peer, a job rank.
  auto name = [&](int local) {
    return spans ? st.layout.describe_rank(st.job_rank(local)) : "rank " + std::to_string(local);
  };
  const std::string me = name(s.rank);
  const std::string op = op_code_name(s.op);
  std::string mine = st.board->lookup_call(who, s.signature);
  if (mine.empty()) mine = op;
  if (s.op == kOpBetweenNodes) {
    const char* text = st.board->page(who)->net_failure;
    const std::string nccl(text, strnlen(text, sizeof(st.board->page(who)->net_failure)));
    const std::string peer =
        s.peer >= 0 ? st.layout.describe_rank(s.peer) : "a rank of equal local rank on another node";
    const std::string what = s.code == kStatusNetwork ? " failed between nodes in " : " timed out between nodes in ";
    return me + what + mine + " (piece " + std::to_string(s.phase) + ") exchanging with " + peer +
           (nccl.empty() ? "" : ": " + nccl) + "; " + peer + " is dead or stalled, or the network or NCCL failed";
  }
  if (s.code == kStatusCapacity) return describe_capacity_failure(decode_fault(s), mine, name);
  if (s.code == kStatusRefused) {
    // The refusing rank's own message (comm/refusal.hpp), written before its record.
    const char* text = st.board->page(who)->refusal;
    const std::string refusal(text, strnlen(text, sizeof(st.board->page(who)->refusal)));
    if (!refusal.empty()) return refusal;
    return me + " refused a call of " + op + " whose arguments failed a check there" +
           "; every rank raises this error and the communicator is unusable now";
  }
  const std::string peer = name(s.peer);
  if (s.code == kStatusMismatch) {
    std::string theirs = s.peer >= 0 && s.peer < st.world ? st.board->lookup_call(s.peer, s.peer_signature) : "";
    if (theirs.empty())
      theirs = "a different collective or arguments (signature " + std::to_string(s.peer_signature) + ")";
    return me + " called " + mine + " but " + peer + " called " + theirs +
           "; every rank must make the same collective calls with the same arguments";
  }
  if (s.op == kOpAllGatherMatmul && s.block >= 0) {
    // The fused GEMM's wait for rows of a peer's shard (fused/flag_waiting_scheduler.cuh; the own
    // shard's rows precede the GEMM and are never waited for): its deadline is twice the
    // communicator's plus 1 s.
    return me + " timed out after " + std::to_string(2 * st.timeout_ms() + 1000) + " ms in " + mine +
           ": its GEMM waited for rows of " + peer + "'s shard (flag " + std::to_string(s.phase) +
           ") that never arrived; " + peer + " is dead or stalled, or its copy could not start";
  }
  const std::string wait =
      me + " timed out after " + std::to_string(st.timeout_ms()) + " ms in " + mine + " waiting for " + peer +
      (s.block >= 0 ? " (block " + std::to_string(s.block) + ", phase " + std::to_string(s.phase) + ")"
                    : s.op == kOpCopyEngine && s.phase == 2
                        ? std::string(" (its signal that a piece of partial sums is ready)")
                        : " (copy-engine handshake " + std::to_string(s.phase) + ")");
  if (waited_through.empty()) return wait + "; " + peer + " is dead, stalled, or called a different collective";
  std::string path;
  for (int r : waited_through) path += ", which was waiting for " + name(r);
  return name(waited_through.back()) + " never came (dead, stalled, or never launched; it recorded no failure): " +
         wait + path;
}

// The ErrorCode a refusing rank raised, as its record carries it (kInvalidArgument if out of range).
ErrorCode refused_error_code(const DeviceStatus& s) {
  const auto code = static_cast<ErrorCode>(s.block);
  return s.block >= 0 && error_code_id(code) ? code : ErrorCode::kInvalidArgument;
}

}  // namespace

void CommunicatorState::ensure_usable(const char* op, std::chrono::milliseconds settle, bool* provisional) {
  if (closed) throw Error(ErrorCode::kAborted, std::string(op) + ": the communicator was closed");
  if (!abort_reason.empty())
    throw Error(ErrorCode::kAborted,
                std::string(op) + ": communicator unusable after an earlier failure: " + abort_reason);
  const DeviceStatus& own = *status_host();
  const bool failed_here = __atomic_load_n(&own.code, __ATOMIC_ACQUIRE) != kStatusOk;
  const bool failed_anywhere = __atomic_load_n(board->abort_word(), __ATOMIC_ACQUIRE) != 0;
  if (!failed_here && !failed_anywhere) return;
  // A recorder sets the abort word after its record (a device wait writes the code last, the host
  // watchdog claims the code first): give it a moment to finish, so the fields read below are final.
  const auto abort_word_due = std::chrono::steady_clock::now() + std::min(kAbortWordSettle, settle);
  while (__atomic_load_n(board->abort_word(), __ATOMIC_ACQUIRE) == 0 && std::chrono::steady_clock::now() < abort_word_due)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  // A wait below that ended before what it waited for; after a short settle the verdict is then
  // provisional (below).
  const bool short_settle = settle < kFailureRecordsSettle;
  bool gave_up = __atomic_load_n(board->abort_word(), __ATOMIC_ACQUIRE) == 0;
  // The root cause: this rank's own timeout or mismatch, else the first rank that recorded one.
  int who = -1;
  if (is_failure_cause(own.code)) who = rank;
  for (int r = 0; r < world && who < 0; ++r)
    if (is_failure_cause(__atomic_load_n(&board->page(r)->status.code, __ATOMIC_ACQUIRE))) who = r;
  if (who < 0) {
    // The abort word is set but the failing rank's record is not visible yet (or it died while
    // writing it): report what is known.
    const std::string reason = "another rank aborted the communicator";
    if (short_settle) {
      if (provisional) *provisional = true;
    } else {
      abort_reason = reason;
    }
    throw Error(ErrorCode::kAborted, std::string(op) + ": " + reason);
  }
  // Whom the awaited ranks waited for in turn (board/wait_chain.hpp). A live rank records its own
  // failure within milliseconds of the abort word (the waits' quiet time, then their turn to read
  // it: up to 512 rounds of a low-latency wait), a dead one never does: wait that long, on this
  // error path only and once for the whole walk, for each record (code and signature both
  // set, whichever order its recorder wrote them in); then take what is there.
  const auto records_due = std::chrono::steady_clock::now() + std::min(kRecordsSettle, settle);
  const int first = who;
  auto final_record = [&](int r) {
    const DeviceStatus& theirs = board->page(r)->status;
    auto recorded = [&] {
      return __atomic_load_n(&theirs.code, __ATOMIC_ACQUIRE) != kStatusOk &&
             __atomic_load_n(&theirs.signature, __ATOMIC_ACQUIRE) != 0;
    };
    while (r != first && !recorded() && std::chrono::steady_clock::now() < records_due)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (r != first && !recorded()) gave_up = true;
    DeviceStatus copy{};
    if (__atomic_load_n(&theirs.code, __ATOMIC_ACQUIRE) != kStatusOk) std::memcpy(&copy, &theirs, sizeof(copy));
    return copy;
  };
  const FailureVerdict verdict = judge_failure(first, world, final_record);
  who = verdict.who;
  const DeviceStatus s = verdict.record;
  std::string reason = describe_failure(*this, who, s, verdict.waited_through);
  // A capacity verdict is every rank's own (the same matrix everywhere), and a refusal's message
  // names its rank already: every rank raises the same text, no rank failed "first".
  if (who != rank && s.code != kStatusCapacity && s.code != kStatusRefused)
    reason = "rank " + std::to_string(job_rank(who)) + " failed first: " + reason;
  if (short_settle && gave_up) {
    // A record the walk read was not written yet, and a missing record reads as a rank that never
    // came: right for a dead rank (whose record never comes), early for a live one.
    if (provisional) *provisional = true;
    reason += " (provisional: a rank's failure record was not written yet; the next call or check judges again)";
  } else {
    abort_reason = reason;
  }
  throw Error(s.code == kStatusMismatch   ? ErrorCode::kMismatch
              : s.code == kStatusCapacity ? ErrorCode::kCapacity
              : s.code == kStatusRefused  ? refused_error_code(s)
                                          : ErrorCode::kTimeout,
              reason);
}

}  // namespace symmem::detail
