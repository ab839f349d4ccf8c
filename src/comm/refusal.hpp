// Refusals: a call whose arguments fail a check on one rank (a pointer outside device memory, a
// misaligned or null one, a staged input larger than its area, a tensor of the wrong shape in a
// binding) is refused on that rank, and every rank raises the same error, naming that rank and the
// cause, within milliseconds, instead of the peers waiting in the call until their deadline.
//
// Which checks. Those of what one rank alone decides: its pointers and their memory (null, host,
// another device, outside the heap buffer named), alignment, overlap, its row and token counts
// against its buffers and the staging area, and in the bindings its tensors' shapes, dtypes,
// devices and layouts. Checks of what every rank must pass alike (the count, dtype, reduce op,
// options and algorithm of a collective, the all-to-all's row width and experts, the fused ops'
// shape: the values a plan reads) raise on the rank without refusing: every rank that makes the
// call reaches the same verdict and the communicator stays usable, and a rank that alone passed
// another value made another call (a mismatch, or a rank its peers wait for).
//
// How. Every check of a call's own arguments runs before anything is enqueued (own_arguments,
// checked_or_refused below). On failure the rank does not drop the call: it writes the message
// into its page of the host board, then enqueues on the call's stream one thread
// (kernels/refusal.cu) that writes its failure record as kStatusRefused (the ErrorCode in the
// record) and sets the abort word. In stream order, so the calls before it finish as they would
// have; then every wait of every peer's kernels of the refused call (barrier flags, low-latency
// lines, copy-engine handshakes through the watchdog, the fused GEMM's flags) sees the abort word
// once it has waited the quiet time (1 ms), in its turn, and leaves, and every host's next call,
// check() or synchronize() finds the record (ensure_usable; a cause of its own for
// board/wait_chain.hpp) and raises the refusing
// rank's ErrorCode with its message. No protocol carries anything for it, so a call that is not
// refused pays nothing: no launch, no word, no round trip.
//
// Under CUDA graph capture nothing captured would ever run the refusal (the refusing rank raises,
// its graph is incomplete), so the record and the abort word are written from the host at once:
// the peers' next call, check() or synchronize() raises the refusal, and their graphs' replays
// leave at once (their waits poll the abort word). The same happens when the kernel cannot be
// enqueued (an invalid stream).
//
// Afterwards the communicator is unusable on every rank, as after a mismatch or a capacity verdict
// (the peers may have entered the call's protocol half way): every later call raises kAborted with
// the same message. kUnsupported and kAborted (a build or GPU without the fused GEMM, a
// communicator that spans nodes, one closed or failed) never refuse: every rank that makes the
// call raises them alike. A refusal reaches the ranks of this node (they share the host board);
// ranks on other nodes of a hierarchical all_gather learn of it through their NCCL step's deadline.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "symmem/error.hpp"

namespace symmem::detail {

struct CommunicatorState;

// The record's signature for a refused call (the call was never signed; nonzero, as every
// recorded signature is).
constexpr uint32_t kRefusalSignature = 0x5EF05EDu;

// "<op>: rank <rank> refused the call: <cause>; every rank raises this error and the communicator
// is unusable now". `cause` may be an Error's what() or a bare message: a leading "symmem <code>: "
// and "<op>: " are dropped. At most HostBoard's refusal text (longer causes are cut).
std::string refusal_message(const char* op, int rank, ErrorCode code, const std::string& cause);

// Refuses this rank's part of call `op` (its OpCode `op_code`; kOpNone for a binding's call) on
// `stream`, as described above, and throws Error(code, refusal_message(...)). On a communicator
// that is closed or already failed (its peers know) it only throws Error(code, cause).
[[noreturn]] void refuse_call(CommunicatorState& st, uint32_t op_code, const char* op, ErrorCode code,
                              const std::string& cause, cudaStream_t stream);

// Runs `checks` (a call's argument checks, which throw symmem::Error and enqueue nothing) and
// returns what it returns; a failure refuses the call (refuse_call), except kUnsupported and
// kAborted, which pass as they are. Costs nothing when the checks pass.
template <typename Checks>
auto checked_or_refused(CommunicatorState& st, uint32_t op_code, const char* op, cudaStream_t stream, Checks&& checks)
    -> decltype(checks()) {
  try {
    return checks();
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kUnsupported || e.code() == ErrorCode::kAborted) throw;
    refuse_call(st, op_code, op, e.code(), e.what(), stream);
  }
}

// Where a call's own-argument checks refuse it: the call, on its stream. A describe_* query (which
// launches nothing) passes none, and its checks only throw.
struct RefusalSite {
  CommunicatorState& st;
  uint32_t op_code;
  const char* op;
  cudaStream_t stream;
};

// `checks` of this rank's own arguments, inside a preparation that also checks agreed values:
// refused at `site` (checked_or_refused), or only thrown without one.
template <typename Checks>
auto own_arguments(const RefusalSite* site, Checks&& checks) -> decltype(checks()) {
  if (!site) return checks();
  return checked_or_refused(site->st, site->op_code, site->op, site->stream, checks);
}

}  // namespace symmem::detail
