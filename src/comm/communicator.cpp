// Communicator lifetime: creation (devices, agreed settings, heap, host board, workspaces), buffers,
// the failure records that turn device timeouts and mismatches into errors on every rank, and
// collective teardown.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <exception>
#include <vector>

#include "board/wait_chain.hpp"
#include "comm/communicator_state.hpp"
#include "comm/node_agreement.hpp"
#include "comm/node_bootstrap.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "common/env.hpp"
#include "common/stream_capture.hpp"
#include "kernels/kernel_args.hpp"
#include "net/between_nodes.hpp"
#include "plan/capacity_failure.hpp"
#include "plan/shared_gpu.hpp"
#include "workspace/user_call_area.hpp"

namespace symmem {
namespace detail {
CommunicatorState& state_of(const Communicator& comm) { return *comm.state_; }
}  // namespace detail

namespace {

using detail::kMaxBlocks;
using detail::kSignalFlagCount;
using detail::state_of;

// Buffer layout inside its heap range: [data | signal pad | peer pointer table].
constexpr size_t kDataAlignment = 256;
constexpr size_t kPadBytes = kSignalFlagCount * sizeof(uint32_t);
size_t pad_offset(size_t bytes) { return (bytes + kDataAlignment - 1) / kDataAlignment * kDataAlignment; }
size_t table_offset(size_t bytes) { return pad_offset(bytes) + kPadBytes; }
size_t range_bytes(size_t bytes) { return table_offset(bytes) + kMaxWorld * sizeof(void*); }

struct DeviceIdentity {
  char uuid[16];
  int pid;
};

}  // namespace

void* Buffer::peer_ptr(int rank) const {
  const auto& impl = state_of(*comm_);
  if (rank < 0 || rank >= impl.world)
    throw Error(ErrorCode::kInvalidArgument,
                "peer_ptr: rank " + std::to_string(rank) + " is outside world " + std::to_string(impl.world));
  return impl.heap->base(rank) + offset_;
}

size_t Buffer::signal_pad_words() const { return kSignalFlagCount; }

Buffer::DeviceHandle Buffer::device_handle() const {
  const auto& impl = state_of(*comm_);
  DeviceHandle h{};
  h.local = local_;
  h.signal_pad = pad_;
  h.bytes = bytes_;
  h.signal_pad_words = kSignalFlagCount;
  h.rank = impl.rank;
  h.world = impl.world;
  for (int r = 0; r < impl.world; ++r) {
    h.peers[r] = impl.heap->base(r) + offset_;
    h.peer_signal_pads[r] = reinterpret_cast<uint32_t*>(impl.heap->base(r) + offset_ + pad_offset(bytes_));
  }
  return h;
}

bool Buffer::contains(const void* p, size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  const char* begin = static_cast<const char*>(local_);
  return c >= begin && bytes <= bytes_ && c - begin <= static_cast<ptrdiff_t>(bytes_ - bytes);
}

namespace detail {

CommunicatorState::CommunicatorState() = default;

CommunicatorState::~CommunicatorState() {
  // Local release only. Let this device finish what it was given first: every device wait has a
  // deadline and the copy-engine watchdog (still running here) releases its waits, so this ends.
  RelaxedCaptureMode relaxed;
  if (heap) SYMMEM_CUDA_CHECK_NOTHROW(cudaDeviceSynchronize());
  between_nodes.reset();
  copy_engine_watchdog.reset();
  copy_engine.reset();
  call_order.reset();
  workspaces.reset();
  buffers.clear();
  heap.reset();
  board.reset();
  if (epochs) SYMMEM_CUDA_CHECK_NOTHROW(cudaFree(epochs));
}

SyncArgs CommunicatorState::sync_args(uint32_t op, uint32_t signature) const {
  SyncArgs s = sync_template;
  s.op = op;
  s.signature = signature;
  return s;
}

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

void CommunicatorState::ensure_usable(const char* op) {
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
  for (int i = 0; i < 2000 && __atomic_load_n(board->abort_word(), __ATOMIC_ACQUIRE) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  // The root cause: this rank's own timeout or mismatch, else the first rank that recorded one.
  int who = -1;
  auto is_cause = [](uint32_t code) {
    return code == kStatusTimeout || code == kStatusMismatch || code == kStatusNetwork || code == kStatusCapacity ||
           code == kStatusRefused;
  };
  if (is_cause(own.code)) who = rank;
  for (int r = 0; r < world && who < 0; ++r)
    if (is_cause(__atomic_load_n(&board->page(r)->status.code, __ATOMIC_ACQUIRE))) who = r;
  if (who < 0) {
    // The abort word is set but the failing rank's record is not visible yet (or it died while
    // writing it): report what is known.
    abort_reason = "another rank aborted the communicator";
    throw Error(ErrorCode::kAborted, std::string(op) + ": " + abort_reason);
  }
  // Whom the awaited ranks waited for in turn (board/wait_chain.hpp). A live rank records its own
  // failure within a poll interval of the abort word, a dead one never does: wait that long, on
  // this error path only and once for the whole walk, for each record (code and signature both
  // set, whichever order its recorder wrote them in); then take what is there.
  const auto records_due = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  const int first = who;
  auto final_record = [&](int r) {
    const DeviceStatus& theirs = board->page(r)->status;
    auto recorded = [&] {
      return __atomic_load_n(&theirs.code, __ATOMIC_ACQUIRE) != kStatusOk &&
             __atomic_load_n(&theirs.signature, __ATOMIC_ACQUIRE) != 0;
    };
    while (r != first && !recorded() && std::chrono::steady_clock::now() < records_due)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    DeviceStatus copy{};
    if (__atomic_load_n(&theirs.code, __ATOMIC_ACQUIRE) != kStatusOk) std::memcpy(&copy, &theirs, sizeof(copy));
    return copy;
  };
  const FailureVerdict verdict = judge_failure(first, world, final_record);
  who = verdict.who;
  const DeviceStatus s = verdict.record;
  abort_reason = describe_failure(*this, who, s, verdict.waited_through);
  // A capacity verdict is every rank's own (the same matrix everywhere), and a refusal's message
  // names its rank already: every rank raises the same text, no rank failed "first".
  if (who != rank && s.code != kStatusCapacity && s.code != kStatusRefused)
    abort_reason = "rank " + std::to_string(job_rank(who)) + " failed first: " + abort_reason;
  throw Error(s.code == kStatusMismatch   ? ErrorCode::kMismatch
              : s.code == kStatusCapacity ? ErrorCode::kCapacity
              : s.code == kStatusRefused  ? refused_error_code(s)
                                          : ErrorCode::kTimeout,
              abort_reason);
}

unsigned long long capture_id_of(cudaStream_t stream, cudaGraph_t* graph) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long capture = 0;
  cudaGraph_t captured = nullptr;
  SYMMEM_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, &capture, &captured));
  if (status == cudaStreamCaptureStatusInvalidated)
    throw Error(ErrorCode::kInvalidArgument, "the stream's CUDA graph capture was invalidated by an earlier error");
  if (graph) *graph = captured;
  return status == cudaStreamCaptureStatusActive ? capture : 0;
}

