// Communicator lifetime: creation (devices, heap, control buffers), buffers, the status word that
// turns device timeouts into errors, and collective teardown.
#include <cuda_runtime_api.h>

#include <cstring>
#include <exception>
#include <vector>

#include "collectives/copy_engine_state.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "common/env.hpp"
#include "heap/communicator_impl.hpp"
#include "kernels/kernel_args.hpp"

namespace symmem {
namespace {

using detail::kMaxBlocks;
using detail::kSignalFlagCount;

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
  const auto& impl = comm_->impl();
  if (rank < 0 || rank >= impl.world)
    throw Error(ErrorCode::kInvalidArgument,
                "peer_ptr: rank " + std::to_string(rank) + " is outside world " + std::to_string(impl.world));
  return impl.heap->base(rank) + offset_;
}

size_t Buffer::signal_pad_words() const { return kSignalFlagCount; }

Buffer::DeviceHandle Buffer::device_handle() const {
  const auto& impl = comm_->impl();
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

Communicator::Impl::Impl() = default;

Communicator::Impl::~Impl() {
  copy_engine.reset();
  buffers.clear();
  heap.reset();
  if (epochs) SYMMEM_CUDA_CHECK_NOTHROW(cudaFree(epochs));
  if (status_host) SYMMEM_CUDA_CHECK_NOTHROW(cudaFreeHost(status_host));
}

detail::SyncArgs Communicator::Impl::sync_args(uint32_t op) const {
  detail::SyncArgs s = sync_template;
  s.op = op;
  return s;
}

void Communicator::Impl::ensure_usable(const char* op) {
  if (closed) throw Error(ErrorCode::kAborted, std::string(op) + ": the communicator was closed");
  if (!abort_reason.empty())
    throw Error(ErrorCode::kAborted,
                std::string(op) + ": communicator unusable after an earlier failure: " + abort_reason);
  if (__atomic_load_n(&status_host->code, __ATOMIC_ACQUIRE) != 0) {
    const detail::DeviceStatus& s = *status_host;
    abort_reason = std::string(detail::op_code_name(s.op)) + ": rank " + std::to_string(s.rank) + " timed out after " +
                   std::to_string(timeout_ms) + " ms waiting for rank " + std::to_string(s.peer) + " (block " +
                   std::to_string(s.block) + ", phase " + std::to_string(s.phase) + "); rank " +
                   std::to_string(s.peer) + " is dead, stalled, or called a different collective";
    throw Error(ErrorCode::kTimeout, abort_reason);
  }
}

Buffer* Communicator::Impl::scratch_of(size_t bytes, cudaStream_t stream, const char* op) {
  return grown(scratch, bytes, stream, op, "staging buffer",
               ", or place the buffers in the symmetric heap (Communicator::allocate)");
}

Buffer* Communicator::Impl::receive_area_of(size_t bytes, cudaStream_t stream, const char* op) {
  return grown(receive_area, bytes, stream, op, "receive area", "");
}

Buffer* Communicator::Impl::grown(Buffer*& buffer, size_t bytes, cudaStream_t stream, const char* op, const char* what,
                                  const char* advice) {
  if (buffer && buffer->size() >= bytes) return buffer;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  SYMMEM_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone)
    throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": needs a " + std::to_string(bytes) + "-byte " + what +
                                                 " while the stream is being captured; run the same call once "
                                                 "before capture" +
                                                 advice);
  // Growth is collective: every rank makes the same call with the same sizes, so all grow here.
  SYMMEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (buffer) owner->free(buffer);
  buffer = nullptr;
  size_t size = size_t(1) << 20;
  while (size < bytes) size <<= 1;
  buffer = owner->allocate(size);
  return buffer;
}

Communicator::Communicator() : impl_(std::make_unique<Impl>()) {}
Communicator::~Communicator() = default;

int Communicator::rank() const { return impl_->rank; }
int Communicator::world() const { return impl_->world; }
int Communicator::device() const { return impl_->device; }
Bootstrap& Communicator::bootstrap() { return *impl_->bootstrap; }
int64_t Communicator::timeout_ms() const { return impl_->timeout_ms; }
bool Communicator::aborted() const { return !impl_->abort_reason.empty() || impl_->status_host->code != 0; }

