#include "heap/heap.hpp"

#include <unistd.h>

#include <cstdint>
#include <exception>
#include <vector>

#include "bootstrap/agree_on_outcome.hpp"
#include "common/check.hpp"
#include "common/driver_api.hpp"

namespace symmem::detail {
namespace {

CUmemAllocationProp device_allocation(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

size_t query_granularity(int device) {
  CUmemAllocationProp prop = device_allocation(device);
  size_t granularity = 0;
  SYMMEM_CU_CHECK(
      DriverApi::get().mem_get_allocation_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  return granularity;
}

size_t align_reserve(size_t reserve, size_t granularity) {
  return (reserve + granularity - 1) / granularity * granularity;
}

}  // namespace

Heap::Heap(int device, int rank, int world, size_t reserve_per_rank)
    : device_(device),
      rank_(rank),
      world_(world),
      reserve_(align_reserve(reserve_per_rank, query_granularity(device))),
      granularity_(query_granularity(device)),
      ranges_(reserve_, granularity_) {
  SYMMEM_CU_CHECK(DriverApi::get().mem_address_reserve(&base_, reserve_ * world_, granularity_, 0, 0));
}

Heap::~Heap() {
  for (auto& [offset, m] : mappings_) unmap(offset, m);
  mappings_.clear();
  if (base_) SYMMEM_CU_CHECK_NOTHROW(DriverApi::get().mem_address_free(base_, reserve_ * world_));
}

size_t Heap::mapped_bytes() const {
  size_t total = 0;
  for (const auto& [offset, m] : mappings_) total += m.size;
  return total;
}

void Heap::unmap(size_t offset, Mapping& m) noexcept {
  const DriverApi& api = DriverApi::get();
  for (int r = 0; r < world_; ++r) {
    if (m.mapped[r]) SYMMEM_CU_CHECK_NOTHROW(api.mem_unmap(reinterpret_cast<CUdeviceptr>(base(r) + offset), m.size));
    if (m.handles[r]) SYMMEM_CU_CHECK_NOTHROW(api.mem_release(m.handles[r]));
    m.mapped[r] = false;
    m.handles[r] = 0;
  }
}

void Heap::release(size_t offset) noexcept {
  auto it = mappings_.find(offset);
  if (it == mappings_.end()) return;
  unmap(offset, it->second);
  mappings_.erase(it);
  ranges_.release(offset);
}

size_t Heap::allocate(size_t bytes, Bootstrap& bootstrap, FdExchange& exchange) {
  const DriverApi& api = DriverApi::get();
  const auto offset_or = ranges_.allocate(bytes);
  // Every rank has the same free list, so either all find room or none does.
  if (!offset_or)
    throw Error(ErrorCode::kInvalidArgument, "heap exhausted: cannot place " + std::to_string(bytes) +
                                                 " bytes in the " + std::to_string(reserve_ >> 20) +
                                                 " MiB reservation (raise SYMMEM_HEAP_RESERVE_GB)");
  const size_t offset = *offset_or;
  Mapping m;
  m.size = ranges_.round_up(bytes);

  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  int my_fd = -1;
  std::vector<int> peer_fds;
  auto release_local = [&]() noexcept {
    if (my_fd >= 0) ::close(my_fd);
    my_fd = -1;
    for (int& fd : peer_fds)
      if (fd >= 0) ::close(fd), fd = -1;
    unmap(offset, m);
    ranges_.release(offset);
  };
  // Every step can fail on one rank only (out of memory, import, map). The ranks agree on the
  // outcome after each, so that either every rank keeps the allocation at this offset or none does:
  // the ranks' free lists, and so every later buffer's offset, stay identical, and no rank waits
  // for descriptors a failed peer will never send.
  const std::string what = "heap allocation of " + std::to_string(m.size) + " bytes";
  std::exception_ptr failure;

  // Step 1: this rank's physical chunk.
  CUmemAllocationProp prop = device_allocation(device_);
  const CUresult created = api.mem_create(&m.handles[rank_], m.size, &prop, 0);
  if (created != CUDA_SUCCESS) {
    m.handles[rank_] = 0;
    failure = std::make_exception_ptr(Error(ErrorCode::kCudaError, "cuMemCreate(" + std::to_string(m.size) +
                                                                       " bytes) on rank " + std::to_string(rank_) +
                                                                       ": " + cu_error_name(created)));
  }
  agree_on_outcome(bootstrap, failure, release_local, what);

  try {
    // Step 2: map locally and zero, before any peer can see the memory.
    SYMMEM_CU_CHECK(api.mem_map(reinterpret_cast<CUdeviceptr>(base(rank_) + offset), m.size, 0, m.handles[rank_], 0));
    m.mapped[rank_] = true;
    SYMMEM_CU_CHECK(api.mem_set_access(reinterpret_cast<CUdeviceptr>(base(rank_) + offset), m.size, &access, 1));
    SYMMEM_CUDA_CHECK(cudaMemset(base(rank_) + offset, 0, m.size));
    SYMMEM_CUDA_CHECK(cudaDeviceSynchronize());
    SYMMEM_CU_CHECK(
        api.mem_export_to_shareable_handle(&my_fd, m.handles[rank_], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  } catch (...) {
    failure = std::current_exception();
  }
  agree_on_outcome(bootstrap, failure, release_local, what);

  try {
    // Step 3: pass descriptors; import and map every peer's chunk.
    peer_fds = exchange.exchange(my_fd);
    ::close(my_fd);
    my_fd = -1;
    for (int r = 0; r < world_; ++r) {
      if (r == rank_) continue;
      SYMMEM_CU_CHECK(api.mem_import_from_shareable_handle(&m.handles[r],
                                                           reinterpret_cast<void*>(static_cast<uintptr_t>(peer_fds[r])),
                                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
      ::close(peer_fds[r]);
      peer_fds[r] = -1;
      SYMMEM_CU_CHECK(api.mem_map(reinterpret_cast<CUdeviceptr>(base(r) + offset), m.size, 0, m.handles[r], 0));
      m.mapped[r] = true;
      SYMMEM_CU_CHECK(api.mem_set_access(reinterpret_cast<CUdeviceptr>(base(r) + offset), m.size, &access, 1));
    }
  } catch (...) {
    failure = std::current_exception();
  }
  agree_on_outcome(bootstrap, failure, release_local, what);
  mappings_[offset] = m;
  return offset;
}

}  // namespace symmem::detail
