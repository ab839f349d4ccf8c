// What a communicator owns, and the settings every rank agreed on at creation. Collectives reach
// it through detail::state_of(comm). Not part of the public API.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "board/call_signature.hpp"
#include "board/copy_engine_watchdog.hpp"
#include "board/host_board.hpp"
#include "bootstrap/fd_exchange.hpp"
#include "comm/agreed_settings.hpp"
#include "comm/call_order.hpp"
#include "comm/copy_engine_streams.hpp"
#include "comm/graph_references.hpp"
#include "plan/node_layout.hpp"
#include "device/device_types.hpp"
#include "heap/heap.hpp"
#include "plan/tuning_table.hpp"
#include "symmem/communicator.hpp"
#include "symmem/user_call.hpp"
#include "workspace/workspaces.hpp"

namespace symmem::detail {

// How long ensure_usable waits, on its error path only, for a failure's records to be final: the
// abort word after this rank's own record (its recorder sets the word next), then the record of
// every rank the waits name (a live rank writes its own within milliseconds, a dead one never).
inline constexpr std::chrono::milliseconds kAbortWordSettle{200};
inline constexpr std::chrono::milliseconds kRecordsSettle{500};
inline constexpr std::chrono::milliseconds kFailureRecordsSettle = kAbortWordSettle + kRecordsSettle;

class BetweenNodes;

struct CommunicatorState {
  Communicator* owner = nullptr;
  // The node's ranks (the heap, the host board, every SM and copy-engine collective) are
  // `bootstrap`, `rank` and `world`; the job is `layout` and `job_bootstrap` (the same on one node).
  std::shared_ptr<Bootstrap> job_bootstrap;
  std::shared_ptr<Bootstrap> bootstrap;
  NodeLayout layout;
  int device = 0;
  int rank = 0;          // local rank
  int world = 1;         // ranks of this node
  int sm_count = 0;      // the SMs this rank plans with (a share when ranks share the GPU)
  int ranks_on_gpu = 1;  // ranks of this communicator on the most crowded GPU (tests only: > 1)
  std::string gpu_name;
  AgreedSettings settings;
  bool debug = false;  // SYMMEM_DEBUG (local: only logging)
  const TuningTable* tuning = nullptr;

  std::unique_ptr<FdExchange> exchange;
  std::unique_ptr<Heap> heap;
  std::unique_ptr<HostBoard> board;
  std::vector<std::unique_ptr<Buffer>> buffers;
  std::unique_ptr<Workspaces> workspaces;
  std::unique_ptr<CopyEngineStreams> copy_engine;
  std::unique_ptr<CopyEngineWatchdog> copy_engine_watchdog;  // times and releases the board's waits
  std::unique_ptr<BetweenNodes> between_nodes;               // only when the job spans nodes
  std::unique_ptr<CallOrder> call_order;                     // calls in host order whatever their streams
  GraphReferences graphs;                                    // graphs that captured a call (they reference the heap)

  uint32_t* epochs = nullptr;  // per-block epochs, the call counter pair, the failure claim (device memory)
  SyncArgs sync_template{};    // sync_args() without the op and signature
  UserSync user_sync{};        // users' kernels' UserSync without the signature (workspace/user_call_area.hpp)
  std::string abort_reason;    // set once a failure was seen; every later call fails with it
  bool closed = false;

  CommunicatorState();
  ~CommunicatorState();

  int64_t timeout_ms() const { return settings.timeout_ms; }
  // A local rank's rank in the job (error messages name job ranks).
  int job_rank(int local) const { return layout.global_rank(layout.node, local); }
  // Throws kUnsupported for a collective that runs inside one node only, on a communicator that
  // spans several.
  void require_one_node(const char* op) const;
  DeviceStatus* status_host() const { return &board->page(rank)->status; }
  // Synchronisation arguments of the SM kernels for one call.
  SyncArgs sync_args(uint32_t op, uint32_t signature) const;
  // Throws if the communicator is closed or aborted, or if any rank recorded a failure. A failure
  // seen before the records it names are final waits for them (the abort word at most
  // kAbortWordSettle, the records kRecordsSettle, each capped at `settle`), then judges from what is
  // recorded and keeps the verdict. A caller that must not block long (PyTorch's watchdog through
  // the NCCL shim) passes a few milliseconds: where a record it waited for was still missing then,
  // the verdict is provisional (*provisional set): said so in its message, and not kept, so that a
  // later check judges again.
  void ensure_usable(const char* op, std::chrono::milliseconds settle = kFailureRecordsSettle,
                     bool* provisional = nullptr);
  // A call's signature, logged under it (mismatch messages on any rank name the call). Every call
  // signs itself after its checks, inside its EnqueueScope (below).
  uint32_t sign_call(const CallDescriptor& call) {
    const uint32_t signature = signature_of(call);
    record_call(signature, call);
    return signature;
  }
  // Makes the communicator unusable on every rank (a call failed half-enqueued: the handshake
  // sequence the ranks share is broken): later calls here fail with `reason`, the peers' waits
  // are released by the abort word and their calls fail too.
  void poison(const std::string& reason) {
    abort_reason = reason;
    __atomic_store_n(board->abort_word(), 1u, __ATOMIC_RELEASE);
  }
  // Remembers this call's description under its signature in the host board (for mismatch
  // messages on any rank). Formats it only for a signature the board has not logged recently.
  void record_call(uint32_t signature, const CallDescriptor& call) {
    if (!board->recorded_recently(signature)) board->record_call(signature, describe_call(call));
  }
};

// A call's enqueues on `stream`, from before the first to after the last (the device current):
// orders the call after the communicator's previous one, whatever stream that took
// (call_order.hpp), holds the communicator for a graph that captures it (graph_references.hpp),
// and records the call's end where the order needs it. Every call path opens one.
//
// A user kernel's call (begin_user_call) enqueues its last work after the scope closed: the user
// launches the kernel once begin_user_call returned. leave_end_open() keeps the scope from
// recording an end that would precede the kernel; the call's end then stays unrecorded, and the
// next call on another stream waits for what this stream holds at that moment (call_order.hpp),
// the kernel included. end_user_call() records the end after the launch (so later stream changes
// do not also wait for work queued behind the kernel); correctness never depends on it.
class EnqueueScope {
 public:
  EnqueueScope(CommunicatorState& st, cudaStream_t stream);
  ~EnqueueScope() {
    if (record_end_) st_.call_order->after_call(stream_, capture_);
  }
  EnqueueScope(const EnqueueScope&) = delete;
  EnqueueScope& operator=(const EnqueueScope&) = delete;
  void leave_end_open() { record_end_ = false; }

 private:
  CommunicatorState& st_;
  cudaStream_t stream_;
  unsigned long long capture_ = 0;
  bool record_end_ = true;
};

// The id of the capture `stream` is in, 0 when it is not capturing (throws when the capture was
// invalidated); when `graph` is given, the graph being captured.
unsigned long long capture_id_of(cudaStream_t stream, cudaGraph_t* graph = nullptr);

}  // namespace symmem::detail