std::unique_ptr<Communicator> Communicator::create(std::shared_ptr<Bootstrap> bootstrap, int device,
                                                   const CommConfig& config) {
  if (!bootstrap) throw Error(ErrorCode::kInvalidArgument, "Communicator::create: no bootstrap");
  const int world = bootstrap->world();
  if (world > kMaxWorld)
    throw Error(ErrorCode::kUnsupported, "Communicator::create: world " + std::to_string(world) + " exceeds the " +
                                             std::to_string(kMaxWorld) +
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
  Impl& impl = *comm->impl_;
  impl.owner = comm.get();
  impl.bootstrap = std::move(bootstrap);
  impl.device = device;
  impl.rank = impl.bootstrap->rank();
  impl.world = world;
  impl.timeout_ms = config.timeout_ms > 0 ? config.timeout_ms : env::timeout_ms();
  SYMMEM_CUDA_CHECK(cudaDeviceGetAttribute(&impl.sm_count, cudaDevAttrMultiProcessorCount, device));

  // Two ranks on one GPU would silently serialise and break the heap's assumptions.
  cudaDeviceProp prop{};
  SYMMEM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  impl.gpu_name = prop.name;
  std::vector<DeviceIdentity> ids(world);
  DeviceIdentity mine{};
  std::memcpy(mine.uuid, prop.uuid.bytes, sizeof(mine.uuid));
  impl.bootstrap->all_gather(&mine, ids.data(), sizeof(DeviceIdentity));
  for (int r = 0; r < world; ++r)
    if (r != impl.rank && std::memcmp(ids[r].uuid, mine.uuid, sizeof(mine.uuid)) == 0)
      throw Error(ErrorCode::kInvalidArgument, "Communicator::create: ranks " + std::to_string(r) + " and " +
                                                   std::to_string(impl.rank) + " use the same GPU");

  SYMMEM_CUDA_CHECK(
      cudaHostAlloc(reinterpret_cast<void**>(&impl.status_host), sizeof(detail::DeviceStatus), cudaHostAllocMapped));
  std::memset(impl.status_host, 0, sizeof(detail::DeviceStatus));
  SYMMEM_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&impl.status_device), impl.status_host, 0));
  // Per-block epochs, then the low-latency call counter and its finished-block count.
  SYMMEM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&impl.epochs), (kMaxBlocks + 2) * sizeof(uint32_t)));
  SYMMEM_CUDA_CHECK(cudaMemset(impl.epochs, 0, (kMaxBlocks + 2) * sizeof(uint32_t)));

  impl.exchange = std::make_unique<detail::FdExchange>(*impl.bootstrap, impl.timeout_ms);
  const size_t reserve = config.heap_reserve_bytes ? config.heap_reserve_bytes : env::heap_reserve_bytes();
  impl.heap = std::make_unique<detail::Heap>(device, impl.rank, world, reserve);
  impl.control = comm->allocate(0);
  impl.low_latency = comm->allocate(2 * kMaxWorld * (Impl::kLowLatencySlotBytes / 4) * sizeof(uint64_t));
  impl.copy_engine = std::make_unique<detail::CopyEngineState>(impl, comm->allocate(0));

  detail::SyncArgs& s = impl.sync_template;
  const Buffer::DeviceHandle h = impl.control->device_handle();
  s.pad = h.signal_pad;
  for (int r = 0; r < world; ++r) s.peer_pads[r] = h.peer_signal_pads[r];
  s.epochs = impl.epochs;
  s.call_counter = impl.epochs + kMaxBlocks;
  s.status = impl.status_device;
  s.timeout_ns = static_cast<uint64_t>(impl.timeout_ms) * 1000000ull;
  s.rank = impl.rank;
  s.world = world;
  const std::string forced = env::forced_algo();
  if (!forced.empty() && !parse_algo(forced, &impl.forced_algo))
    throw Error(ErrorCode::kInvalidArgument, "SYMMEM_ALGO='" + forced + "' names no algorithm");
  impl.forced_blocks = env::forced_blocks();
  impl.debug = env::debug();
  impl.check_args = env::check_args();
  impl.push_bulk = env::push_bulk();
  impl.tuning = &detail::tuning_table_for(impl.gpu_name);
  return comm;
}

