#include "net/between_nodes.hpp"

#include <cuda.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "common/driver_api.hpp"
#include "common/stream_capture.hpp"
#include "device/device_types.hpp"
#include "net/nccl_library.hpp"

namespace symmem::detail {
namespace {

using namespace std::chrono_literals;

constexpr uint32_t kStepIdle = 0;
constexpr uint32_t kStepEntered = 1;  // written by the stream before an NCCL step
constexpr uint32_t kStepPassed = 2;   // written by the stream after it
constexpr uint32_t kStepWatched = 3;  // written by the watchdog over a 1
constexpr auto kPollStep = 1ms;       // a step is in progress
constexpr auto kPollIdle = 5ms;
constexpr auto kSettlePoll = 200us;

}  // namespace

BetweenNodes::BetweenNodes(const NodeLayout& layout, Bootstrap& job, int device, int64_t timeout_ms,
                           const HostBoard& board)
    : layout_(layout),
      device_(device),
      timeout_(std::chrono::milliseconds(std::max<int64_t>(1, timeout_ms))),
      page_(board.page(layout.local_rank)),
      abort_word_(board.abort_word()),
      device_page_(board.device_page(layout.local_rank)) {
  const NcclLibrary& nccl = NcclLibrary::get();
  DeviceGuard guard(device);
  // The column's NCCL id comes from its rank on node 0; every rank publishes what it has.
  ncclUniqueId mine{};
  if (layout.node == 0) {
    const ncclResult_t r = nccl.get_unique_id(&mine);
    if (r != ncclSuccess)
      throw Error(ErrorCode::kBootstrap,
                  "hierarchical communicator: ncclGetUniqueId failed: " + std::string(nccl.get_error_string(r)));
  }
  std::vector<ncclUniqueId> ids(layout.world);
  job.all_gather(&mine, ids.data(), sizeof(ncclUniqueId));
  const ncclUniqueId& id = ids[layout.global_rank(0, layout.local_rank)];
  try {
    SYMMEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    SYMMEM_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    for (cudaEvent_t& e : pieces_) SYMMEM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // every NCCL call returns at once; settle() bounds the wait
    std::lock_guard<std::mutex> lock(mutex_);
    settle(nccl.comm_init_rank_config(&comm_, layout.nodes, id, layout.node, &config),
           "creating the NCCL communicator between nodes");
    connect_eagerly();
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      abort_nccl();
    }
    for (cudaEvent_t e : pieces_)
      if (e) SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(e));
    if (fork_) SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(fork_));
    if (stream_) SYMMEM_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
    throw;
  }
  watchdog_.start([this](Clock::time_point now) { return poll(now); });
}

BetweenNodes::~BetweenNodes() {
  watchdog_.stop();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    abort_nccl();  // a no-op after close()
  }
  DeviceGuard guard(device_);
  for (cudaEvent_t e : pieces_)
    if (e) SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(e));
  if (fork_) SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(fork_));
  if (stream_) SYMMEM_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
}

