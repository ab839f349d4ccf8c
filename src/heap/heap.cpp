#include "heap/heap.hpp"

#include <unistd.h>

#include <cstdint>
#include <vector>

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

  // Step 1: this rank's physical chunk. Its failure (out of memory) is shared with every rank
  // before anyone waits for descriptors, so all ranks fail together instead of timing out.
  std::string failure;
  CUmemAllocationProp prop = device_allocation(device_);
  CUresult created = api.mem_create(&m.handles[rank_], m.size, &prop, 0);
  if (created != CUDA_SUCCESS) {
    m.handles[rank_] = 0;
    failure = "cuMemCreate(" + std::to_string(m.size) + " bytes) on rank " + std::to_string(rank_) + ": " +
              cu_error_name(created);
  }
  std::vector<uint8_t> ok(world_);
  uint8_t mine = failure.empty() ? 1 : 0;
  bootstrap.all_gather(&mine, ok.data(), 1);
  for (int r = 0; r < world_; ++r) {
    if (!ok[r]) {
      if (m.handles[rank_]) api.mem_release(m.handles[rank_]);
      ranges_.release(offset);
      throw Error(ErrorCode::kCudaError, failure.empty() ? "allocation of " + std::to_string(m.size) +
                                                               " bytes failed on rank " + std::to_string(r)
                                                         : failure);
    }
  }

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
  // Every later step can fail on one rank only (import, map). The ranks agree on the outcome after
  // each step, so that either every rank keeps the allocation at this offset or none does: the
  // ranks' free lists, and so every later buffer's offset, stay identical.
  auto agree = [&](const std::string& local_failure) {
    std::vector<uint8_t> fine(world_);
    const uint8_t me = local_failure.empty() ? 1 : 0;
    try {
      bootstrap.all_gather(&me, fine.data(), 1);
    } catch (...) {
      release_local();
      throw;
    }
    for (int r = 0; r < world_; ++r) {
      if (fine[r]) continue;
      release_local();
      throw Error(ErrorCode::kCudaError, local_failure.empty() ? "heap allocation of " + std::to_string(m.size) +
                                                                     " bytes failed on rank " + std::to_string(r)
                                                               : local_failure);
    }
  };
  std::string failure_step;
  try {
    // Step 2: map locally and zero, before any peer can see the memory.
    SYMMEM_CU_CHECK(api.mem_map(reinterpret_cast<CUdeviceptr>(base(rank_) + offset), m.size, 0, m.handles[rank_], 0));
    m.mapped[rank_] = true;
    SYMMEM_CU_CHECK(api.mem_set_access(reinterpret_cast<CUdeviceptr>(base(rank_) + offset), m.size, &access, 1));
    SYMMEM_CUDA_CHECK(cudaMemset(base(rank_) + offset, 0, m.size));
    SYMMEM_CUDA_CHECK(cudaDeviceSynchronize());
    SYMMEM_CU_CHECK(
        api.mem_export_to_shareable_handle(&my_fd, m.handles[rank_], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
  } catch (const std::exception& e) {
    failure_step = std::string("rank ") + std::to_string(rank_) + ": " + e.what();
  }
  agree(failure_step);
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
  } catch (const std::exception& e) {
    failure_step = std::string("rank ") + std::to_string(rank_) + ": " + e.what();
  }
  agree(failure_step);
  mappings_[offset] = m;
  return offset;
}

}  // namespace symmem::detail