EnqueueScope::EnqueueScope(CommunicatorState& st, cudaStream_t stream) : st_(st), stream_(stream) {
  cudaGraph_t graph = nullptr;
  capture_ = capture_id_of(stream, &graph);
  if (capture_) st.graphs.hold(graph, capture_);
  st.call_order->before_call(stream, capture_);
}

void CommunicatorState::require_one_node(const char* op) const {
  if (layout.spans_nodes())
    throw Error(ErrorCode::kUnsupported,
                std::string(op) + ": this communicator spans " + std::to_string(layout.nodes) + " nodes of " +
                    std::to_string(layout.local_world) + " GPUs, and symmem's " + op +
                    " runs inside one node; across nodes symmem offers all_gather (hierarchical): use NCCL for " + op +
                    ", or a communicator per node");
}

}  // namespace detail

Communicator::Communicator() : state_(std::make_unique<detail::CommunicatorState>()) {}
Communicator::~Communicator() = default;

int Communicator::rank() const { return state_->layout.rank; }
int Communicator::world() const { return state_->layout.world; }
int Communicator::local_rank() const { return state_->rank; }
int Communicator::local_world() const { return state_->world; }
int Communicator::nodes() const { return state_->layout.nodes; }
int Communicator::device() const { return state_->device; }
Bootstrap& Communicator::bootstrap() { return *state_->job_bootstrap; }
int64_t Communicator::timeout_ms() const { return state_->timeout_ms(); }
int Communicator::live_graphs() const { return state_->graphs.live(); }
bool Communicator::aborted() const {
  const auto& st = *state_;
  return !st.abort_reason.empty() || st.closed ||
         (st.board && (st.status_host()->code != 0 || *st.board->abort_word() != 0));
}

