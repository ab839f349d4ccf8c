// symmem-copy-probe: which copies progress while a kernel holds every SM of the GPU?
//
// A copy that needs SMs (the driver runs it as a kernel) cannot start while a persistent kernel
// holds every SM; if that kernel waits for the copy, they deadlock. symmem's copy-engine paths and
// the fused all-gather + GEMM rest on which copies are copy-engine copies, so this tool measures
// it: a blocker kernel fills every SM's thread slots (2 x 1024 threads per SM) and waits (at most
// 1 s) for a flag that the copying stream writes after the copy; the copying stream starts only
// once every blocker block is resident. The copy progressed iff the blocker saw the flag in time.
//   signal  the flag write alone (the control: it must progress)
//   local   device 0 -> device 0
//   pull    device 1 -> device 0, VMM memory of device 1 mapped into device 0 (as the heap is)
//   push    device 0 -> device 1, likewise
// each with cudaMemcpyAsync, cudaMemcpyPeerAsync, cuMemcpyBatchAsync with and without the overlap
// hint, and cudaMemcpy2DAsync, at 4 KiB, 1 MiB and 64 MiB. Exit status 1 when the control or a
// copy between GPUs did not progress (the zero-SM claim would be false); copies within a GPU are
// reported (on H200 with CUDA 13.0 they are kernels: they do not progress).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

