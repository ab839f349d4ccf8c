// A stand-in for libnccl.so.2 behind libsymmem_nccl.so in the shared-GPU tests
// (tests/nccl/shared_gpu_shim_tests.cpp, scripts/nccl_tests_shared_gpu.sh and
// scripts/nccl_torch_shared_gpu.sh): the real NCCL refuses two ranks on one GPU, and those
// tests run every rank on GPU 0. It keeps NCCL's contract where the shim relies on it and moves no
// data:
//   - ncclCommInitRank returns once every rank of the unique id entered it, in this process or
//     another (the shim's rendezvous relies on that), ncclCommInitAll makes every rank's at once;
//   - ncclCommSplit returns once every rank of the parent entered it, with NCCL's child (ranks of
//     one colour ordered by key, then by parent rank; none for NCCL_SPLIT_NOCOLOR); it blocks at
//     once, so one thread cannot split for several ranks inside a group as NCCL allows;
//   - count, rank, device, async error, group start / end, abort, destroy answer as NCCL does;
//   - ncclMemAlloc makes cuMem memory exportable as a file descriptor, as NCCL's does;
//   - every collective, send and receive is counted (fake_nccl_forwarded) and does nothing (a
//     registration only hands out a handle): with SYMMEM_NCCL=all a served call must never get
//     here, and a forwarded one is seen;
//   - with SYMMEM_FAKE_NCCL_MOVE_DATA=1 they also move their data, through files and the host
//     (fake_nccl_exchange.cpp): then it is a slow reference NCCL for ranks sharing one GPU, which
//     the torch GPU suite runs on behind the shim with SYMMEM_NCCL=off (tests/python/gpu/run.sh).
#include "fake_nccl.hpp"

#include <cuda.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#define FAKE_API extern "C" __attribute__((visibility("default")))

namespace {

std::mutex mutex;
std::map<void*, size_t> allocations;  // ncclMemAlloc'd address -> size
thread_local int group_depth = 0;
thread_local std::vector<fake_nccl::Call> grouped;  // calls of the open group (moving data)

ncclResult_t count(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  comm->forwarded++;
  return ncclSuccess;
}

// A collective, send or receive: counted, and run (or queued until its group ends) when moving data.
ncclResult_t call(fake_nccl::Call c) {
  const ncclResult_t counted = count(c.comm);
  if (counted != ncclSuccess || !fake_nccl::moves_data()) return counted;
  if (c.op >= ncclNumOps) c.pre_mul_sum = fake_nccl::find_pre_mul_sum(c.op);
  if (group_depth > 0) {
    grouped.push_back(std::move(c));
    return ncclSuccess;
  }
  return fake_nccl::run_group({c});
}

}  // namespace

namespace fake_nccl {
std::string meeting_path(const ncclUniqueId& id, const std::string& what) {
  static const char digits[] = "0123456789abcdef";
  const char* dir = std::getenv("SYMMEM_FAKE_NCCL_MEETING_DIR");
  std::string name = std::string(dir && *dir ? dir : "/tmp") + "/symmem-fake-nccl-";
  for (int i = 0; i < 16; ++i) {
    const unsigned char c = static_cast<unsigned char>(id.internal[i]);
    name += digits[c >> 4];
    name += digits[c & 15];
  }
  return name + "-" + what;
}

std::chrono::milliseconds meeting_timeout() {
  const char* text = std::getenv("SYMMEM_NCCL_TIMEOUT_MS");
  const long ms = text ? std::atol(text) : 0;
  return std::chrono::milliseconds(ms > 0 ? ms : 60000);
}

bool moves_data() {
  static const bool moves = [] {
    const char* text = std::getenv("SYMMEM_FAKE_NCCL_MOVE_DATA");
    return text && std::string(text) == "1";
  }();
  return moves;
}
}  // namespace fake_nccl