std::unique_ptr<Communicator> Communicator::create(std::shared_ptr<Bootstrap> bootstrap, int device,
                                                   const CommConfig& config) {
  if (!bootstrap) throw Error(ErrorCode::kInvalidArgument, "Communicator::create: no bootstrap");
  // Collective over the job: which ranks share a node (one NVLink domain, one heap).
  const detail::NodeLayout layout = detail::agree_on_layout(config.node_size, *bootstrap);
  const int world = layout.local_world;
  if (world > kMaxWorld)
    throw Error(ErrorCode::kUnsupported, "Communicator::create: " + std::to_string(world) +
                                             " ranks per node exceed the " + std::to_string(kMaxWorld) +
                                             " GPUs of one NVLink domain that symmem supports");
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0)
    throw Error(ErrorCode::kUnsupported,
                std::string("Communicator::create: no CUDA GPU is available (") + cudaGetErrorName(err) + ")");
  if (device < 0) SYMMEM_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= count)
    throw Error(ErrorCode::kInvalidArgument, "Communicator::create: device " + std::to_string(device) +
                                                 " does not exist (" + std::to_string(count) + " visible)");
  detail::DeviceGuard guard(device);
  SYMMEM_CUDA_CHECK(cudaFree(nullptr));  // create the primary context the driver calls use

  std::unique_ptr<Communicator> comm(new Communicator());
  detail::CommunicatorState& st = *comm->state_;
  st.owner = comm.get();
  st.layout = layout;
  st.job_bootstrap = std::move(bootstrap);
  st.bootstrap =
      layout.spans_nodes() ? std::make_shared<detail::NodeBootstrap>(st.job_bootstrap, layout) : st.job_bootstrap;
  st.device = device;
  st.rank = layout.local_rank;
  st.world = world;
  SYMMEM_CUDA_CHECK(cudaDeviceGetAttribute(&st.sm_count, cudaDevAttrMultiProcessorCount, device));

  // Two ranks on one GPU would silently serialise and break the heap's assumptions.
  cudaDeviceProp prop{};
  SYMMEM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  st.gpu_name = prop.name;
  std::vector<DeviceIdentity> ids(world);
  DeviceIdentity mine{};
  std::memcpy(mine.uuid, prop.uuid.bytes, sizeof(mine.uuid));
  st.bootstrap->all_gather(&mine, ids.data(), sizeof(DeviceIdentity));
  for (int r = 0; r < world; ++r)
    if (r != st.rank && std::memcmp(ids[r].uuid, mine.uuid, sizeof(mine.uuid)) == 0 && !env::ranks_may_share_gpu())
      throw Error(ErrorCode::kInvalidArgument, "Communicator::create: ranks " + std::to_string(st.job_rank(r)) +
                                                   " and " + std::to_string(layout.rank) + " use the same GPU");
  // Tests only (SYMMEM_TEST_SHARED_GPU): ranks on one GPU share its SMs (plan/shared_gpu.hpp). The
  // share comes from the most crowded GPU (every rank sees every identity), so that plans, which
  // depend on the SM count, agree on every rank.
  if (env::ranks_may_share_gpu()) {
    for (int r = 0; r < world; ++r) {
      int same = 0;
      for (int q = 0; q < world; ++q) same += std::memcmp(ids[r].uuid, ids[q].uuid, sizeof(mine.uuid)) == 0;
      st.ranks_on_gpu = std::max(st.ranks_on_gpu, same);
    }
    st.sm_count = detail::shared_gpu_sm_share(st.sm_count, st.ranks_on_gpu);
  }

  st.tuning = &detail::tuning_table_for(st.gpu_name);
  st.settings = detail::read_agreed_settings(config, *st.tuning);
  st.debug = env::debug();
  detail::agree_on_settings(st.settings, *st.job_bootstrap, layout.rank, layout.world);
  // Tests only: ranks sharing a GPU share its hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, at
  // most 32). A stream wait at the head of a queue holds every stream mapped to it, so eight ranks
  // with four copy-engine streams each (40 streams) put one rank's kernel behind another rank's wait
  // for it. One copy-engine stream each keeps every rank's streams on queues of their own. (Every
  // rank computes the same ranks_on_gpu, so the setting stays agreed.)
  if (st.ranks_on_gpu > 1) st.settings.copy_engine_streams = 1;

  // Per-block epochs (blocks < kMaxBlocks: every plan clamps to it), then the parity kernels'
  // call counter and its finished-block count, then the word a failing wait claims before it
  // writes the failure record.
  constexpr size_t kEpochWords = kMaxBlocks + 3;
  SYMMEM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&st.epochs), kEpochWords * sizeof(uint32_t)));
  SYMMEM_CUDA_CHECK(cudaMemset(st.epochs, 0, kEpochWords * sizeof(uint32_t)));

  st.exchange = std::make_unique<detail::FdExchange>(*st.bootstrap, st.timeout_ms());
  st.board = std::make_unique<detail::HostBoard>(st.rank, world, *st.bootstrap, *st.exchange);
  const size_t reserve = config.heap_reserve_bytes ? config.heap_reserve_bytes : env::heap_reserve_bytes();
  st.heap = std::make_unique<detail::Heap>(device, st.rank, world, reserve);
  st.workspaces = std::make_unique<detail::Workspaces>(*st.heap, *st.bootstrap, *st.exchange, st.rank, world,
                                                       st.settings.workspace_bytes);
  st.copy_engine = std::make_unique<detail::CopyEngineStreams>(
      device, st.settings.copy_engine_streams, st.settings.copy_engine_batch, st.settings.copy_engine_piece_bytes);
  st.copy_engine_watchdog = std::make_unique<detail::CopyEngineWatchdog>(*st.board, st.rank, world, st.timeout_ms());
  st.call_order = std::make_unique<detail::CallOrder>(device);
  if (layout.spans_nodes())
    st.between_nodes =
        std::make_unique<detail::BetweenNodes>(layout, *st.job_bootstrap, device, st.timeout_ms(), *st.board);

  detail::SyncArgs& s = st.sync_template;
  const detail::HeapArea* control = st.workspaces->control();
  s.pad = static_cast<uint64_t*>(control->ptr());
  for (int r = 0; r < world; ++r) s.peer_pads[r] = static_cast<uint64_t*>(control->peer_ptr(r));
  s.epochs = st.epochs;
  s.call_counter = st.epochs + kMaxBlocks;
  s.failure_claim = st.epochs + kMaxBlocks + 2;
  s.status = &st.board->device_page(st.rank)->status;
  s.abort = st.board->device_abort_word();
  s.timeout_ns = static_cast<uint64_t>(st.timeout_ms()) * 1000000ull;
  s.rank = st.rank;
  s.world = world;
  st.user_sync = detail::user_sync_template(*st.workspaces->user_calls(), s);
  return comm;
}