void BetweenNodes::connect_eagerly() {
  // NCCL connects peers lazily, inside the group end of their first transfer, which settle()
  // would time from the host call: a node whose host reaches its first all-gather a deadline
  // later would fail the others. Connecting here, under the creation deadline every rank is in,
  // makes later steps wait only for data. Both kinds: the all-gather ring and send/recv.
  const NcclLibrary& nccl = NcclLibrary::get();
  const size_t slot = 16;
  void* scratch = nullptr;
  SYMMEM_CUDA_CHECK(cudaMalloc(&scratch, slot * (layout_.nodes + 1)));
  char* bytes = static_cast<char*>(scratch);
  try {
    settle(nccl.all_gather(bytes, bytes + slot, 1, ncclUint8, comm_, stream_), "connecting the nodes (all-gather)");
    ncclResult_t result = nccl.group_start();
    for (int k = 1; k < layout_.nodes && result == ncclSuccess; ++k) {
      const int to = (layout_.node + k) % layout_.nodes, from = (layout_.node - k + layout_.nodes) % layout_.nodes;
      result = nccl.send(bytes, slot, ncclUint8, to, comm_, stream_);
      if (result == ncclSuccess) result = nccl.recv(bytes + slot * k, slot, ncclUint8, from, comm_, stream_);
    }
    const ncclResult_t end = nccl.group_end();
    settle(result == ncclSuccess ? end : result, "connecting the nodes (send/recv)");
    const auto deadline = Clock::now() + timeout_;
    cudaError_t done = cudaErrorNotReady;
    while ((done = cudaStreamQuery(stream_)) == cudaErrorNotReady) {
      if (Clock::now() > deadline) {
        abort_nccl();
        throw Error(ErrorCode::kTimeout, "creating the communicator between nodes: the first exchange with " +
                                             column_ranks() + " did not finish within the deadline");
      }
      std::this_thread::sleep_for(kSettlePoll);
    }
    SYMMEM_CUDA_CHECK(done);
  } catch (...) {
    // NCCL may still hold the scratch (its abort runs on a thread of its own): leak these bytes
    // rather than wait here.
    throw;
  }
  SYMMEM_CUDA_CHECK(cudaFree(scratch));
}

void BetweenNodes::fork_from(cudaStream_t caller) {
  SYMMEM_CUDA_CHECK(cudaEventRecord(fork_, caller));
  SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(stream_, fork_, 0));
}

void BetweenNodes::join_piece(int index, cudaStream_t caller) {
  SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(caller, pieces_[index], 0));
}

void BetweenNodes::join_all(cudaStream_t caller) noexcept {
  // fork_ was last waited on when the call forked: recording it again is safe.
  SYMMEM_CUDA_CHECK_NOTHROW(cudaEventRecord(fork_, stream_));
  SYMMEM_CUDA_CHECK_NOTHROW(cudaStreamWaitEvent(caller, fork_, 0));
}

void BetweenNodes::mark(uint32_t state, uint32_t piece, uint32_t signature) {
  // Default writes: each is fenced, so the watchdog that reads the 1 reads this step's piece and
  // signature, and the 2 follows the NCCL kernels' completion.
  CUstreamBatchMemOpParams ops[3] = {};
  unsigned count = 0;
  auto write = [&](const uint32_t* address, uint32_t value) { ops[count++] = stream_write_op(address, value); };
  if (state == kStepEntered) {
    write(&device_page_->net_piece, piece);
    write(&device_page_->net_signature, signature);
  }
  write(&device_page_->net_wait_state, state);
  SYMMEM_CU_CHECK(DriverApi::get().stream_batch_mem_op(stream_, count, ops, 0));
}

void BetweenNodes::settle(ncclResult_t result, const char* what) {
  const NcclLibrary& nccl = NcclLibrary::get();
  const auto deadline = Clock::now() + timeout_;
  while (result == ncclInProgress && comm_ != nullptr) {
    if (Clock::now() > deadline) {
      const std::string text = std::string(what) + ": NCCL did not finish within " +
                               std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout_).count()) +
                               " ms (" + column_ranks() + ")";
      fail(kStatusTimeout, -1, load_word(&page_->net_piece), load_word(&page_->net_signature), text);
      abort_nccl();
      throw Error(ErrorCode::kTimeout, text);
    }
    std::this_thread::sleep_for(kSettlePoll);
    if (nccl.comm_get_async_error(comm_, &result) != ncclSuccess) break;
  }
  if (result == ncclSuccess) return;
  const std::string text = std::string(what) + ": " + nccl_error_text(result, comm_) + " (" + column_ranks() + ")";
  fail(kStatusNetwork, -1, load_word(&page_->net_piece), load_word(&page_->net_signature), text);
  abort_nccl();
  throw Error(ErrorCode::kTimeout, text);
}