namespace {
using fake_nccl::meeting_timeout;

// The ranks of one unique id meet through a file each, so that threads of one process and
// processes alike (nccl-tests runs one process per rank) return from ncclCommInitRank only once
// every rank entered it. The files stay: a rank cannot know when the last peer has seen its file.
// They go in SYMMEM_FAKE_NCCL_MEETING_DIR, a folder the harness makes and removes (/tmp without it).
std::string meeting_file(const ncclUniqueId& id, int rank) { return fake_nccl::meeting_path(id, std::to_string(rank)); }

// Whether the file of every rank below `nranks` of `meeting` exists within meeting_timeout().
bool everyone_came(const ncclUniqueId& meeting, int nranks) {
  const auto deadline = std::chrono::steady_clock::now() + meeting_timeout();
  for (int r = 0; r < nranks; ++r)
    if (!fake_nccl::wait_for_file(meeting_file(meeting, r), deadline)) return false;
  return true;
}

}  // namespace

FAKE_API long fake_nccl_forwarded(ncclComm_t comm) { return comm ? comm->forwarded.load() : -1; }

FAKE_API ncclResult_t ncclGetVersion(int* version) {
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
FAKE_API ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::random_device rd;
  for (char& c : id->internal) c = static_cast<char>(rd());
  return ncclSuccess;
}
FAKE_API const char* ncclGetErrorString(ncclResult_t r) {
  static const char* names[] = {"no error",
                                "unhandled cuda error",
                                "unhandled system error",
                                "internal error",
                                "invalid argument",
                                "invalid usage",
                                "remote process exited or there was a network error",
                                "operation in progress"};
  return r >= 0 && r < ncclNumResults ? names[r] : "unknown result";
}
FAKE_API const char* ncclGetLastError(ncclComm_t) { return fake_nccl::last_error().c_str(); }

FAKE_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return ncclUnhandledCudaError;
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  const int fd = ::open(meeting_file(id, rank).c_str(), O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return ncclSystemError;  // also a second rank of the same index
  ::close(fd);
  if (!everyone_came(id, nranks)) return ncclSystemError;
  *comm = new ncclComm{rank, nranks, device, id};
  return ncclSuccess;
}

namespace {
// The id of `parent`'s split number `split` for `what` (its meeting, or the child of a colour):
// the first 16 bytes (those meeting_file reads) mixed with both, FNV-1a.
ncclUniqueId derived_id(const ncclUniqueId& parent, int split, long what) {
  uint64_t h[2] = {1469598103934665603ull, 1099511628211ull * 31};
  for (uint64_t& x : h) {
    auto mix = [&x](uint64_t v) {
      for (int b = 0; b < 8; ++b) x = (x ^ ((v >> (8 * b)) & 0xff)) * 1099511628211ull;
    };
    for (int i = 0; i < 16; ++i) mix(static_cast<unsigned char>(parent.internal[i]));
    mix(static_cast<uint64_t>(split));
    mix(static_cast<uint64_t>(what));
    mix(&x == &h[0] ? 0 : 1);
  }
  ncclUniqueId id = parent;
  std::memcpy(id.internal, h, sizeof(h));
  return id;
}
}  // namespace

// Every rank of the parent leaves its colour and key in a file of the split's meeting and reads
// everyone's: each then knows its child's members without another meeting.
FAKE_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t*) {
  if (!comm || !newcomm || (color < 0 && color != NCCL_SPLIT_NOCOLOR)) return ncclInvalidArgument;
  const int split = comm->splits++;
  const ncclUniqueId meeting = derived_id(comm->id, split, -2);
  const std::string mine = std::to_string(color) + " " + std::to_string(key) + "\n";
  if (!fake_nccl::write_whole_file(meeting_file(meeting, comm->rank), nullptr, 0, mine.data(), mine.size()))
    return ncclSystemError;
  // A file that exists is whole (renamed into place).
  if (!everyone_came(meeting, comm->nranks)) return ncclSystemError;
  std::vector<std::pair<int, int>> members;  // (key, parent rank) of this rank's colour
  for (int r = 0; r < comm->nranks; ++r) {
    int their_color = 0, their_key = 0;
    FILE* f = std::fopen(meeting_file(meeting, r).c_str(), "r");
    const bool read = f && std::fscanf(f, "%d %d", &their_color, &their_key) == 2;
    if (f) std::fclose(f);
    if (!read) return ncclSystemError;
    if (color != NCCL_SPLIT_NOCOLOR && their_color == color) members.push_back({their_key, r});
  }
  *newcomm = nullptr;
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  std::sort(members.begin(), members.end());
  const auto at = std::find(members.begin(), members.end(), std::make_pair(key, comm->rank));
  *newcomm = new ncclComm{static_cast<int>(at - members.begin()), static_cast<int>(members.size()), comm->device,
                          derived_id(comm->id, split, color)};
  return ncclSuccess;
}
namespace {
// Inner calls of ncclCommInitRank that reached another library's (the shim's) entry point.
std::atomic<int> inner_inits_interposed{0};
}  // namespace
FAKE_API int fake_nccl_inner_inits_interposed() { return inner_inits_interposed.load(); }

