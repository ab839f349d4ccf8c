// All-gather by the copy engines: zero SMs. See copy_engine_state.hpp for the handshake.
#include <cuda.h>

#include <algorithm>
#include <string>
#include <vector>

#include "collectives/all_gather_paths.hpp"
#include "collectives/copy_engine_state.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "common/driver_api.hpp"
#include "common/env.hpp"
#include "heap/communicator_impl.hpp"
#include "plan/plan.hpp"

namespace symmem::detail {
namespace {

constexpr auto kWatchdogPoll = std::chrono::microseconds(200);

CUdeviceptr dptr(void* p) { return reinterpret_cast<CUdeviceptr>(p); }

}  // namespace

CopyEngineState::CopyEngineState(Communicator::Impl& impl, Buffer* flags) : impl_(impl), flags_(flags) {
  streams_count_ = std::clamp(env::copy_engine_streams(), 1, kMaxStreams);
  const std::string direction = env::copy_engine_direction();
  if (direction != "push" && direction != "pull")
    throw Error(ErrorCode::kInvalidArgument, "SYMMEM_CE_DIRECTION='" + direction + "' is neither push nor pull");
  push_ = direction == "push";
  piece_bytes_ = std::max<size_t>(env::copy_engine_piece_bytes(), 4096);
  batch_ = env::copy_engine_batch();
  // Highest priority: the copies are short and the GEMMs they overlap should not delay them.
  int least = 0, greatest = 0;
  SYMMEM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  for (int i = 0; i < streams_count_; ++i)
    SYMMEM_CUDA_CHECK(cudaStreamCreateWithPriority(&streams_[i], cudaStreamNonBlocking, greatest));
  SYMMEM_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  for (int i = 0; i < streams_count_; ++i)
    SYMMEM_CUDA_CHECK(cudaEventCreateWithFlags(&joins_[i], cudaEventDisableTiming));
  SYMMEM_CUDA_CHECK(cudaStreamCreateWithFlags(&rescue_stream_, cudaStreamNonBlocking));
  SYMMEM_CUDA_CHECK(
      cudaHostAlloc(reinterpret_cast<void**>(&host_words_), 2 * kMaxWorld * sizeof(uint32_t), cudaHostAllocDefault));
  thread_ = std::thread([this] { watchdog_loop(); });
}

CopyEngineState::~CopyEngineState() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& w : queue_) SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(w.event));
  for (auto e : free_events_) SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(e));
  for (int i = 0; i < streams_count_; ++i) {
    SYMMEM_CUDA_CHECK_NOTHROW(cudaStreamDestroy(streams_[i]));
    SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(joins_[i]));
  }
  SYMMEM_CUDA_CHECK_NOTHROW(cudaEventDestroy(fork_));
  SYMMEM_CUDA_CHECK_NOTHROW(cudaStreamDestroy(rescue_stream_));
  SYMMEM_CUDA_CHECK_NOTHROW(cudaFreeHost(host_words_));
}

cudaEvent_t CopyEngineState::acquire_event() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  SYMMEM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void CopyEngineState::watch(cudaEvent_t event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({event, std::chrono::steady_clock::now() + std::chrono::milliseconds(impl_.timeout_ms)});
  }
  wake_.notify_one();
}

void CopyEngineState::watchdog_loop() {
  bool device_set = false;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    if (queue_.empty()) {
      wake_.wait_for(lock, std::chrono::milliseconds(50));
      continue;
    }
    Watched w = queue_.front();
    lock.unlock();
    if (!device_set) device_set = cudaSetDevice(impl_.device) == cudaSuccess;
    const cudaError_t state = cudaEventQuery(w.event);
    const bool expired = state == cudaErrorNotReady && std::chrono::steady_clock::now() > w.deadline;
    if (expired) expire(w.event);
    lock.lock();
    if (state != cudaErrorNotReady || expired) {
      queue_.pop_front();
      free_events_.push_back(w.event);
    } else {
      wake_.wait_for(lock, kWatchdogPoll);
    }
  }
}

