// A communicator's symmetric buffers: allocated (collective, the same offset in every rank's heap)
// or imported (a registered allocation mapped into every peer), found by address, released.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator_state.hpp"
#include "common/check.hpp"
#include "common/device_guard.hpp"
#include "common/stream_capture.hpp"

namespace symmem {
namespace {

using detail::kSignalFlagCount;
using detail::state_of;

// Buffer layout inside its heap range: [data | signal pad | peer pointer table].
constexpr size_t kDataAlignment = 256;
constexpr size_t kPadBytes = kSignalFlagCount * sizeof(uint32_t);
size_t pad_offset(size_t bytes) { return (bytes + kDataAlignment - 1) / kDataAlignment * kDataAlignment; }
size_t table_offset(size_t bytes) { return pad_offset(bytes) + kPadBytes; }
size_t range_bytes(size_t bytes) { return table_offset(bytes) + kMaxWorld * sizeof(void*); }

// Collective: every rank must ask for the same size, or all fail naming two that differ:
// "<op>: rank R <asked> N bytes, rank Q<ours>M".
void agree_on_bytes(detail::CommunicatorState& st, size_t bytes, const char* op, const char* asked, const char* ours) {
  std::vector<uint64_t> sizes(st.world);
  const uint64_t mine = bytes;
  st.bootstrap->all_gather(&mine, sizes.data(), sizeof(uint64_t));
  for (int r = 0; r < st.world; ++r)
    if (sizes[r] != mine)
      throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": rank " + std::to_string(st.job_rank(r)) + " " +
                                                   asked + " " + std::to_string(sizes[r]) + " bytes, rank " +
                                                   std::to_string(st.layout.rank) + ours + std::to_string(mine));
}

// Where `buffer` is in the communicator's list; throws when it is not there.
std::vector<std::unique_ptr<Buffer>>::iterator owned(detail::CommunicatorState& st, const Buffer* buffer,
                                                     const char* op) {
  auto it = st.buffers.begin();
  while (it != st.buffers.end() && it->get() != buffer) ++it;
  if (it == st.buffers.end())
    throw Error(ErrorCode::kInvalidArgument, std::string(op) + ": the buffer does not belong to this communicator");
  return it;
}

}  // namespace

void* Buffer::peer_ptr(int rank) const {
  const auto& impl = state_of(*comm_);
  if (rank < 0 || rank >= impl.world)
    throw Error(ErrorCode::kInvalidArgument,
                "peer_ptr: rank " + std::to_string(rank) + " is outside world " + std::to_string(impl.world));
  return impl.heap->base(rank) + offset_;
}

// An imported buffer (the program's own allocation) has no signal pad: what follows its bytes is
// the program's memory, or another heap range.
size_t Buffer::signal_pad_words() const { return pad_ ? kSignalFlagCount : 0; }

Buffer::DeviceHandle Buffer::device_handle() const {
  const auto& impl = state_of(*comm_);
  DeviceHandle h{};
  h.local = local_;
  h.signal_pad = pad_;
  h.bytes = bytes_;
  h.signal_pad_words = signal_pad_words();
  h.rank = impl.rank;
  h.world = impl.world;
  for (int r = 0; r < impl.world; ++r) {
    h.peers[r] = impl.heap->base(r) + offset_;
    h.peer_signal_pads[r] =
        pad_ ? reinterpret_cast<uint32_t*>(impl.heap->base(r) + offset_ + pad_offset(bytes_)) : nullptr;
  }
  return h;
}

bool Buffer::contains(const void* p, size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  const char* begin = static_cast<const char*>(local_);
  return c >= begin && bytes <= bytes_ && c - begin <= static_cast<ptrdiff_t>(bytes_ - bytes);
}

Buffer* Communicator::allocate(size_t bytes) {
  detail::CommunicatorState& st = *state_;
  st.ensure_usable("allocate");
  detail::DeviceGuard guard(st.device);
  agree_on_bytes(st, bytes, "allocate", "asked for", " for ");
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
  const auto it = owned(st, buffer, "free");
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
  agree_on_bytes(st, bytes, "import", "imports", " ");
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
  const auto it = owned(st, buffer, "release_import");
  SYMMEM_CUDA_CHECK(cudaDeviceSynchronize());  // this rank's kernels are done with it
  st.heap->release_local(buffer->offset_);
  st.buffers.erase(it);
}

Buffer* Communicator::find(const void* p, size_t bytes) const {
  for (const auto& b : state_->buffers)
    if (b->contains(p, bytes)) return b.get();
  return nullptr;
}

}  // namespace symmem