template <typename Enqueue>
void BetweenNodes::step(int index, uint32_t signature, Enqueue&& enqueue) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (nccl_aborted_)
    throw Error(ErrorCode::kAborted,
                "all_gather(hierarchical): NCCL between nodes was aborted after a failure: " + failure_text());
  DeviceGuard guard(device_);
  const NcclLibrary& nccl = NcclLibrary::get();
  if (stream_is_capturing(stream_)) captured_.store(true);
  mark(kStepEntered, static_cast<uint32_t>(index), signature);
  ncclResult_t result = nccl.group_start();
  if (result == ncclSuccess) {
    enqueue(nccl, result);
    const ncclResult_t end = nccl.group_end();  // always closes the group opened above
    if (result == ncclSuccess) result = end;
  }
  try {
    settle(result, "all_gather(hierarchical) between nodes");
  } catch (...) {
    // Close the step on the stream anyway (the watchdog then sees it end, and the caller's stream
    // can still join the piece): the communicator has failed and NCCL is aborted.
    mark(kStepPassed, static_cast<uint32_t>(index), signature);
    cudaEventRecord(pieces_[index], stream_);
    throw;
  }
  mark(kStepPassed, static_cast<uint32_t>(index), signature);
  SYMMEM_CUDA_CHECK(cudaEventRecord(pieces_[index], stream_));
}

void BetweenNodes::exchange(const HierPiece& piece, int index, const void* in, void* out, uint32_t signature) {
  step(index, signature, [&](const NcclLibrary& nccl, ncclResult_t& result) {
    for (const HierTransfer& t : piece.sends)
      if (result == ncclSuccess)
        result = nccl.send(static_cast<const char*>(in) + t.offset, t.bytes, ncclUint8, t.node, comm_, stream_);
    for (const HierTransfer& t : piece.receives)
      if (result == ncclSuccess)
        result = nccl.recv(static_cast<char*>(out) + t.offset, t.bytes, ncclUint8, t.node, comm_, stream_);
  });
}

void BetweenNodes::all_gather(const void* in, void* out, size_t bytes, uint32_t signature) {
  step(0, signature, [&](const NcclLibrary& nccl, ncclResult_t& result) {
    result = nccl.all_gather(in, out, bytes, ncclUint8, comm_, stream_);
  });
}

std::string BetweenNodes::failure_text() const {
  const char* text = page_->net_failure;
  return std::string(text, strnlen(text, sizeof(page_->net_failure)));
}

void BetweenNodes::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!comm_ || nccl_aborted_) return;
  DeviceGuard guard(device_);
  const NcclLibrary& nccl = NcclLibrary::get();
  settle(nccl.comm_finalize(comm_), "closing the NCCL communicator between nodes");
  release_detached(comm_, /*abort=*/false);  // destroy waits for live graphs: see release_detached
  comm_ = nullptr;
}

std::string BetweenNodes::column_ranks() const {
  std::string s = "peers of local rank " + std::to_string(layout_.local_rank) + " on the other nodes:";
  for (int m = 0; m < layout_.nodes; ++m)
    if (m != layout_.node)
      s += " rank " + std::to_string(layout_.global_rank(m, layout_.local_rank)) + " (node " + std::to_string(m) + ")";
  return s;
}

void BetweenNodes::fail(uint32_t code, int peer, uint32_t piece, uint32_t signature, const std::string& text) noexcept {
  if (peer < 0 && layout_.nodes == 2) peer = layout_.global_rank(1 - layout_.node, layout_.local_rank);
  record_failure(page_, abort_word_,
                 {code, kOpBetweenNodes, layout_.local_rank, peer, -1, static_cast<int32_t>(piece), signature, 0},
                 text.c_str());
}

void BetweenNodes::abort_nccl() noexcept {
  if (!comm_ || nccl_aborted_) return;
  release_detached(comm_, /*abort=*/true);
  nccl_aborted_ = true;
  comm_ = nullptr;
}