void CopyEngineState::expire(cudaEvent_t) {
  // Which flags never came? Read this rank's ready/done words beside the stuck stream.
  const int world = impl_.world;
  const int rank = impl_.rank;
  uint32_t* pad = flags_->signal_pad();
  if (cudaMemcpyAsync(host_words_, pad, 2 * kMaxWorld * sizeof(uint32_t), cudaMemcpyDeviceToHost, rescue_stream_) !=
          cudaSuccess ||
      cudaStreamSynchronize(rescue_stream_) != cudaSuccess)
    return;
  bool any_ready = false, any_done = false;
  for (int p = 0; p < world; ++p) {
    if (p == rank) continue;
    any_ready |= host_words_[ready_slot(p)] != 0;
    any_done |= host_words_[done_slot(p)] != 0;
  }
  const bool in_done_phase = !any_ready && any_done;
  int missing = -1;
  for (int p = 0; p < world && missing < 0; ++p) {
    if (p == rank) continue;
    const uint32_t flag = host_words_[in_done_phase ? done_slot(p) : ready_slot(p)];
    if (flag == 0) missing = p;
  }
  DeviceStatus* status = impl_.status_host;
  uint32_t expected = 0;
  if (__atomic_compare_exchange_n(&status->code, &expected, 1u, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    status->op = kOpCopyEngine;
    status->rank = rank;
    status->peer = missing;
    status->block = -1;
    status->phase = in_done_phase ? 1 : 0;
  }
  // Release the stuck stream: the communicator is now unusable, so the flags' values no longer
  // matter, only that no wait stays blocked forever.
  for (int i = 0; i < 2 * kMaxWorld; ++i) host_words_[i] = 1;
  cudaMemcpyAsync(pad, host_words_, 2 * kMaxWorld * sizeof(uint32_t), cudaMemcpyHostToDevice, rescue_stream_);
  cudaStreamSynchronize(rescue_stream_);
}

void all_gather_copy_engine(Communicator::Impl& impl, void* out, const void* in, size_t bytes,
                            const void* const* in_peers, void* const* out_peers, bool copy_own, cudaStream_t stream) {
  if (!impl.copy_engine) {
    throw Error(ErrorCode::kInternal, "copy-engine state missing");
  }
  CopyEngineState& ce = *impl.copy_engine;
  const DriverApi& api = DriverApi::get();
  const int world = impl.world;
  const int rank = impl.rank;
  const Buffer::DeviceHandle flags = ce.flags()->device_handle();

  // One batch of stream memory operations per handshake, executed in order: tell every peer,
  // wait for every peer, then reset this rank's flags for the next call.
  auto handshake = [&](size_t (*slot)(int)) {
    CUstreamBatchMemOpParams ops[3 * kMaxWorld] = {};
    unsigned count = 0;
    for (int k = 1; k < world; ++k) {
      const int p = (rank + k) % world;
      ops[count].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
      ops[count].writeValue.address = dptr(flags.peer_signal_pads[p] + slot(rank));
      ops[count].writeValue.value = 1;
      ++count;
    }
    for (int k = 1; k < world; ++k) {
      const int p = (rank + k) % world;
      ops[count].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
      ops[count].waitValue.address = dptr(flags.signal_pad + slot(p));
      ops[count].waitValue.value = 1;
      ops[count].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
      ++count;
    }
    for (int k = 1; k < world; ++k) {
      const int p = (rank + k) % world;
      ops[count].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
      ops[count].writeValue.address = dptr(flags.signal_pad + slot(p));
      ops[count].writeValue.value = 0;
      ++count;
    }
    if (count) SYMMEM_CU_CHECK(api.stream_batch_mem_op(stream, count, ops, 0));
  };

  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SYMMEM_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  const bool capturing = capture != cudaStreamCaptureStatusNone;

  handshake(&CopyEngineState::ready_slot);
  // Invariant: every peer's input holds this call's data and its output may be overwritten.
  // Batched copies cannot be captured; a batch of one copy (two ranks) only adds the batch call's
  // cost (2 x H200, 1 MiB per rank: 27.3 us batched, 25.8 plain).
  const bool batchable = ce.batch() && !capturing;
  const auto pieces = plan_copy_engine(rank, world, bytes, batchable ? 1 : ce.streams(), ce.piece_bytes());
  const bool batch = batchable && pieces.size() > 1;
  // Push (local read, NVLink write) when every output is in the heap, else pull.
  const bool push = out_peers != nullptr;
  char* out_bytes = static_cast<char*>(out);
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  for (const auto& piece : pieces) {
    dsts.push_back(push ? static_cast<char*>(out_peers[piece.peer]) + rank * bytes + piece.offset
                        : out_bytes + piece.peer * bytes + piece.offset);
    srcs.push_back(push ? static_cast<const char*>(in) + piece.offset
                        : static_cast<const char*>(in_peers[piece.peer]) + piece.offset);
    sizes.push_back(piece.bytes);
  }
  // The peer copies fork onto side streams (one batch on the first, or one stream per piece)
  // and join back; the own slot's local copy runs meanwhile on the caller's stream. Inside one
  // batch the local copy delayed the NVLink copies (2 x H200, 64 MiB per rank: 287 GB/s batched
  // with it, 333 beside it; bench/results/h200/README.md).
  int used = 0;
  for (const auto& piece : pieces) used = std::max(used, batch ? 1 : piece.stream + 1);
  SYMMEM_CUDA_CHECK(cudaEventRecord(ce.fork_event(), stream));
  for (int s = 0; s < used; ++s) SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(ce.side_stream(s), ce.fork_event(), 0));
  if (batch) {
    // The driver spreads the copies of one batch over the copy engines.
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_index = 0;
    SYMMEM_CUDA_CHECK(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr, &attr_index, 1,
                                           ce.side_stream(0)));
  } else {
    for (size_t i = 0; i < pieces.size(); ++i)
      SYMMEM_CUDA_CHECK(
          cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDeviceToDevice, ce.side_stream(pieces[i].stream)));
  }
  if (copy_own)
    SYMMEM_CUDA_CHECK(cudaMemcpyAsync(out_bytes + rank * bytes, in, bytes, cudaMemcpyDeviceToDevice, stream));
  for (int s = 0; s < used; ++s) {
    SYMMEM_CUDA_CHECK(cudaEventRecord(ce.join_event(s), ce.side_stream(s)));
    SYMMEM_CUDA_CHECK(cudaStreamWaitEvent(stream, ce.join_event(s), 0));
  }
  handshake(&CopyEngineState::done_slot);
  // Invariant: no peer reads this rank's input any more, every peer's slot of my output arrived.

  if (!capturing) {
    cudaEvent_t done = ce.acquire_event();
    SYMMEM_CUDA_CHECK(cudaEventRecord(done, stream));
    ce.watch(done);
  }
}

}  // namespace symmem::detail