#define PROBE_CHECK(call)                                                                          \
  do {                                                                                             \
    const int status_ = static_cast<int>(call);                                                    \
    if (status_ != 0) {                                                                            \
      std::fprintf(stderr, "symmem-copy-probe: %s failed (%d) at line %d\n", #call, status_, __LINE__); \
      std::exit(2);                                                                                \
    }                                                                                              \
  } while (0)

constexpr uint64_t kBlockerLimitNs = 1'000'000'000ull;
constexpr size_t kMaxBytes = size_t(64) << 20;
constexpr size_t kSizes[] = {size_t(4) << 10, size_t(1) << 20, kMaxBytes};

__device__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Every thread of every block waits, so that the blocks keep their thread slots. Each block counts
// itself in `resident` first (the copying stream waits for all of them).
__global__ void __launch_bounds__(1024) hold_every_sm(const uint32_t* flag, uint32_t* resident, int* gave_up) {
  if (threadIdx.x == 0) atomicAdd(resident, 1u);
  const uint64_t start = now_ns();
  for (;;) {
    uint32_t v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    if (v != 0u) return;
    if (now_ns() - start > kBlockerLimitNs) {
      if (threadIdx.x == 0) atomicAdd(gave_up, 1);
      return;
    }
    __nanosleep(200);
  }
}

// Device memory of `owner` mapped for `owner` and `also` (when >= 0), as symmem's heap maps peers.
CUdeviceptr vmm_alloc(int owner, int also, size_t bytes) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = owner;
  size_t granularity = 0;
  PROBE_CHECK(cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  bytes = (bytes + granularity - 1) / granularity * granularity;
  CUmemGenericAllocationHandle handle;
  PROBE_CHECK(cuMemCreate(&handle, bytes, &prop, 0));
  CUdeviceptr ptr;
  PROBE_CHECK(cuMemAddressReserve(&ptr, bytes, 0, 0, 0));
  PROBE_CHECK(cuMemMap(ptr, bytes, 0, handle, 0));
  CUmemAccessDesc access[2] = {};
  for (int i = 0; i < 2; ++i) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = i == 0 ? owner : also;
    access[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  PROBE_CHECK(cuMemSetAccess(ptr, bytes, access, also >= 0 ? 2 : 1));
  return ptr;
}

enum class Api { kSignalOnly, kMemcpyAsync, kMemcpyPeerAsync, kBatchOverlapHint, kBatch, kMemcpy2DAsync };
constexpr Api kCopyApis[] = {Api::kMemcpyAsync, Api::kMemcpyPeerAsync, Api::kBatchOverlapHint, Api::kBatch,
                             Api::kMemcpy2DAsync};

const char* api_name(Api api) {
  switch (api) {
    case Api::kSignalOnly: return "(flag write only)";
    case Api::kMemcpyAsync: return "cudaMemcpyAsync";
    case Api::kMemcpyPeerAsync: return "cudaMemcpyPeerAsync";
    case Api::kBatchOverlapHint: return "cuMemcpyBatchAsync+hint";
    case Api::kBatch: return "cuMemcpyBatchAsync";
    case Api::kMemcpy2DAsync: return "cudaMemcpy2DAsync";
  }
  return "?";
}

void enqueue_copy(Api api, CUdeviceptr dst, int dst_device, CUdeviceptr src, int src_device, size_t bytes,
                  cudaStream_t stream) {
  void* d = reinterpret_cast<void*>(dst);
  const void* s = reinterpret_cast<const void*>(src);
  switch (api) {
    case Api::kSignalOnly:
      break;
    case Api::kMemcpyAsync:
      PROBE_CHECK(cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToDevice, stream));
      break;
    case Api::kMemcpyPeerAsync:
      PROBE_CHECK(cudaMemcpyPeerAsync(d, dst_device, s, src_device, bytes, stream));
      break;
    case Api::kBatchOverlapHint:
    case Api::kBatch: {
      size_t size = bytes, index = 0;
      CUmemcpyAttributes attributes = {};
      attributes.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
      attributes.flags = api == Api::kBatchOverlapHint ? CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE : 0;
      PROBE_CHECK(cuMemcpyBatchAsync(&dst, &src, &size, 1, &attributes, &index, 1, stream));
      break;
    }
    case Api::kMemcpy2DAsync: {  // rows of 4 KiB (or one row)
      const size_t width = bytes < 4096 ? bytes : 4096;
      PROBE_CHECK(cudaMemcpy2DAsync(d, width, s, width, width, bytes / width, cudaMemcpyDeviceToDevice, stream));
      break;
    }
  }
}

struct Probe {
  int sms = 0;
  uint32_t* flag = nullptr;
  uint32_t* resident = nullptr;
  int* gave_up = nullptr;
  cudaStream_t blocker{}, copier{};
  cudaEvent_t start{}, end{};
};

// True when the copy progressed while every SM of device 0 was held.
bool run(Probe& probe, const char* route, Api api, CUdeviceptr dst, int dst_device, CUdeviceptr src, int src_device,
         size_t bytes) {
  PROBE_CHECK(cudaMemset(probe.flag, 0, sizeof(uint32_t)));
  PROBE_CHECK(cudaMemset(probe.resident, 0, sizeof(uint32_t)));
  PROBE_CHECK(cudaMemset(probe.gave_up, 0, sizeof(int)));
  PROBE_CHECK(cudaDeviceSynchronize());
  const uint32_t blocks = static_cast<uint32_t>(probe.sms) * 2;
  hold_every_sm<<<blocks, 1024, 0, probe.blocker>>>(probe.flag, probe.resident, probe.gave_up);
  PROBE_CHECK(cudaGetLastError());
  // Only once every blocker block holds its SM: a copy dispatched first would prove nothing.
  PROBE_CHECK(cuStreamWaitValue32(probe.copier, reinterpret_cast<CUdeviceptr>(probe.resident), blocks,
                                  CU_STREAM_WAIT_VALUE_GEQ));
  PROBE_CHECK(cudaEventRecord(probe.start, probe.copier));
  enqueue_copy(api, dst, dst_device, src, src_device, bytes, probe.copier);
  PROBE_CHECK(cudaEventRecord(probe.end, probe.copier));
  PROBE_CHECK(cuStreamWriteValue32(probe.copier, reinterpret_cast<CUdeviceptr>(probe.flag), 1, 0));
  PROBE_CHECK(cudaDeviceSynchronize());
  int gave_up = 0;
  PROBE_CHECK(cudaMemcpy(&gave_up, probe.gave_up, sizeof(int), cudaMemcpyDeviceToHost));
  float ms = 0;
  PROBE_CHECK(cudaEventElapsedTime(&ms, probe.start, probe.end));
  const bool progressed = gave_up == 0;
  std::printf("%-6s %-24s %8zu KiB progressed=%-3s copy_us=%10.1f\n", route, api_name(api), bytes >> 10,
              progressed ? "yes" : "no", ms * 1e3);
  return progressed;
}

// The copy's time with nothing else on the GPU (best of 5): its bandwidth when it does run.
void time_alone(Probe& probe, const char* route, Api api, CUdeviceptr dst, int dst_device, CUdeviceptr src,
                int src_device, size_t bytes) {
  float best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    PROBE_CHECK(cudaEventRecord(probe.start, probe.copier));
    enqueue_copy(api, dst, dst_device, src, src_device, bytes, probe.copier);
    PROBE_CHECK(cudaEventRecord(probe.end, probe.copier));
    PROBE_CHECK(cudaEventSynchronize(probe.end));
    float ms = 0;
    PROBE_CHECK(cudaEventElapsedTime(&ms, probe.start, probe.end));
    if (rep == 0 || ms < best) best = ms;
  }
  std::printf("%-6s %-24s %8zu KiB alone: copy_us=%8.1f (%.0f GB/s)\n", route, api_name(api), bytes >> 10,
              best * 1e3, bytes / (best * 1e-3) / 1e9);
}

}  // namespace

