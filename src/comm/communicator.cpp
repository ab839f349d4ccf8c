// Communicator lifetime: creation (devices, agreed settings, heap, host board, workspaces, the
// synchronisation arguments of every kernel), the enqueue scope of every call, and collective
// teardown. Its buffers are in buffers.cpp, the errors its failure records become in
// failure_report.cpp, the settings its ranks agree on in agreed_settings.cpp.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <vector>

#include "comm/communicator_state.hpp"
#include "comm/node_agreement.hpp"
#include "comm/node_bootstrap.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "common/env.hpp"
#include "common/stream_capture.hpp"
#include "kernels/kernel_args.hpp"
#include "net/between_nodes.hpp"
#include "plan/shared_gpu.hpp"
#include "workspace/user_call_area.hpp"

namespace symmem {
namespace detail {
CommunicatorState& state_of(const Communicator& comm) { return *comm.state_; }
}  // namespace detail

namespace {

using detail::kMaxBlocks;

struct DeviceIdentity {
  char uuid[16];
  int pid;
  int sm_count;
};

}  // namespace

namespace detail {

CommunicatorState::CommunicatorState() = default;

CommunicatorState::~CommunicatorState() {
  // Local release only, on this communicator's device (the last owner may be a thread on another,
  // such as one that drives several GPUs' communicators). Let the device finish what it was given
  // first: every device wait has a deadline and the copy-engine watchdog (still running here)
  // releases its waits, so this ends.
  int previous = device;
  const bool elsewhere = heap && (cudaGetDevice(&previous) != cudaSuccess || previous != device);
  const bool switched = elsewhere && cudaSetDevice(device) == cudaSuccess;
  RelaxedCaptureMode relaxed;
  // Never another device's synchronisation (it could wait on another communicator's hung work).
  if (heap && (!elsewhere || switched)) SYMMEM_CUDA_CHECK_NOTHROW(cudaDeviceSynchronize());
  between_nodes.reset();
  copy_engine_watchdog.reset();
  copy_engine.reset();
  call_order.reset();
  workspaces.reset();
  buffers.clear();
  heap.reset();
  board.reset();
  if (epochs) SYMMEM_CUDA_CHECK_NOTHROW(cudaFree(epochs));
  if (switched) SYMMEM_CUDA_CHECK_NOTHROW(cudaSetDevice(previous));
}

SyncArgs CommunicatorState::sync_args(uint32_t op, uint32_t signature) const {
  SyncArgs s = sync_template;
  s.op = op;
  s.signature = signature;
  return s;
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
  mine.sm_count = st.sm_count;
  st.bootstrap->all_gather(&mine, ids.data(), sizeof(DeviceIdentity));
  // Plans depend on the SM count (block counts are signed into every call): the smallest of the
  // ranks' (a GPU partitioned by MPS or green contexts shows fewer), so that every rank plans alike.
  for (int r = 0; r < world; ++r) st.sm_count = std::min(st.sm_count, ids[r].sm_count);
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
  st.heap = std::make_unique<detail::Heap>(device, st.rank, world, st.settings.heap_reserve_bytes);
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
  s.failure = &st.board->device_page(st.rank)->status;
  s.abort = st.board->device_abort_word();
  s.timeout_ns = static_cast<uint64_t>(st.timeout_ms()) * 1000000ull;
  s.rank = st.rank;
  s.world = world;
  st.user_sync = detail::user_sync_template(*st.workspaces->user_calls(), s);
  return comm;
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