void BetweenNodes::release_detached(ncclComm_t comm, bool abort) noexcept {
  // ncclCommAbort sets NCCL's abort flag first (its kernels return, so the stream and what waits
  // on its events drain), then, like ncclCommDestroy, waits until every CUDA graph that captured
  // the communicator's work is destroyed. A graph the caller still holds would make that wait, in
  // this thread, a hang (a destructor, close(), or the watchdog holding mutex_). So once a step was
  // captured the release runs on a thread of its own that nobody joins; it ends when the last such
  // graph dies. Without captures there is nothing to wait for: release here, so that nothing of
  // NCCL's still runs when the process exits.
  if (!captured_.load()) {
    DeviceGuard guard(device_);
    const NcclLibrary& nccl = NcclLibrary::get();
    if (abort)
      nccl.comm_abort(comm);
    else
      nccl.comm_destroy(comm);
    return;
  }
  try {
    std::thread([comm, abort, device = device_] {
      cudaSetDevice(device);
      const NcclLibrary& nccl = NcclLibrary::get();
      if (abort)
        nccl.comm_abort(comm);
      else
        nccl.comm_destroy(comm);
    }).detach();
  } catch (const std::exception& e) {  // no thread: leak the communicator rather than hang
    log_warning(std::string("between nodes: could not start the thread releasing NCCL: ") + e.what());
  }
}

BetweenNodes::Clock::duration BetweenNodes::poll(Clock::time_point now) noexcept {
  // The state first: the stream writes piece and signature before its (fenced) 1, so fields read
  // after a 1 or 3 are that step's.
  uint32_t* state = &page_->net_wait_state;
  uint32_t seen = load_word(state);
  const uint32_t piece = load_word(&page_->net_piece);
  const uint32_t signature = load_word(&page_->net_signature);
  {
    // NCCL's verdict (thread-safe in NCCL); skipped while the calling thread is inside NCCL, which
    // bounds its own waits. A remote rank's death shows up here.
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (lock.owns_lock() && comm_ && !nccl_aborted_) {
      ncclResult_t async = ncclSuccess;
      NcclLibrary::get().comm_get_async_error(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        fail(kStatusNetwork, -1, piece, signature,
             "NCCL between nodes: " + nccl_error_text(async, comm_) + " (" + column_ranks() + ")");
        abort_nccl();
        return kPollStep;
      }
    }
    // Any failure on this node ends NCCL too: the remote ranks then learn it from their
    // connections instead of their deadline, and a blocked step drains.
    const bool aborted = load_word(abort_word_) != 0 || load_word(&page_->status.code) != kStatusOk;
    if (aborted && lock.owns_lock() && comm_ && !nccl_aborted_) {
      if (seen == kStepWatched) fail(kStatusAborted, -1, piece, signature, "");
      abort_nccl();
    }
  }
  if (seen == kStepEntered && swap_word(state, kStepEntered, kStepWatched)) {
    timing_ = true;  // the stream reached a step since the last look: the clock starts now
    since_ = now;
    return kPollStep;
  }
  if (seen == kStepPassed) swap_word(state, kStepPassed, kStepIdle);
  if (seen != kStepWatched) {
    timing_ = false;
    return seen == kStepEntered ? Clock::duration(kPollStep) : Clock::duration(kPollIdle);
  }
  if (!timing_) {  // cannot happen (this thread wrote the 3); start the clock rather than trust it
    timing_ = true;
    since_ = now;
  }
  if (now - since_ > timeout_) {
    fail(kStatusTimeout, -1, piece, signature,
         "an NCCL step between nodes did not finish within " +
             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(timeout_).count()) + " ms (" +
             column_ranks() + ")");
    std::lock_guard<std::mutex> lock(mutex_);
    abort_nccl();
  }
  return kPollStep;
}

}  // namespace symmem::detail
