// The communicator: the ranks of a job (one process or thread per GPU), a symmetric heap reserved
// with CUDA VMM shared by the ranks of each node (NVLink domain), and the synchronisation state of
// its collectives.
//
// Several nodes: a communicator whose ranks span nodes holds its node's symmetric domain plus an
// NCCL communicator among the ranks of equal local rank (docs/hierarchical.md). rank() and world()
// are the job's; heap buffers, their peers and every SM or copy-engine collective belong to the
// node (local_rank(), local_world()); all_gather runs hierarchically across nodes, and the
// collectives that run inside one node only (all_reduce, reduce_scatter, barrier) fail at the call
// with kUnsupported.
//
// Collective calls (create, allocate, free, close and every collective) must be made by every
// rank in the same order. Calls run in host order whatever streams they are enqueued on: a call on
// a stream other than the previous call's first makes its stream wait for what that stream holds
// (free on one stream; see src/comm/call_order.hpp for capture). A stream passed to a call must
// stay alive until the communicator's next call on another stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "symmem/bootstrap.hpp"
#include "symmem/error.hpp"
#include "symmem/types.hpp"

namespace symmem {

class Communicator;
namespace detail {
struct CommunicatorState;
CommunicatorState& state_of(const Communicator& comm);
}  // namespace detail

// A symmetric buffer: the same size at the same heap offset on every rank, mapped by all of them.
class Buffer {
 public:
  // Trivially copyable view for kernels written by users: pass it by value. Its ranks are the
  // node's local ranks.
  struct DeviceHandle {
    void* local;
    void* peers[kMaxWorld];  // every rank's copy, as mapped in this process
    uint32_t* signal_pad;    // this rank's flags (zeroed at allocation)
    uint32_t* peer_signal_pads[kMaxWorld];
    size_t bytes;
    size_t signal_pad_words;
    int rank;
    int world;
  };

  void* ptr() const { return local_; }
  size_t size() const { return bytes_; }
  void* peer_ptr(int local_rank) const;  // a rank of this node
  // A device array of world pointers (peer_ptrs()[r] == peer_ptr(r)), for kernels that index it.
  void* const* peer_ptrs_device() const { return peer_table_; }
  uint32_t* signal_pad() const { return pad_; }
  size_t signal_pad_words() const;
  DeviceHandle device_handle() const;
  // True when [p, p + bytes) lies inside this buffer on this rank.
  bool contains(const void* p, size_t bytes) const;

 private:
  friend class Communicator;
  Buffer() = default;
  Communicator* comm_ = nullptr;
  size_t offset_ = 0;
  size_t bytes_ = 0;
  void* local_ = nullptr;
  uint32_t* pad_ = nullptr;
  void* const* peer_table_ = nullptr;
};

struct CommConfig {
  int64_t timeout_ms = -1;        // device and host wait deadline; -1: SYMMEM_TIMEOUT_MS (30 s)
  size_t heap_reserve_bytes = 0;  // virtual address space per rank; 0: SYMMEM_HEAP_RESERVE_GB
  // Device memory per rank for the collectives' own workspaces (staging of local operands,
  // receive areas), allocated once at creation and never resized, so that a captured CUDA graph
  // never references freed memory and no call hides a collective allocation. Staged calls larger
  // than their workspace run in chunks; algorithms whose receive area is too small are not chosen
  // (or, when forced, fail with an error naming this budget). 0: SYMMEM_WORKSPACE_MB (256 MiB).
  size_t workspace_bytes = 0;
  // Ranks per node (NVLink domain). 0: when the bootstrap covers the whole job (WORLD_SIZE ranks),
  // SYMMEM_NODE_SIZE, else LOCAL_WORLD_SIZE; otherwise the ranks' host names. Every rank must see the
  // same value (checked at creation).
  int node_size = 0;
};

class Communicator {
 public:
  // Collective. `device` is this rank's CUDA device; -1 uses the current device.
  static std::unique_ptr<Communicator> create(std::shared_ptr<Bootstrap> bootstrap, int device = -1,
                                              const CommConfig& config = {});
  // Local release only: unmaps and releases this rank's mappings. Call close() first to tear
  // down collectively; destroying without close() is safe but peers may still hold mappings.
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;         // in the job
  int world() const;        // ranks in the job
  int local_rank() const;   // in this node: the index of Buffer peers
  int local_world() const;  // ranks of this node
  int nodes() const;
  int device() const;
  Bootstrap& bootstrap();