Buffer* Communicator::allocate(size_t bytes) {
  detail::CommunicatorState& st = *state_;
  st.ensure_usable("allocate");
  detail::DeviceGuard guard(st.device);
  std::vector<uint64_t> sizes(st.world);
  const uint64_t mine = bytes;
  st.bootstrap->all_gather(&mine, sizes.data(), sizeof(uint64_t));
  for (int r = 0; r < st.world; ++r)
    if (sizes[r] != mine)
      throw Error(ErrorCode::kInvalidArgument, "allocate: rank " + std::to_string(st.job_rank(r)) + " asked for " +
                                                   std::to_string(sizes[r]) + " bytes, rank " +
                                                   std::to_string(st.layout.rank) + " for " + std::to_string(mine));
  const size_t offset = st.heap->allocate(range_bytes(bytes), *st.bootstrap, *st.exchange);
  std::unique_ptr<Buffer> buffer(new Buffer());
  buffer->comm_ = this;
  buffer->offset_ = offset;
  buffer->bytes_ = bytes;
  buffer->local_ = st.heap->base(st.rank) + offset;
  buffer->pad_ = reinterpret_cast<uint32_t*>(st.heap->base(st.rank) + offset + pad_offset(bytes));
  void* table[kMaxWorld] = {};
  for (int r = 0; r < st.world; ++r) table[r] = st.heap->base(r) + offset;
  char* table_ptr = st.heap->base(st.rank) + offset + table_offset(bytes);
  SYMMEM_CUDA_CHECK(cudaMemcpy(table_ptr, table, sizeof(table), cudaMemcpyHostToDevice));
  buffer->peer_table_ = reinterpret_cast<void* const*>(table_ptr);
  st.buffers.push_back(std::move(buffer));
  return st.buffers.back().get();
}