// Calls its own exported ncclCommInitRank through the global lookup, on purpose: libnccl.so.2 calls
// its exported functions so (its ncclCommInitAll, ncclCommGetAsyncError, ncclCommWindowDeregister...),
// and the shim, which interposes them, must forward such calls unchanged (shared_gpu_shim_tests.cpp
// checks it, and that the shim received the call: fake_nccl_inner_inits_interposed).
FAKE_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t*) {
  using Init = ncclResult_t (*)(ncclComm_t*, int, ncclUniqueId, int);
  const auto init = reinterpret_cast<Init>(dlsym(RTLD_DEFAULT, "ncclCommInitRank"));
  Dl_info theirs{}, mine{};
  if (init && dladdr(reinterpret_cast<const void*>(init), &theirs) &&
      dladdr(reinterpret_cast<const void*>(&inner_inits_interposed), &mine) && theirs.dli_fbase != mine.dli_fbase) {
    ++inner_inits_interposed;
    return init(comm, nranks, id, rank);
  }
  return ncclCommInitRank(comm, nranks, id, rank);
}
FAKE_API ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  for (int i = 0; i < ndev; ++i) comms[i] = new ncclComm{i, ndev, devlist ? devlist[i] : 0, id};
  return ncclSuccess;
}
FAKE_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* n) {
  return comm ? (*n = comm->nranks, ncclSuccess) : ncclInvalidArgument;
}
FAKE_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* r) {
  return comm ? (*r = comm->rank, ncclSuccess) : ncclInvalidArgument;
}
FAKE_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* d) {
  return comm ? (*d = comm->device, ncclSuccess) : ncclInvalidArgument;
}
FAKE_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* e) {
  if (!comm) return ncclInvalidArgument;
  *e = static_cast<ncclResult_t>(comm->failure_code.load());  // a failed call of the data path
  return ncclSuccess;
}
FAKE_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm && fake_nccl::moves_data()) fake_nccl::forget(comm);
  delete comm;
  return ncclSuccess;
}
FAKE_API ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }
FAKE_API ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclSuccess; }
// NCCL 2.28 takes no revoke flags yet: anything else is refused, changing nothing.
FAKE_API ncclResult_t ncclCommRevoke(ncclComm_t, int flags) { return flags != 0 ? ncclInvalidArgument : ncclSuccess; }
FAKE_API ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}
FAKE_API ncclResult_t ncclGroupEnd() {
  if (group_depth <= 0) return ncclInvalidUsage;
  if (--group_depth > 0 || grouped.empty()) return ncclSuccess;
  std::vector<fake_nccl::Call> calls;
  calls.swap(grouped);
  return fake_nccl::run_group(calls);
}

