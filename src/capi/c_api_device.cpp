// The C ABI for users' kernels on the heap (symmem_c.h, "Programming the heap"): buffer handles,
// the sync context and the signing of user calls, as integers for the Python package.
#include <algorithm>
#include <cstring>
#include <string>

#include "capi/c_api_comm.hpp"
#include "capi/c_api_guard.hpp"
#include "comm/communicator_state.hpp"
#include "symmem/all_gather_pieces.hpp"
#include "symmem/symmem_c.h"
#include "symmem/user_call.hpp"

namespace {

symmem::Communicator& communicator_of(symmem_comm* comm) {
  if (!comm || !comm->comm)
    throw symmem::Error(symmem::ErrorCode::kInvalidArgument, "no communicator (NULL or destroyed)");
  return *comm->comm;
}

uint64_t address(const void* p) { return reinterpret_cast<uint64_t>(p); }

// Copies `full` into the caller's struct, as much of it as the caller's struct_size says it holds.
template <typename T>
void fill(T* out, T full, const char* what) {
  if (!out) throw symmem::Error(symmem::ErrorCode::kInvalidArgument, std::string(what) + ": NULL result");
  const size_t size = std::min<size_t>(out->struct_size, sizeof(T));
  if (size < sizeof(uint64_t))
    throw symmem::Error(symmem::ErrorCode::kInvalidArgument, std::string(what) + ": struct_size is not set");
  full.struct_size = size;
  std::memcpy(out, &full, size);
}

// The layouts python/symmem/device.py declares with ctypes (tests/python/triton/test_device_api.py
// checks the same sizes there).
static_assert(sizeof(symmem_device_handle) == 192, "symmem_device_handle changed: update python/symmem/device.py");
static_assert(sizeof(symmem_sync_context) == 152, "symmem_sync_context changed: update python/symmem/device.py");
static_assert(sizeof(symmem_gathered_pieces) == 40, "symmem_gathered_pieces changed: update python/symmem/device.py");

}  // namespace

using symmem::detail::c_api_guard;

extern "C" {

int symmem_comm_local_rank(const symmem_comm* comm) { return comm && comm->comm ? comm->comm->local_rank() : -1; }
int symmem_comm_local_world(const symmem_comm* comm) { return comm && comm->comm ? comm->comm->local_world() : -1; }

int symmem_buffer_device_handle(symmem_comm* comm, const void* buffer, symmem_device_handle* out) {
  return c_api_guard([&] {
    symmem::Communicator& c = communicator_of(comm);
    const symmem::Buffer* b = c.find(buffer, 1);
    if (!b || b->ptr() != buffer)
      throw symmem::Error(symmem::ErrorCode::kInvalidArgument,
                          "symmem_buffer_device_handle: " + std::to_string(address(buffer)) +
                              " is not the start of a heap buffer of this communicator");
    const symmem::Buffer::DeviceHandle d = b->device_handle();
    symmem_device_handle h{};
    h.local = address(d.local);
    h.bytes = d.bytes;
    h.signal_pad = address(d.signal_pad);
    h.signal_pad_words = d.signal_pad_words;
    h.peer_table = address(b->peer_ptrs_device());
    h.heap_stride = symmem::detail::state_of(c).heap->stride();
    for (int r = 0; r < d.world; ++r) {
      h.peers[r] = address(d.peers[r]);
      h.peer_signal_pads[r] = address(d.peer_signal_pads[r]);
    }
    h.rank = d.rank;
    h.world = d.world;
    fill(out, h, "symmem_buffer_device_handle");
  });
}

int symmem_comm_sync_context(symmem_comm* comm, symmem_sync_context* out) {
  return c_api_guard([&] {
    symmem::Communicator& c = communicator_of(comm);
    const symmem::detail::CommunicatorState& st = symmem::detail::state_of(c);
    if (st.closed || !st.heap)
      throw symmem::Error(symmem::ErrorCode::kAborted, "symmem_comm_sync_context: the communicator was closed");
    const symmem::UserSync& s = st.user_sync;
    symmem_sync_context x{};
    x.flags = address(s.flags);
    for (int r = 0; r < s.world; ++r) x.peer_flags[r] = address(s.peer_flags[r]);
    x.epochs = address(s.epochs);
    x.failure_claim = address(s.failure_claim);
    x.failure = address(s.failure);
    x.abort_word = address(s.abort);
    x.timeout_ns = s.timeout_ns;
    x.heap_stride = st.heap->stride();
    x.rank = s.rank;
    x.world = s.world;
    x.phases = symmem::kUserPhases;
    x.max_blocks = symmem::kUserMaxBlocks;
    x.user_op = symmem::kUserCallOp;
    fill(out, x, "symmem_comm_sync_context");
  });
}

int symmem_comm_begin_user_call(symmem_comm* comm, const char* description, int blocks, void* stream,
                                uint32_t* signature) {
  return c_api_guard([&] {
    if (!description || !signature)
      throw symmem::Error(symmem::ErrorCode::kInvalidArgument, "symmem_comm_begin_user_call: NULL argument");
    *signature = symmem::begin_user_call(communicator_of(comm), description, blocks,
                                         static_cast<cudaStream_t>(stream))
                     .signature;
  });
}

int symmem_comm_end_user_call(symmem_comm* comm, void* stream) {
  return c_api_guard([&] { symmem::end_user_call(communicator_of(comm), static_cast<cudaStream_t>(stream)); });
}

uint32_t symmem_user_call_signature(const char* description, int blocks) {
  return symmem::user_call_signature(description ? description : "", blocks);
}

int symmem_all_gather_pieces(symmem_comm* comm, void* gathered, const void* shard, int64_t m, size_t row_bytes,
                             int tile_rows, void* stream, symmem_pieces_consumer_fn consume, void* context) {
  return c_api_guard([&] {
    symmem::Communicator& c = communicator_of(comm);
    // A failed check refuses the call (the peers raise it too instead of waiting in it).
    if (!consume)
      c.refuse_call("all_gather_pieces", symmem::ErrorCode::kInvalidArgument, "no consumer",
                    static_cast<cudaStream_t>(stream));
    const size_t bytes = m > 0 ? size_t(m) * row_bytes : 0;
    symmem::Buffer* buffer = c.find(gathered, bytes ? bytes : 1);
    if (!buffer)
      c.refuse_call("all_gather_pieces", symmem::ErrorCode::kInvalidArgument,
                    "gathered (" + std::to_string(bytes) + " bytes) is not inside one heap buffer of this communicator",
                    static_cast<cudaStream_t>(stream));
    const symmem::Operand operand(buffer, static_cast<size_t>(static_cast<char*>(gathered) -
                                                              static_cast<char*>(buffer->ptr())));
    symmem::all_gather_pieces(operand, shard, m, row_bytes, tile_rows, c, static_cast<cudaStream_t>(stream),
                              [&](const symmem::GatheredPieces& p) {
                                symmem_gathered_pieces out{};
                                out.struct_size = sizeof(out);
                                out.flags = address(p.flags);
                                out.pieces = p.pieces;
                                out.piece_rows = p.piece_rows;
                                out.shard_rows = p.shard_rows;
                                out.rank = p.rank;
                                out.world = p.world;
                                if (consume(context, &out) != 0)
                                  throw symmem::Error(symmem::ErrorCode::kInternal,
                                                      "symmem_all_gather_pieces: the consumer failed");
                              });
  });
}

}  // extern "C"