void Communicator::free(Buffer* buffer) {
  detail::CommunicatorState& st = *state_;
  if (!buffer) return;
  detail::DeviceGuard guard(st.device);
  auto it = st.buffers.begin();
  while (it != st.buffers.end() && it->get() != buffer) ++it;
  if (it == st.buffers.end())
    throw Error(ErrorCode::kInvalidArgument, "free: the buffer does not belong to this communicator");
  // No peer may still read or write it: finish local work, then wait for every rank.
  SYMMEM_CUDA_CHECK(cudaDeviceSynchronize());
  st.bootstrap->barrier();
  st.heap->release(buffer->offset_);
  st.buffers.erase(it);
}

Buffer* Communicator::import(void* ptr, size_t bytes) {
  detail::CommunicatorState& st = *state_;
  st.ensure_usable("import");
  detail::DeviceGuard guard(st.device);
  std::vector<uint64_t> sizes(st.world);
  const uint64_t mine = bytes;
  st.bootstrap->all_gather(&mine, sizes.data(), sizeof(uint64_t));
  for (int r = 0; r < st.world; ++r)
    if (sizes[r] != mine)
      throw Error(ErrorCode::kInvalidArgument, "import: rank " + std::to_string(st.job_rank(r)) + " imports " +
                                                   std::to_string(sizes[r]) + " bytes, rank " +
                                                   std::to_string(st.layout.rank) + " " + std::to_string(mine));
  size_t delta = 0;
  const size_t offset = st.heap->import(ptr, bytes, *st.bootstrap, *st.exchange, &delta);
  std::unique_ptr<Buffer> buffer(new Buffer());
  buffer->comm_ = this;
  buffer->offset_ = offset + delta;
  buffer->bytes_ = bytes;
  buffer->local_ = st.heap->base(st.rank) + offset + delta;
  st.buffers.push_back(std::move(buffer));
  return st.buffers.back().get();
}

void Communicator::release_import(Buffer* buffer) {
  detail::CommunicatorState& st = *state_;
  if (!buffer) return;
  detail::DeviceGuard guard(st.device);
  detail::RelaxedCaptureMode relaxed;
  auto it = st.buffers.begin();
  while (it != st.buffers.end() && it->get() != buffer) ++it;
  if (it == st.buffers.end())
    throw Error(ErrorCode::kInvalidArgument, "release_import: the buffer does not belong to this communicator");
  SYMMEM_CUDA_CHECK(cudaDeviceSynchronize());  // this rank's kernels are done with it
  st.heap->release(buffer->offset_);
  st.buffers.erase(it);
}

Buffer* Communicator::find(const void* p, size_t bytes) const {
  for (const auto& b : state_->buffers)
    if (b->contains(p, bytes)) return b.get();
  return nullptr;
}

void Communicator::barrier(cudaStream_t stream) {
  state_->ensure_usable("barrier");
  state_->require_one_node("barrier");
  detail::DeviceGuard guard(state_->device);
  detail::EnqueueScope enqueue(*state_, stream);
  const uint32_t signature = 0x8a11u;  // every barrier is the same call
  state_->board->record_call(signature, "barrier()");
  detail::launch_barrier(state_->sync_args(detail::kOpBarrier, signature), stream);
}

void Communicator::check() const { state_->ensure_usable("check"); }

void Communicator::synchronize(cudaStream_t stream) const {
  detail::DeviceGuard guard(state_->device);
  SYMMEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  state_->ensure_usable("synchronize");
}

void Communicator::close() {
  detail::CommunicatorState& st = *state_;
  if (st.closed) return;
  detail::DeviceGuard guard(st.device);
  detail::RelaxedCaptureMode relaxed;
  // Release locally even when a peer is gone (the barrier then fails), and report that after.
  std::exception_ptr failure;
  try {
    SYMMEM_CUDA_CHECK(cudaDeviceSynchronize());
    st.bootstrap->barrier();  // every rank is done with every buffer
    if (st.between_nodes) st.between_nodes->close();
  } catch (...) {
    failure = std::current_exception();
  }
  st.between_nodes.reset();
  st.copy_engine_watchdog.reset();
  st.copy_engine.reset();
  st.workspaces.reset();
  st.buffers.clear();
  st.heap.reset();
  st.closed = true;
  if (failure) std::rethrow_exception(failure);
}

}  // namespace symmem