FAKE_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  int device = 0;
  cudaGetDevice(&device);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0;
  if (cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS)
    return ncclUnhandledCudaError;
  size = (size + granularity - 1) / granularity * granularity;
  CUmemGenericAllocationHandle handle;
  CUdeviceptr address = 0;
  if (cuMemCreate(&handle, size, &prop, 0) != CUDA_SUCCESS) return ncclUnhandledCudaError;
  if (cuMemAddressReserve(&address, size, granularity, 0, 0) != CUDA_SUCCESS ||
      cuMemMap(address, size, 0, handle, 0) != CUDA_SUCCESS)
    return ncclUnhandledCudaError;
  cuMemRelease(handle);  // the mapping keeps it
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (cuMemSetAccess(address, size, &access, 1) != CUDA_SUCCESS) return ncclUnhandledCudaError;
  std::lock_guard<std::mutex> lock(mutex);
  allocations[reinterpret_cast<void*>(address)] = size;
  *ptr = reinterpret_cast<void*>(address);
  return ncclSuccess;
}
FAKE_API ncclResult_t ncclMemFree(void* ptr) {
  size_t size = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = allocations.find(ptr);
    if (it == allocations.end()) return ncclInvalidArgument;
    size = it->second;
    allocations.erase(it);
  }
  const auto address = reinterpret_cast<CUdeviceptr>(ptr);
  cuMemUnmap(address, size);
  cuMemAddressFree(address, size);
  return ncclSuccess;
}
FAKE_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t, ncclWindow_t* win, int) {
  if (!comm) return ncclInvalidArgument;
  *win = reinterpret_cast<ncclWindow_t>(buff);
  return ncclSuccess;
}
FAKE_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t) {
  return comm ? ncclSuccess : ncclInvalidArgument;
}

using Kind = fake_nccl::Call::Kind;
FAKE_API ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                    ncclComm_t comm, cudaStream_t stream) {
  return call({Kind::kAllReduce, send, recv, count, type, op, 0, comm, stream, {}});
}
FAKE_API ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                                    cudaStream_t stream) {
  return call({Kind::kAllGather, send, recv, count, type, ncclSum, 0, comm, stream, {}});
}
FAKE_API ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                                        ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return call({Kind::kReduceScatter, send, recv, count, type, op, 0, comm, stream, {}});
}
FAKE_API ncclResult_t ncclAlltoAll(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                                   cudaStream_t stream) {
  return call({Kind::kAlltoAll, send, recv, count, type, ncclSum, 0, comm, stream, {}});
}
FAKE_API ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                    ncclComm_t comm, cudaStream_t stream) {
  return call({Kind::kBroadcast, send, recv, count, type, ncclSum, root, comm, stream, {}});
}
FAKE_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                                cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, type, root, comm, stream);
}
FAKE_API ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                 int root, ncclComm_t comm, cudaStream_t stream) {
  return call({Kind::kReduce, send, recv, count, type, op, root, comm, stream, {}});
}
FAKE_API ncclResult_t ncclGather(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                 ncclComm_t comm, cudaStream_t stream) {
  return call({Kind::kGather, send, recv, count, type, ncclSum, root, comm, stream, {}});
}
FAKE_API ncclResult_t ncclScatter(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                  ncclComm_t comm, cudaStream_t stream) {
  return call({Kind::kScatter, send, recv, count, type, ncclSum, root, comm, stream, {}});
}
FAKE_API ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                               cudaStream_t stream) {
  return call({Kind::kSend, send, nullptr, count, type, ncclSum, peer, comm, stream, {}});
}
FAKE_API ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                               cudaStream_t stream) {
  return call({Kind::kRecv, nullptr, recv, count, type, ncclSum, peer, comm, stream, {}});
}
// Pre-multiplied sums (PyTorch's ReduceOp.PREMUL_SUM, FSDP's gradient divide factor): an op handle
// of the custom range, never served by the shim; its scalar is kept for the data path.
FAKE_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                               ncclScalarResidence_t residence, ncclComm_t comm) {
  if (!comm || !op || !scalar) return ncclInvalidArgument;
  *op = fake_nccl::add_pre_mul_sum(scalar, type, residence == ncclScalarDevice);
  return ncclSuccess;
}
FAKE_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  fake_nccl::remove_pre_mul_sum(op);
  return ncclSuccess;
}
FAKE_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t, void** handle) {
  if (!comm || !handle) return ncclInvalidArgument;
  *handle = buff;
  return ncclSuccess;
}
FAKE_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void*) {
  return comm ? ncclSuccess : ncclInvalidArgument;
}