  // Collective: every rank asks for the same size in the same order (else kInvalidArgument
  // naming both sizes). The communicator owns the buffer until free() or close(). Pass it to
  // collectives as a symmetric operand (the Buffer itself, or {buffer, offset}).
  Buffer* allocate(size_t bytes);
  // Collective: waits for this device to be idle, then unmaps the buffer everywhere. A CUDA graph
  // that references the buffer must not be replayed afterwards (as with any freed memory).
  void free(Buffer* buffer);
  // Collective: the caller's memory at [ptr, ptr + bytes) as a symmetric buffer, zero copy: every
  // rank's allocation holding it is mapped into the heap, where every rank reaches every rank's.
  // The memory must come from cuMemCreate with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (as
  // ncclMemAlloc makes it; cudaMalloc memory cannot be imported), be of this rank's GPU, and the
  // range must lie in one allocation, of the same size and at the same offset in it on every rank,
  // with the same `bytes`. Throws on every rank alike when any rank's cannot (kUnsupported naming the
  // rank and the cause; kInvalidArgument for different sizes). The buffer's ptr() is the heap's
  // mapping of the same memory (writes through either address are seen through the other by later
  // kernels); it has no signal pad or peer table (signal_pad() and its handle's peer_signal_pads are
  // null, signal_pad_words() is 0): it is an operand of collectives. The caller keeps owning the memory and must not free it before release_import().
  Buffer* import(void* ptr, size_t bytes);
  // Local: once this device is idle, unmaps an imported buffer from this process (the peers keep
  // their own mappings until they release theirs). Each rank may release at its own point (as
  // ncclCommWindowDeregister is local): the heap range returns for reuse once every rank released
  // it, agreed at the next allocate or import.
  void release_import(Buffer* buffer);
  // The heap buffer containing [p, p + bytes), or nullptr. Informational only: collectives never
  // infer symmetry from an address (a raw pointer is always a local operand).
  Buffer* find(const void* p, size_t bytes) const;

  // Device barrier among all ranks on `stream` (with the usual deadline). One node only.
  void barrier(cudaStream_t stream);
  // Throws symmem::Error if a device wait of an earlier call failed on any rank: kTimeout (a peer
  // never came: dead or stalled), kMismatch (a peer called something else; the message names both
  // calls), kAborted (another rank failed first, or every call after a failure). The message names
  // the ranks and the collectives.
  void check() const;
  // cudaStreamSynchronize + check().
  void synchronize(cudaStream_t stream) const;
  // Refuses this rank's part of the collective call `op` (e.g. "all_to_all_single"), which this
  // rank will not make because its arguments failed a check made outside symmem (a binding's
  // shapes and dtypes): the peers' waits in that call end at once, and every rank raises `code`
  // with the same message, "<op>: rank R refused the call: <cause>; ...", at its next call,
  // check() or synchronize() (this rank: here, thrown). `stream` is the stream the call would have
  // used (the refusal is ordered after the calls before it there). The communicator is unusable
  // afterwards on every rank, as after a mismatch. symmem's own calls refuse their own bad
  // arguments the same way (docs/design.md, "Refusals").
  [[noreturn]] void refuse_call(const char* op, ErrorCode code, const std::string& cause, cudaStream_t stream);
  bool aborted() const;
  int64_t timeout_ms() const;
  // CUDA graphs that captured a call of this communicator and still exist, or still run: they
  // reference its heap and workspaces, which must stay mapped while any does (close() does not
  // wait for them; a binding that releases memory on its own schedule does).
  int live_graphs() const;

  // Collective teardown: synchronises the device, waits for every rank, releases every buffer,
  // mapping and descriptor. The communicator is unusable afterwards.
  void close();

 private:
  friend detail::CommunicatorState& detail::state_of(const Communicator& comm);
  Communicator();
  std::unique_ptr<detail::CommunicatorState> state_;
};

}  // namespace symmem