Buffer* Communicator::allocate(size_t bytes) {
  Impl& impl = *impl_;
  impl.ensure_usable("allocate");
  detail::DeviceGuard guard(impl.device);
  std::vector<uint64_t> sizes(impl.world);
  const uint64_t mine = bytes;
  impl.bootstrap->all_gather(&mine, sizes.data(), sizeof(uint64_t));
  for (int r = 0; r < impl.world; ++r)
    if (sizes[r] != mine)
      throw Error(ErrorCode::kInvalidArgument, "allocate: rank " + std::to_string(r) + " asked for " +
                                                   std::to_string(sizes[r]) + " bytes, rank " +
                                                   std::to_string(impl.rank) + " for " + std::to_string(mine));
  const size_t offset = impl.heap->allocate(range_bytes(bytes), *impl.bootstrap, *impl.exchange);
  std::unique_ptr<Buffer> buffer(new Buffer());
  buffer->comm_ = this;
  buffer->offset_ = offset;
  buffer->bytes_ = bytes;
  buffer->local_ = impl.heap->base(impl.rank) + offset;
  buffer->pad_ = reinterpret_cast<uint32_t*>(impl.heap->base(impl.rank) + offset + pad_offset(bytes));
  void* table[kMaxWorld] = {};
  for (int r = 0; r < impl.world; ++r) table[r] = impl.heap->base(r) + offset;
  char* table_ptr = impl.heap->base(impl.rank) + offset + table_offset(bytes);
  SYMMEM_CUDA_CHECK(cudaMemcpy(table_ptr, table, sizeof(table), cudaMemcpyHostToDevice));
  buffer->peer_table_ = reinterpret_cast<void* const*>(table_ptr);
  impl.buffers.push_back(std::move(buffer));
  return impl.buffers.back().get();
}

void Communicator::free(Buffer* buffer) {
  Impl& impl = *impl_;
  if (!buffer) return;
  detail::DeviceGuard guard(impl.device);
  auto it = impl.buffers.begin();
  while (it != impl.buffers.end() && it->get() != buffer) ++it;
  if (it == impl.buffers.end())
    throw Error(ErrorCode::kInvalidArgument, "free: the buffer does not belong to this communicator");
  // No peer may still read or write it: finish local work, then wait for every rank.
  SYMMEM_CUDA_CHECK(cudaDeviceSynchronize());
  impl.bootstrap->barrier();
  impl.heap->release(buffer->offset_);
  if (impl.scratch == buffer) impl.scratch = nullptr;
  if (impl.receive_area == buffer) impl.receive_area = nullptr;
  impl.buffers.erase(it);
}

Buffer* Communicator::find(const void* p, size_t bytes) const {
  for (const auto& b : impl_->buffers)
    if (b->contains(p, bytes)) return b.get();
  return nullptr;
}

void Communicator::barrier(cudaStream_t stream) {
  impl_->ensure_usable("barrier");
  detail::DeviceGuard guard(impl_->device);
  detail::launch_barrier(impl_->sync_args(detail::kOpBarrier), stream);
}

void Communicator::check() const { impl_->ensure_usable("check"); }

void Communicator::synchronize(cudaStream_t stream) const {
  detail::DeviceGuard guard(impl_->device);
  SYMMEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  impl_->ensure_usable("synchronize");
}

void Communicator::close() {
  Impl& impl = *impl_;
  if (impl.closed) return;
  detail::DeviceGuard guard(impl.device);
  // Release locally even when a peer is gone (the barrier then fails), and report that after.
  std::exception_ptr failure;
  try {
    SYMMEM_CUDA_CHECK(cudaDeviceSynchronize());
    impl.bootstrap->barrier();  // every rank is done with every buffer
  } catch (...) {
    failure = std::current_exception();
  }
  impl.copy_engine.reset();
  impl.buffers.clear();
  impl.heap.reset();
  impl.closed = true;
  if (failure) std::rethrow_exception(failure);
}

}  // namespace symmem
