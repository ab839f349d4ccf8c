#include "heap/heap.hpp"

#include <unistd.h>

#include <algorithm>
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

CUmemAccessDesc read_write_access(int device) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return access;
}

size_t align_reserve(size_t reserve, size_t granularity) {
  return (reserve + granularity - 1) / granularity * granularity;
}

Error heap_exhausted(size_t bytes, size_t reserve) {
  return Error(ErrorCode::kInvalidArgument, "heap exhausted: cannot place " + std::to_string(bytes) + " bytes in the " +
                                                std::to_string(reserve >> 20) +
                                                " MiB reservation (raise SYMMEM_HEAP_RESERVE_GB)");
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

std::optional<size_t> Heap::unmap_holding(size_t offset) noexcept {
  auto it = mappings_.upper_bound(offset);  // the first allocation after the one holding offset
  if (it == mappings_.begin()) return std::nullopt;
  --it;
  const size_t start = it->first;
  if (offset >= start + it->second.size) return std::nullopt;
  unmap(start, it->second);
  mappings_.erase(it);
  return start;
}

void Heap::release(size_t offset) noexcept {
  if (const auto start = unmap_holding(offset)) ranges_.release(*start);
}

void Heap::release_local(size_t offset) noexcept {
  if (const auto start = unmap_holding(offset)) released_.insert(*start);
}

void Heap::return_released_ranges(Bootstrap& bootstrap) {
  uint64_t count = released_.size();
  std::vector<uint64_t> counts(world_);
  bootstrap.all_gather(&count, counts.data(), sizeof(count));
  const uint64_t most = *std::max_element(counts.begin(), counts.end());
  if (most == 0) return;
  constexpr uint64_t kNone = ~uint64_t(0);
  std::vector<uint64_t> mine(most, kNone), all(most * world_);
  std::copy(released_.begin(), released_.end(), mine.begin());
  bootstrap.all_gather(mine.data(), all.data(), most * sizeof(uint64_t));
  // A range every rank released (each list is sorted): the same set on every rank.
  for (auto it = released_.begin(); it != released_.end();) {
    bool everywhere = true;
    for (int r = 0; r < world_ && everywhere; ++r) {
      const uint64_t* list = all.data() + size_t(r) * most;
      everywhere = std::binary_search(list, list + counts[r], uint64_t(*it));
    }
    if (everywhere) {
      ranges_.release(*it);
      it = released_.erase(it);
    } else {
      ++it;
    }
  }
}

void Heap::map_rank(int r, size_t offset, Mapping& m) {
  const DriverApi& api = DriverApi::get();
  const CUmemAccessDesc access = read_write_access(device_);
  SYMMEM_CU_CHECK(api.mem_map(reinterpret_cast<CUdeviceptr>(base(r) + offset), m.size, 0, m.handles[r], 0));
  m.mapped[r] = true;
  SYMMEM_CU_CHECK(api.mem_set_access(reinterpret_cast<CUdeviceptr>(base(r) + offset), m.size, &access, 1));
}

void Heap::map_peers(size_t offset, Mapping& m, int* my_fd, std::vector<int>* peer_fds, FdExchange& exchange) {
  const DriverApi& api = DriverApi::get();
  *peer_fds = exchange.exchange(*my_fd);
  ::close(*my_fd);
  *my_fd = -1;
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    int& fd = (*peer_fds)[r];
    SYMMEM_CU_CHECK(api.mem_import_from_shareable_handle(
        &m.handles[r], reinterpret_cast<void*>(static_cast<uintptr_t>(fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    ::close(fd);
    fd = -1;
    map_rank(r, offset, m);
  }
}

size_t Heap::allocate(size_t bytes, Bootstrap& bootstrap, FdExchange& exchange) {
  const DriverApi& api = DriverApi::get();
  return_released_ranges(bootstrap);
  const auto offset_or = ranges_.allocate(bytes);
  // Every rank has the same free list, so either all find room or none does.
  if (!offset_or) throw heap_exhausted(bytes, reserve_);
  const size_t offset = *offset_or;
  Mapping m;
  m.size = ranges_.round_up(bytes);

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

  // Step 2: map locally and zero, before any peer can see the memory.
  agree_on_step(
      bootstrap,
      [&] {
        map_rank(rank_, offset, m);
        SYMMEM_CUDA_CHECK(cudaMemset(base(rank_) + offset, 0, m.size));
        SYMMEM_CUDA_CHECK(cudaDeviceSynchronize());
        SYMMEM_CU_CHECK(api.mem_export_to_shareable_handle(&my_fd, m.handles[rank_],
                                                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
      },
      release_local, what);
  // Step 3: pass descriptors; import and map every peer's chunk.
  agree_on_step(bootstrap, [&] { map_peers(offset, m, &my_fd, &peer_fds, exchange); }, release_local, what);
  mappings_[offset] = m;
  return offset;
}



size_t Heap::import(const void* ptr, size_t bytes, Bootstrap& bootstrap, FdExchange& exchange, size_t* delta) {
  const DriverApi& api = DriverApi::get();
  return_released_ranges(bootstrap);
  Mapping m;
  int my_fd = -1;
  std::vector<int> peer_fds;
  size_t offset = 0;
  bool placed = false;
  auto release_local = [&]() noexcept {
    if (my_fd >= 0) ::close(my_fd);
    my_fd = -1;
    for (int& fd : peer_fds)
      if (fd >= 0) ::close(fd), fd = -1;
    unmap(offset, m);  // releases the retained handle too
    if (placed) ranges_.release(offset);
    placed = false;
  };
  const std::string what = "heap import of " + std::to_string(bytes) + " bytes";
  std::exception_ptr failure;

  // Step 1: this rank's allocation, retained and exported.
  struct Extent {
    uint64_t size;
    uint64_t delta;
  } mine{};
  try {
    CUdeviceptr start = 0;
    size_t size = 0;
    const auto at = reinterpret_cast<CUdeviceptr>(ptr);
    SYMMEM_CU_CHECK(api.mem_get_address_range(&start, &size, at));
    if (bytes > size || at - start > size - bytes)
      throw Error(ErrorCode::kUnsupported, "the range spans several allocations");
    SYMMEM_CU_CHECK(api.mem_retain_allocation_handle(&m.handles[rank_], const_cast<void*>(ptr)));
    CUmemAllocationProp prop{};
    SYMMEM_CU_CHECK(api.mem_get_allocation_properties_from_handle(&prop, m.handles[rank_]));
    if (!(prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
      throw Error(ErrorCode::kUnsupported, "the allocation cannot be exported as a file descriptor");
    if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != device_)
      throw Error(ErrorCode::kUnsupported, "the allocation is not memory of this rank's GPU");
    SYMMEM_CU_CHECK(
        api.mem_export_to_shareable_handle(&my_fd, m.handles[rank_], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    mine = {size, at - start};
  } catch (const Error& e) {
    // cudaMalloc memory, a caching allocator's block: not an error of the program, a refusal.
    failure = std::make_exception_ptr(Error(ErrorCode::kUnsupported, "rank " + std::to_string(rank_) +
                                                                          " cannot map its memory into the heap: " +
                                                                          e.what()));
  }
  agree_on_outcome(bootstrap, failure, release_local, what);

  std::vector<Extent> all(world_);
  bootstrap.all_gather(&mine, all.data(), sizeof(Extent));
  for (int r = 0; r < world_; ++r) {
    if (all[r].size == mine.size && all[r].delta == mine.delta) continue;
    release_local();
    throw Error(ErrorCode::kUnsupported, what + ": rank " + std::to_string(r) + "'s allocation holds " +
                                             std::to_string(all[r].size) + " bytes with the range at " +
                                             std::to_string(all[r].delta) + ", rank " + std::to_string(rank_) + "'s " +
                                             std::to_string(mine.size) + " at " + std::to_string(mine.delta) +
                                             "; every rank's must be alike");
  }
  // Step 2: one offset on every rank (the free lists are identical), this rank's memory there too.
  const auto offset_or = ranges_.allocate(mine.size);
  if (!offset_or) {
    release_local();
    throw heap_exhausted(mine.size, reserve_);
  }
  offset = *offset_or;
  placed = true;
  m.size = mine.size;
  agree_on_step(bootstrap, [&] { map_rank(rank_, offset, m); }, release_local, what);
  // Step 3: every peer's memory.
  agree_on_step(bootstrap, [&] { map_peers(offset, m, &my_fd, &peer_fds, exchange); }, release_local, what);
  mappings_[offset] = m;
  *delta = mine.delta;
  return offset;
}

}  // namespace symmem::detail