int main() {
  PROBE_CHECK(cuInit(0));
  int devices = 0;
  PROBE_CHECK(cudaGetDeviceCount(&devices));
  PROBE_CHECK(cudaSetDevice(0));
  Probe probe;
  PROBE_CHECK(cudaDeviceGetAttribute(&probe.sms, cudaDevAttrMultiProcessorCount, 0));
  int threads = 0;
  PROBE_CHECK(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, 0));
  if (threads != 2048) {
    std::fprintf(stderr, "symmem-copy-probe: %d threads per SM; the blocker assumes 2048\n", threads);
    return 2;
  }
  PROBE_CHECK(cudaMalloc(&probe.flag, sizeof(uint32_t)));
  PROBE_CHECK(cudaMalloc(&probe.resident, sizeof(uint32_t)));
  PROBE_CHECK(cudaMalloc(&probe.gave_up, sizeof(int)));
  PROBE_CHECK(cudaStreamCreateWithFlags(&probe.blocker, cudaStreamNonBlocking));
  PROBE_CHECK(cudaStreamCreateWithFlags(&probe.copier, cudaStreamNonBlocking));
  PROBE_CHECK(cudaEventCreate(&probe.start));
  PROBE_CHECK(cudaEventCreate(&probe.end));
  const bool peers = devices >= 2;
  const CUdeviceptr local_a = vmm_alloc(0, peers ? 1 : -1, kMaxBytes);
  const CUdeviceptr local_b = vmm_alloc(0, peers ? 1 : -1, kMaxBytes);
  const bool control = run(probe, "signal", Api::kSignalOnly, 0, 0, 0, 0, 0);
  for (Api api : kCopyApis)
    for (size_t bytes : kSizes) run(probe, "local", api, local_b, 0, local_a, 0, bytes);
  time_alone(probe, "local", Api::kMemcpyAsync, local_b, 0, local_a, 0, kMaxBytes);
  bool peer_copies_progress = true;
  if (peers) {
    const CUdeviceptr remote = vmm_alloc(1, 0, kMaxBytes);
    time_alone(probe, "pull", Api::kMemcpyAsync, local_a, 0, remote, 1, kMaxBytes);
    for (Api api : kCopyApis) {
      for (size_t bytes : kSizes) {
        peer_copies_progress &= run(probe, "pull", api, local_a, 0, remote, 1, bytes);
        peer_copies_progress &= run(probe, "push", api, remote, 1, local_a, 0, bytes);
      }
    }
  } else {
    std::printf("one GPU: copies between GPUs not probed\n");
  }
  cudaDeviceProp prop{};
  PROBE_CHECK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0;
  PROBE_CHECK(cudaDriverGetVersion(&driver));
  std::printf("%s, %d SMs, driver API %d; the control %s; copies between GPUs %s while every SM is held\n",
              prop.name, probe.sms, driver, control ? "progressed" : "DID NOT progress (the probe is broken)",
              peers ? (peer_copies_progress ? "progress" : "DO NOT all progress") : "not probed");
  return control && peer_copies_progress ? 0 : 1;
}
