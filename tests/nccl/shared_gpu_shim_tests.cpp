// libsymmem_nccl.so's served path on ONE GPU: ranks as threads sharing GPU 0
// (SYMMEM_TEST_SHARED_GPU=1), each calling NCCL's API as a program does, the shim in front of a
// stand-in NCCL (fake_nccl.cpp: the real one refuses two ranks on one GPU; the stand-in moves no
// data and counts what reaches it). SYMMEM_NCCL=all: every call symmem implements must be served
// (the stand-in must count none of them) and exact.
//
//   symmem_shared_gpu_shim_tests [case filter]      # SYMMEM_SHIM_TEST_WORLDS (default "2 3 4 8")
//   SYMMEM_SHIM_TEST_MODE=off symmem_shared_gpu_shim_tests shim_serves   # negative control: must fail
//
// Cases: every served collective, type, reduction, count, in place and out of place, checked
// exactly on the host (integer-valued inputs: sums are exact whatever the order); registered
// windows (zero copy through Heap::import); the children of ncclCommSplit (NCCL_SPLIT_NOCOLOR,
// keys that reorder the ranks, one-rank children); one thread driving every rank through groups
// (ncclCommInitAll), with a forwarded call in the group; CUDA graph capture and replay, and a
// first call under capture (forwarded, then made at the next eager one); a mismatch and a missing
// rank reported as ncclRemoteError naming the ranks; ncclCommAbort releasing a peer's wait,
// failing a call of another thread that was making the side, and leaving a peer with nothing in
// flight without an error; NCCL's
// own call of an exported function (the stand-in's init with a config calls its plain init)
// forwarded unchanged.
//
// The shared-GPU rules (tests/gpu/shared_gpu_ranks.hpp): device memory is allocated before the
// ranks' first collective and freed after their last; every rank synchronises its own stream only,
// and the ranks meet on the host before anything waits on the whole device (communicator teardown).
#include <malloc.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "test.hpp"

using symmem::test::Skipped;

namespace {

#define NCCL_OK(expr)                                                                                           \
  do {                                                                                                          \
    ncclResult_t r_ = (expr);                                                                                   \
    if (r_ != ncclSuccess)                                                                                      \
      ::symmem::test::fail(__FILE__, __LINE__, std::string(#expr) + ": " + ncclGetErrorString(r_) + ": " +     \
                                                   (ncclGetLastError(nullptr) ? ncclGetLastError(nullptr) : "")); \
  } while (0)

#define CUDA_OK(expr)                                                                                              \
  do {                                                                                                             \
    cudaError_t e_ = (expr);                                                                                       \
    if (e_ != cudaSuccess) ::symmem::test::fail(__FILE__, __LINE__, std::string(#expr) + ": " + cudaGetErrorName(e_)); \
  } while (0)

// SYMMEM_SHIM_TEST_WORLDS: world sizes from 2 to 8, separated by spaces; anything else fails the
// case (a list read as empty would pass every case without running it).
std::vector<int> worlds() {
  const char* text = std::getenv("SYMMEM_SHIM_TEST_WORLDS");
  std::istringstream in(text ? text : "2 3 4 8");
  std::vector<int> out;
  for (int w; in >> w;) {
    if (w < 2 || w > 8) throw symmem::test::Failure("SYMMEM_SHIM_TEST_WORLDS: " + std::to_string(w) + " is not 2 to 8");
    out.push_back(w);
  }
  if (!in.eof() || out.empty())
    throw symmem::test::Failure(std::string("SYMMEM_SHIM_TEST_WORLDS must list world sizes: \"") + (text ? text : "") +
                                "\"");
  return out;
}

// How many calls reached the stand-in NCCL on `comm` (forwarded by the shim).
long forwarded(ncclComm_t comm) {
  static auto fn = [] {
    void* fake = dlopen(std::getenv("SYMMEM_NCCL_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
    return fake ? reinterpret_cast<long (*)(ncclComm_t)>(dlsym(fake, "fake_nccl_forwarded")) : nullptr;
  }();
  return fn ? fn(comm) : -1;
}

// The ranks meet on the host (a failure elsewhere releases them: they then fail too).
class Meeting {
 public:
  explicit Meeting(int world) : world_(world) {}
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int generation = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(120), [&] { return generation_ != generation || broken_; }))
      throw symmem::test::Failure("the ranks never met (a rank is stuck)");
    if (broken_) throw symmem::test::Failure("another rank failed");
  }
  void break_up() {
    std::lock_guard<std::mutex> lock(mutex_);
    broken_ = true;
    cv_.notify_all();
  }

 private:
  int world_;
  int arrived_ = 0;
  int generation_ = 0;
  bool broken_ = false;
  std::mutex mutex_;
  std::condition_variable cv_;
};

// A rank's host side of its copies: pinned. With pageable copies (SYMMEM_SHIM_TEST_PAGEABLE=1
// brings them back) a rank's call timed out at 4 ranks, its peer never launched; with pinned ones
// every case passed at 2, 3, 4 and 8 ranks. The likely cause: a pageable copy goes through the
// driver's staging, which the threads of one process share, so a rank whose pageable read-back
// waits for its own collective (waiting for a peer) can keep that peer from the copy it must make
// before its call. Separate processes on separate GPUs share no such staging.
class HostBuffers {
 public:
  HostBuffers() = default;
  HostBuffers(const HostBuffers&) = delete;
  HostBuffers& operator=(const HostBuffers&) = delete;
  ~HostBuffers() { release(); }
  // Before the rank's first collective (pinning may wait for the device).
  void reserve(size_t bytes) {
    release();
    const char* pageable = std::getenv("SYMMEM_SHIM_TEST_PAGEABLE");
    pageable_ = pageable && std::string(pageable) == "1";
    for (char** p : {&in_, &out_}) {
      if (pageable_) {
        *p = static_cast<char*>(std::malloc(bytes));
        if (!*p) throw symmem::test::Failure("out of host memory");
      } else {
        CUDA_OK(cudaMallocHost(reinterpret_cast<void**>(p), bytes));
      }
    }
    bytes_ = bytes;
  }
  char* in() const { return in_; }
  char* out() const { return out_; }
  size_t bytes() const { return bytes_; }

 private:
  void release() {
    for (char** p : {&in_, &out_}) {
      if (*p) pageable_ ? std::free(*p) : void(cudaFreeHost(*p));
      *p = nullptr;
    }
  }
  char* in_ = nullptr;
  char* out_ = nullptr;
  size_t bytes_ = 0;
  bool pageable_ = false;
};

struct Rank {
  int rank = 0;
  int world = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  Meeting* meeting = nullptr;
  std::atomic<int>* shared = nullptr;  // kSharedWords counters of this run's ranks, 0 at its start
  HostBuffers host;
  void meet() const { meeting->wait(); }
};
constexpr int kSharedWords = 4;

// Runs body on `world` threads, each a rank with its communicator (ncclCommInitRank through the
// shim, on GPU 0, or ncclCommInitRankConfig with `with_config`) and stream; destroys the
// communicators after every rank finished. Throws every rank's failure (a rank that failed first
// often leaves its peers timing out later: which rank saw what is the diagnosis).
void run_ranks(int world, const std::function<void(Rank&)>& body, bool destroy = true, bool with_config = false) {
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  Meeting meeting(world);
  std::array<std::atomic<int>, kSharedWords> shared{};
  std::vector<std::string> failures(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      Rank me;
      me.rank = r;
      me.world = world;
      me.meeting = &meeting;
      me.shared = shared.data();
      try {
        CUDA_OK(cudaSetDevice(0));
        CUDA_OK(cudaStreamCreateWithFlags(&me.stream, cudaStreamNonBlocking));
        if (with_config) {
          ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
          NCCL_OK(ncclCommInitRankConfig(&me.comm, world, id, r, &config));
        } else {
          NCCL_OK(ncclCommInitRank(&me.comm, world, id, r));
        }
        body(me);
        CUDA_OK(cudaStreamSynchronize(me.stream));
        me.meet();  // nobody tears down while a peer's kernel may still wait
        if (destroy) NCCL_OK(ncclCommDestroy(me.comm));
      } catch (const std::exception& e) {
        failures[r] = e.what();
        meeting.break_up();
        // Copies from or to this rank's pinned buffers may still be queued: they end (a waiting
        // kernel at its deadline) before the buffers are freed.
        if (me.stream) cudaStreamSynchronize(me.stream);
      }
      if (me.stream) cudaStreamDestroy(me.stream);
    });
  }
  for (auto& t : threads) t.join();
  std::string report;
  for (int r = 0; r < world; ++r)
    if (!failures[r].empty()) report += (report.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + failures[r]);
  if (!report.empty()) throw symmem::test::Failure("world " + std::to_string(world) + ", " + report);
}

// Element types as the host sees them.
size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclFloat32: return 4;
    default: return 8;
  }
}
// A small integer of rank r at index i: every sum over 8 ranks is exact in every type.
int value(int r, size_t i) { return int((i * 7 + size_t(r) * 3 + 1) % 11) - 5; }

void store(void* base, ncclDataType_t t, size_t i, double v) {
  switch (t) {
    case ncclFloat32: static_cast<float*>(base)[i] = float(v); break;
    case ncclFloat16: static_cast<__half*>(base)[i] = __float2half_rn(float(v)); break;
    case ncclBfloat16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(float(v)); break;
    case ncclInt32: static_cast<int32_t*>(base)[i] = int32_t(v); break;
    case ncclInt64: static_cast<int64_t*>(base)[i] = int64_t(v); break;
    case ncclUint8: static_cast<uint8_t*>(base)[i] = uint8_t(int(v) & 0xff); break;
    default: throw symmem::test::Failure("no host type");
  }
}
double load(const void* base, ncclDataType_t t, size_t i) {
  switch (t) {
    case ncclFloat32: return static_cast<const float*>(base)[i];
    case ncclFloat16: return __half2float(static_cast<const __half*>(base)[i]);
    case ncclBfloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case ncclInt32: return static_cast<const int32_t*>(base)[i];
    case ncclInt64: return double(static_cast<const int64_t*>(base)[i]);
    case ncclUint8: return static_cast<const uint8_t*>(base)[i];
    default: throw symmem::test::Failure("no host type");
  }
}

// The reduction of every rank's value at i, as the shim computes it: exact sums, max, min; an
// average is the float32 sum times 1 / world in float32, rounded once to the type.
double reduced(ncclRedOp_t op, ncclDataType_t t, int world, size_t i) {
  double sum = 0, hi = -1e30, lo = 1e30;
  for (int r = 0; r < world; ++r) {
    sum += value(r, i);
    hi = std::max<double>(hi, value(r, i));
    lo = std::min<double>(lo, value(r, i));
  }
  if (op == ncclMax) return hi;
  if (op == ncclMin) return lo;
  if (op != ncclAvg) return sum;
  std::vector<char> one(8);
  store(one.data(), t, 0, double(float(sum) * (1.0f / float(world))));
  return load(one.data(), t, 0);
}

enum class Op { kAllReduce, kAllGather, kReduceScatter, kAlltoAll };
const char* op_name(Op op) {
  switch (op) {
    case Op::kAllReduce: return "all_reduce";
    case Op::kAllGather: return "all_gather";
    case Op::kReduceScatter: return "reduce_scatter";
    default: return "alltoall";
  }
}

struct Shape {
  Op op;
  ncclDataType_t type;
  ncclRedOp_t redop;
  size_t count;  // NCCL's count
  bool in_place;
  bool odd_ranks_out_of_place = false;  // placement is each rank's own: in place on even ranks only
};

// Input and expected output of rank r, as host bytes; sizes in elements.
struct Plan {
  size_t send_elems, recv_elems;
};
Plan plan_of(const Shape& s, int world) {
  switch (s.op) {
    case Op::kAllReduce: return {s.count, s.count};
    case Op::kAllGather: return {s.count, s.count * world};
    case Op::kReduceScatter: return {s.count * world, s.count};
    default: return {s.count * world, s.count * world};
  }
}

// Where rank r's input starts in its output, in place (all_gather: its slot), in elements.
size_t in_place_offset(const Shape& s, int rank) { return s.op == Op::kAllGather ? s.count * rank : 0; }

// Rank `rank`'s input of s into `host`; its size in bytes.
size_t fill_input(char* host, const Shape& s, int rank, int world) {
  const Plan p = plan_of(s, world);
  for (size_t i = 0; i < p.send_elems; ++i) store(host, s.type, i, value(rank, s.op == Op::kAlltoAll ? i + rank : i));
  return p.send_elems * type_bytes(s.type);
}

double expected_at(const Shape& s, int rank, int world, size_t i) {
  switch (s.op) {
    case Op::kAllReduce: return reduced(s.redop, s.type, world, i);
    case Op::kAllGather: return value(int(i / s.count), i % s.count);
    case Op::kReduceScatter: return reduced(s.redop, s.type, world, size_t(rank) * s.count + i);
    default: {
      // Block q of rank `rank`'s output is block `rank` of rank q's input.
      const int q = int(i / s.count);
      return value(q, size_t(rank) * s.count + i % s.count + q);
    }
  }
}

ncclResult_t call(const Shape& s, const void* send, void* recv, const Rank& me) {
  switch (s.op) {
    case Op::kAllReduce: return ncclAllReduce(send, recv, s.count, s.type, s.redop, me.comm, me.stream);
    case Op::kAllGather: return ncclAllGather(send, recv, s.count, s.type, me.comm, me.stream);
    case Op::kReduceScatter: return ncclReduceScatter(send, recv, s.count, s.type, s.redop, me.comm, me.stream);
    default: return ncclAlltoAll(send, recv, s.count, s.type, me.comm, me.stream);
  }
}

// After a synchronisation: a wait that failed on the device leaves the output unwritten, so its
// cause is the failure, not the bytes.
void expect_no_device_failure(const Rank& me, const std::string& what) {
  ncclResult_t state = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(me.comm, &state));
  if (state != ncclSuccess)
    throw symmem::test::Failure(what + ": " + ncclGetErrorString(state) + ": " + ncclGetLastError(me.comm));
}

// One call of shape s on rank me with buffers send_base / recv_base (device, large enough; at
// `offset` bytes in): poisons the output, runs, checks every element exactly.
void check_call(const Shape& agreed, const Rank& me, char* send_base, char* recv_base, size_t offset) {
  Shape s = agreed;
  if (s.odd_ranks_out_of_place && me.rank % 2 == 1) s.in_place = false;
  const Plan p = plan_of(s, me.world);
  const size_t elem = type_bytes(s.type);
  const size_t input_bytes = fill_input(me.host.in(), s, me.rank, me.world);
  // NCCL's in-place layouts: all_reduce send == recv; all_gather's input is this rank's slot of the
  // output; reduce_scatter's output is this rank's slice of the input.
  char* send = send_base + offset;
  char* recv = recv_base + offset;
  if (s.in_place && s.op == Op::kReduceScatter) {
    send = recv_base + offset;
    recv = send + size_t(me.rank) * s.count * elem;
  } else if (s.in_place) {
    send = recv + in_place_offset(s, me.rank) * elem;
  }
  // Poison what the call writes (the whole buffer in place), then the input over it.
  CUDA_OK(cudaMemsetAsync(s.in_place && s.op == Op::kReduceScatter ? send : recv, 0xA5,
                          (s.in_place && s.op == Op::kReduceScatter ? p.send_elems : p.recv_elems) * elem, me.stream));
  CUDA_OK(cudaMemcpyAsync(send, me.host.in(), input_bytes, cudaMemcpyHostToDevice, me.stream));
  if (std::getenv("SYMMEM_SHIM_TEST_TRACE"))
    std::fprintf(stderr, "rank %d: %s type %d op %d count %zu%s\n", me.rank, op_name(s.op), int(s.type), int(s.redop),
                 s.count, s.in_place ? " in place" : "");
  const ncclResult_t r = call(s, send, recv, me);
  if (r != ncclSuccess)
    throw symmem::test::Failure(std::string(op_name(s.op)) + ": " + ncclGetErrorString(r) + ": " +
                                ncclGetLastError(me.comm));
  const char* out = me.host.out();
  CUDA_OK(cudaMemcpyAsync(me.host.out(), recv, p.recv_elems * elem, cudaMemcpyDeviceToHost, me.stream));
  CUDA_OK(cudaStreamSynchronize(me.stream));
  expect_no_device_failure(me, op_name(s.op));
  for (size_t i = 0; i < p.recv_elems; ++i) {
    double want = expected_at(s, me.rank, me.world, i);
    if (s.type == ncclUint8) want = double(int(want) & 0xff);
    const double got = load(out, s.type, i);
    if (got != want)
      throw symmem::test::Failure(std::string(op_name(s.op)) + " type " + std::to_string(s.type) + " op " +
                                  std::to_string(s.redop) + " count " + std::to_string(s.count) +
                                  (s.in_place ? " in place" : " out of place") + ": element " + std::to_string(i) +
                                  " is " + std::to_string(got) + ", expected " + std::to_string(want));
  }
}

std::vector<Shape> every_shape() {
  std::vector<Shape> shapes;
  const size_t counts[] = {1, 3, 1000, 65537, (size_t(1) << 20) + 5};
  for (size_t count : counts) {
    for (bool in_place : {false, true}) {
      for (ncclDataType_t t : {ncclFloat32, ncclFloat16, ncclBfloat16, ncclInt32}) {
        for (ncclRedOp_t op : {ncclSum, ncclMax, ncclMin, ncclAvg}) {
          if (op == ncclAvg && t == ncclInt32) continue;  // forwarded: NCCL rounds integer averages
          shapes.push_back({Op::kAllReduce, t, op, count, in_place});
          shapes.push_back({Op::kReduceScatter, t, op, count, in_place});
        }
      }
      for (ncclDataType_t t : {ncclFloat32, ncclBfloat16, ncclInt64, ncclUint8})
        shapes.push_back({Op::kAllGather, t, ncclSum, count, in_place});
    }
    // In place too (the low-latency all-to-all moves it without staging), and in place on some
    // ranks only. In place the input covers the poison, and at counts of 3 mod 11 every rank's
    // input equals its expected output (value() repeats every 11): a call that moved nothing
    // would pass there.
    const bool in_place_checks = count % 11 != 3;
    for (ncclDataType_t t : {ncclFloat32, ncclFloat16, ncclUint8}) {
      shapes.push_back({Op::kAlltoAll, t, ncclSum, count, false});
      if (in_place_checks) shapes.push_back({Op::kAlltoAll, t, ncclSum, count, true});
    }
    if (in_place_checks) shapes.push_back({Op::kAlltoAll, ncclFloat16, ncclSum, count, true, true});
  }
  return shapes;
}

size_t largest_buffer(const std::vector<Shape>& shapes, int world) {
  size_t bytes = 0;
  for (const Shape& s : shapes) {
    const Plan p = plan_of(s, world);
    bytes = std::max(bytes, std::max(p.send_elems, p.recv_elems) * type_bytes(s.type));
  }
  return bytes + 4096;
}

void set_env(const char* name, const std::string& value) { setenv(name, value.c_str(), 1); }

// The deadline of every device wait and of the shim's bootstrap in this suite, unless
// SYMMEM_NCCL_TIMEOUT_MS says otherwise (main sets it): a hang fails the case in seconds, naming the
// call and the rank that never came, instead of at the shim's default of 10 minutes.
constexpr const char* kSuiteTimeoutMs = "30000";

// A setting of the shim for one case (set before its ranks start, while no thread of the shim reads
// the environment), the suite's again after it.
class SettingForThisCase {
 public:
  SettingForThisCase(const char* name, const char* value) : name_(name) {
    const char* suite = std::getenv(name);
    had_ = suite != nullptr;
    if (had_) suite_ = suite;
    set_env(name, value);
  }
  ~SettingForThisCase() {
    if (had_)
      set_env(name_, suite_);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string suite_;
};

// SYMMEM_NCCL=all for the communicators made next. SYMMEM_SHIM_TEST_MODE=off is the negative
// control: every call then reaches the stand-in NCCL, which moves no data, and the cases must fail.
void serve_everything() {
  const char* mode = std::getenv("SYMMEM_SHIM_TEST_MODE");
  set_env("SYMMEM_NCCL", mode ? mode : "all");
}

}  // namespace

TEST(shim_serves_every_collective_exactly) {
  serve_everything();
  const std::vector<Shape> shapes = every_shape();
  for (int world : worlds()) {
    run_ranks(world, [&](Rank& me) {
      const size_t bytes = largest_buffer(shapes, world);
      char *send = nullptr, *recv = nullptr;
      CUDA_OK(cudaMalloc(&send, bytes));
      CUDA_OK(cudaMalloc(&recv, bytes));
      me.host.reserve(bytes);
      me.meet();
      for (const Shape& s : shapes) check_call(s, me, send, recv, 0);
      if (forwarded(me.comm) != 0)
        throw symmem::test::Failure(std::to_string(forwarded(me.comm)) + " calls reached NCCL with SYMMEM_NCCL=all");
      me.meet();
      CUDA_OK(cudaFree(send));
      CUDA_OK(cudaFree(recv));
    });
  }
}

TEST(shim_serves_registered_windows_zero_copy) {
  serve_everything();
  // Counts no other case uses: the route log (SYMMEM_NCCL_ROUTE_LOG, set by main for the process)
  // then tells these calls' routes apart.
  std::vector<Shape> shapes;
  for (size_t count : {size_t(5), size_t(4099), (size_t(1) << 18) + 1}) {
    for (bool in_place : {false, true}) {
      shapes.push_back({Op::kAllReduce, ncclBfloat16, ncclSum, count, in_place});
      shapes.push_back({Op::kAllGather, ncclFloat32, ncclSum, count, in_place});
      shapes.push_back({Op::kReduceScatter, ncclFloat16, ncclMax, count, in_place});
    }
  }
  for (int world : worlds()) {
    run_ranks(world, [&](Rank& me) {
      const size_t bytes = largest_buffer(shapes, world) + 8192;
      void *send = nullptr, *recv = nullptr;
      NCCL_OK(ncclMemAlloc(&send, bytes));
      NCCL_OK(ncclMemAlloc(&recv, bytes));
      me.host.reserve(bytes);
      ncclWindow_t send_window = nullptr, recv_window = nullptr;
      // Registered inside a group, as nccl-tests does: the shim maps them at the group's end.
      NCCL_OK(ncclGroupStart());
      NCCL_OK(ncclCommWindowRegister(me.comm, send, bytes, &send_window, NCCL_WIN_COLL_SYMMETRIC));
      NCCL_OK(ncclCommWindowRegister(me.comm, recv, bytes, &recv_window, NCCL_WIN_COLL_SYMMETRIC));
      NCCL_OK(ncclGroupEnd());
      me.meet();
      for (size_t offset : {size_t(0), size_t(4096)})
        for (const Shape& s : shapes) check_call(s, me, static_cast<char*>(send), static_cast<char*>(recv), offset);
      if (forwarded(me.comm) != 0) throw symmem::test::Failure("a call on windows reached NCCL");
      CUDA_OK(cudaStreamSynchronize(me.stream));
      me.meet();
      NCCL_OK(ncclCommWindowDeregister(me.comm, send_window));
      NCCL_OK(ncclCommWindowDeregister(me.comm, recv_window));
      me.meet();
      NCCL_OK(ncclMemFree(send));
      NCCL_OK(ncclMemFree(recv));
    });
  }
  // Every call of these shapes went to symmem as zero copy (a window row), none staged.
  std::ifstream log(std::string(std::getenv("SYMMEM_NCCL_ROUTE_LOG")) + "." + std::to_string(getpid()) + ".csv");
  std::vector<std::string> lines;
  for (std::string line; std::getline(log, line);) lines.push_back(line);
  for (int world : worlds()) {
    for (const Shape& s : shapes) {
      const Plan p = plan_of(s, world);
      const size_t size = std::max(p.send_elems, p.recv_elems) * type_bytes(s.type);  // nccl-tests' size
      const std::string key = std::string(op_name(s.op)) + "," + std::to_string(s.type) + "," +
                              std::to_string(s.redop) + "," + std::to_string(size) + "," + std::to_string(world) + ",";
      bool window = false;
      for (const std::string& line : lines) {
        if (line.rfind(key, 0) != 0) continue;
        if (line.find(",staged,") != std::string::npos)
          throw symmem::test::Failure("a call on registered windows was staged: " + line);
        window = window || line.find(",window,symmem,") != std::string::npos;
      }
      if (!window) throw symmem::test::Failure("no zero-copy route logged for " + key);
    }
  }
}

// The children of ncclCommSplit (PyTorch's new_group splits the default communicator), made and
// served beside each other: halves by parity with their keys reversing the order, every rank but
// rank 0 (which passes NCCL_SPLIT_NOCOLOR and gets none), and all ranks in one colour. Eager sides
// (SYMMEM_NCCL_INIT=eager: made inside the collective split, before any kernel runs on the shared
// GPU) and one-rank children served too (SYMMEM_TEST_NCCL_ONE_RANK: the stand-in moves no data).
TEST(shim_serves_the_children_of_splits) {
  serve_everything();
  SettingForThisCase eager("SYMMEM_NCCL_INIT", "eager");
  SettingForThisCase one_rank("SYMMEM_TEST_NCCL_ONE_RANK", "1");
  const std::vector<Shape> shapes = {{Op::kAllReduce, ncclFloat32, ncclSum, 1000, false},
                                     {Op::kAllGather, ncclBfloat16, ncclSum, 65537, true},
                                     {Op::kReduceScatter, ncclInt32, ncclMax, 3, false},
                                     {Op::kAlltoAll, ncclFloat16, ncclSum, 4099, false}};
  constexpr int kSplits = 3;
  // Colour and key of `rank` in split k.
  auto colour = [](int k, int rank) { return k == 0 ? rank % 2 : k == 1 ? (rank == 0 ? NCCL_SPLIT_NOCOLOR : 7) : 3; };
  auto key = [](int k, int rank, int world) { return k == 0 ? world - rank : rank; };
  for (int world : worlds()) {
    run_ranks(world, [&](Rank& me) {
      const size_t bytes = largest_buffer(shapes, world);
      char *send = nullptr, *recv = nullptr;
      CUDA_OK(cudaMalloc(&send, bytes));
      CUDA_OK(cudaMalloc(&recv, bytes));
      Rank children[kSplits];
      for (Rank& c : children) c.host.reserve(bytes);
      me.meet();
      for (int k = 0; k < kSplits; ++k) {
        const int mine = colour(k, me.rank);
        children[k].comm = reinterpret_cast<ncclComm_t>(&children[k]);  // must be overwritten: a child or none
        NCCL_OK(ncclCommSplit(me.comm, mine, key(k, me.rank, world), &children[k].comm, nullptr));
        if (mine == NCCL_SPLIT_NOCOLOR) {
          if (children[k].comm) throw symmem::test::Failure("NCCL_SPLIT_NOCOLOR made a child");
          continue;
        }
        // NCCL's order: by key, then by the parent's rank.
        std::vector<std::pair<int, int>> members;
        for (int r = 0; r < world; ++r)
          if (colour(k, r) == mine) members.push_back({key(k, r, world), r});
        std::sort(members.begin(), members.end());
        Rank& c = children[k];
        c.world = int(members.size());
        c.rank = int(std::find(members.begin(), members.end(), std::make_pair(key(k, me.rank, world), me.rank)) -
                     members.begin());
        c.stream = me.stream;
        int said_rank = -1, said_world = -1;
        NCCL_OK(ncclCommUserRank(c.comm, &said_rank));
        NCCL_OK(ncclCommCount(c.comm, &said_world));
        if (said_rank != c.rank || said_world != c.world)
          throw symmem::test::Failure("split " + std::to_string(k) + ": rank " + std::to_string(said_rank) + " of " +
                                      std::to_string(said_world) + ", expected " + std::to_string(c.rank) + " of " +
                                      std::to_string(c.world));
      }
      me.meet();
      // Every child's calls, one child after the other (a rank in several children serves them in
      // the same order as its peers).
      for (int k = 0; k < kSplits; ++k) {
        if (!children[k].comm) continue;
        for (const Shape& s : shapes) check_call(s, children[k], send, recv, 0);
        if (forwarded(children[k].comm) != 0)
          throw symmem::test::Failure("split " + std::to_string(k) + ": " +
                                      std::to_string(forwarded(children[k].comm)) + " calls reached NCCL");
      }
      CUDA_OK(cudaStreamSynchronize(me.stream));
      me.meet();
      for (Rank& c : children)
        if (c.comm) NCCL_OK(ncclCommDestroy(c.comm));
      me.meet();
      CUDA_OK(cudaFree(send));
      CUDA_OK(cudaFree(recv));
    });
  }
}

TEST(shim_groups_drive_every_rank_from_one_thread) {
  serve_everything();
  for (int world : worlds()) {
    std::vector<ncclComm_t> comms(world);
    std::vector<int> devices(world, 0);
    CUDA_OK(cudaSetDevice(0));
    NCCL_OK(ncclCommInitAll(comms.data(), world, devices.data()));  // the shim's handshakes run together
    const size_t count = 100003;
    std::vector<cudaStream_t> streams(world);
    std::vector<float*> send(world), recv(world);
    for (int r = 0; r < world; ++r) {
      CUDA_OK(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
      CUDA_OK(cudaMalloc(&send[r], count * 4));
      CUDA_OK(cudaMalloc(&recv[r], count * 4));
      std::vector<float> in(count);
      for (size_t i = 0; i < count; ++i) in[i] = float(value(r, i));
      CUDA_OK(cudaMemcpy(send[r], in.data(), count * 4, cudaMemcpyHostToDevice));
    }
    for (int round = 0; round < 3; ++round) {
      // The first group makes every rank's symmem side (together, on threads of the shim's own);
      // the third mixes a forwarded broadcast into the group.
      NCCL_OK(ncclGroupStart());
      for (int r = 0; r < world; ++r) {
        NCCL_OK(ncclAllReduce(send[r], recv[r], count, ncclFloat32, ncclSum, comms[r], streams[r]));
        if (round == 2) NCCL_OK(ncclBroadcast(send[r], send[r], 1, ncclFloat32, 0, comms[r], streams[r]));
      }
      NCCL_OK(ncclGroupEnd());
      for (int r = 0; r < world; ++r) {
        std::vector<float> out(count);
        CUDA_OK(cudaMemcpyAsync(out.data(), recv[r], count * 4, cudaMemcpyDeviceToHost, streams[r]));
        CUDA_OK(cudaStreamSynchronize(streams[r]));
        for (size_t i = 0; i < count; ++i)
          if (out[i] != float(reduced(ncclSum, ncclFloat32, world, i)))
            throw symmem::test::Failure("round " + std::to_string(round) + " rank " + std::to_string(r) +
                                        ": element " + std::to_string(i) + " wrong");
        const long want = round == 2 ? 1 : 0;  // only the broadcast reached NCCL
        if (forwarded(comms[r]) != want)
          throw symmem::test::Failure("rank " + std::to_string(r) + ": " + std::to_string(forwarded(comms[r])) +
                                      " calls reached NCCL after round " + std::to_string(round));
      }
    }
    for (int r = 0; r < world; ++r) {
      CUDA_OK(cudaStreamSynchronize(streams[r]));
      NCCL_OK(ncclCommDestroy(comms[r]));
      CUDA_OK(cudaFree(send[r]));
      CUDA_OK(cudaFree(recv[r]));
      CUDA_OK(cudaStreamDestroy(streams[r]));
    }
  }
}

// NCCL's rule for a group whose calls use several streams: the group waits for every one of them,
// and every one waits for the group. Here x is rewritten on s2 late (behind a 200 ms host function)
// just before a group that all-reduces x on s1 and y on s2; the sum of x must see the new values,
// and a read of y's sum ordered on s1 alone must see the sum. Without the join (the shim launched
// each served call on its own stream) x's sum took the old values and y's was read too early.
//
// At most 4 ranks when they share one GPU: at 8, the ranks' streams (two each here, plus symmem's)
// outnumber the GPU's 32 hardware queues, and a stream waiting on an event at the head of a queue
// holds the other ranks' work mapped behind it (the run at 8 timed out in the group's first
// all-reduce, a rank's kernel never starting); with a GPU per rank no queue is shared.
TEST(shim_groups_wait_for_every_stream_of_a_communicator) {
  serve_everything();
  for (int world : worlds()) {
    if (world > 4) continue;
    run_ranks(world, [&](Rank& me) {
      const size_t count = 65536, bytes = count * sizeof(float);
      cudaStream_t s2 = nullptr;
      CUDA_OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
      float *x = nullptr, *y = nullptr, *x_sum = nullptr, *y_sum = nullptr;
      for (float** p : {&x, &y, &x_sum, &y_sum}) CUDA_OK(cudaMalloc(p, bytes));
      me.host.reserve(2 * bytes);
      float* fresh = reinterpret_cast<float*>(me.host.in());  // x's new values
      float* out = reinterpret_cast<float*>(me.host.out());
      std::vector<float> first(count), second(count);
      for (size_t i = 0; i < count; ++i) {
        first[i] = float(value(me.rank, i));
        fresh[i] = float(value(me.rank, i + 3) * 2);
        second[i] = float(value(me.rank, i + 5));
      }
      CUDA_OK(cudaMemcpy(x, first.data(), bytes, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemcpy(y, second.data(), bytes, cudaMemcpyHostToDevice));
      CUDA_OK(cudaMemset(x_sum, 0xFF, bytes));  // NaN: poison
      CUDA_OK(cudaMemset(y_sum, 0xFF, bytes));
      me.meet();
      // The communicator's previous call ran on s1 (so its call order adds no wait for s1's next).
      NCCL_OK(ncclAllReduce(y, y_sum, count, ncclFloat32, ncclSum, me.comm, me.stream));
      CUDA_OK(cudaMemsetAsync(y_sum, 0xFF, bytes, me.stream));
      CUDA_OK(cudaStreamSynchronize(me.stream));
      CUDA_OK(cudaLaunchHostFunc(
          s2, [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }, nullptr));
      CUDA_OK(cudaMemcpyAsync(x, fresh, bytes, cudaMemcpyHostToDevice, s2));
      NCCL_OK(ncclGroupStart());
      NCCL_OK(ncclAllReduce(x, x_sum, count, ncclFloat32, ncclSum, me.comm, me.stream));
      NCCL_OK(ncclAllReduce(y, y_sum, count, ncclFloat32, ncclSum, me.comm, s2));
      NCCL_OK(ncclGroupEnd());
      for (int which = 0; which < 2; ++which) {
        CUDA_OK(cudaMemcpyAsync(out, which == 0 ? x_sum : y_sum, bytes, cudaMemcpyDeviceToHost, me.stream));
        CUDA_OK(cudaStreamSynchronize(me.stream));  // s1 alone: the group's end ordered s2 before it
        for (size_t i = 0; i < count; ++i) {
          double want = 0;
          for (int r = 0; r < me.world; ++r) want += which == 0 ? value(r, i + 3) * 2 : value(r, i + 5);
          if (out[i] != float(want))
            throw symmem::test::Failure(std::string(which == 0 ? "x" : "y") + "'s sum, element " + std::to_string(i) +
                                        ": " + std::to_string(out[i]) + ", expected " + std::to_string(want));
        }
      }
      CUDA_OK(cudaStreamSynchronize(s2));
      me.meet();
      for (float* p : {x, y, x_sum, y_sum}) CUDA_OK(cudaFree(p));
      CUDA_OK(cudaStreamDestroy(s2));
    });
  }
}

TEST(shim_captures_and_replays_served_calls) {
  serve_everything();
  for (int world : worlds()) {
    run_ranks(world, [&](Rank& me) {
      const size_t count = 8192 * 4;
      __nv_bfloat16 *in = nullptr, *out = nullptr;
      CUDA_OK(cudaMalloc(&in, count * 2));
      CUDA_OK(cudaMalloc(&out, count * 2));
      me.host.reserve(count * 2);
      auto* host = reinterpret_cast<__nv_bfloat16*>(me.host.in());
      auto* back = reinterpret_cast<const __nv_bfloat16*>(me.host.out());
      auto load_input = [&](int scale) {
        for (size_t i = 0; i < count; ++i) host[i] = __float2bfloat16_rn(float(value(me.rank, i) * scale));
        CUDA_OK(cudaMemcpyAsync(in, host, count * 2, cudaMemcpyHostToDevice, me.stream));
      };
      me.meet();
      // A first call under capture: the symmem side cannot be made inside it, so every rank
      // forwards it; the next eager call makes the side and is served.
      load_input(1);
      cudaGraph_t graph = nullptr;
      CUDA_OK(cudaStreamBeginCapture(me.stream, cudaStreamCaptureModeThreadLocal));
      NCCL_OK(ncclAllReduce(in, out, count, ncclBfloat16, ncclSum, me.comm, me.stream));
      CUDA_OK(cudaStreamEndCapture(me.stream, &graph));
      CUDA_OK(cudaGraphDestroy(graph));
      if (forwarded(me.comm) != 1) throw symmem::test::Failure("the call under capture was not forwarded");
      me.meet();  // no capture under way anywhere while the symmem side is made (it synchronises the device)
      NCCL_OK(ncclAllReduce(in, out, count, ncclBfloat16, ncclSum, me.comm, me.stream));  // eager: made, served
      CUDA_OK(cudaStreamSynchronize(me.stream));
      // Now captured and served: replays after the input changed in place.
      CUDA_OK(cudaStreamBeginCapture(me.stream, cudaStreamCaptureModeThreadLocal));
      for (int k = 0; k < 3; ++k) NCCL_OK(ncclAllReduce(in, out, count, ncclBfloat16, ncclSum, me.comm, me.stream));
      CUDA_OK(cudaStreamEndCapture(me.stream, &graph));
      cudaGraphExec_t exec = nullptr;
      CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
      for (int scale : {2, -3}) {
        load_input(scale);
        CUDA_OK(cudaMemsetAsync(out, 0xA5, count * 2, me.stream));
        CUDA_OK(cudaGraphLaunch(exec, me.stream));
        CUDA_OK(cudaMemcpyAsync(me.host.out(), out, count * 2, cudaMemcpyDeviceToHost, me.stream));
        CUDA_OK(cudaStreamSynchronize(me.stream));
        expect_no_device_failure(me, "replay with scale " + std::to_string(scale));
        for (size_t i = 0; i < count; ++i)
          if (__bfloat162float(back[i]) != float(reduced(ncclSum, ncclBfloat16, world, i) * scale))
            throw symmem::test::Failure("replay with scale " + std::to_string(scale) + ": element " +
                                        std::to_string(i) + " wrong");
      }
      if (forwarded(me.comm) != 1) throw symmem::test::Failure("a captured call reached NCCL");
      me.meet();
      CUDA_OK(cudaGraphExecDestroy(exec));
      CUDA_OK(cudaGraphDestroy(graph));
      CUDA_OK(cudaFree(in));
      CUDA_OK(cudaFree(out));
    });
  }
}

namespace {

// What the process writes to stderr while it lives (fd 2 goes to a file meanwhile); written to
// stderr again when it ends, so that nothing said meanwhile is lost.
class StderrCapture {
 public:
  StderrCapture() {
    char name[] = "/tmp/symmem-shim-stderr-XXXXXX";
    file_ = mkstemp(name);
    if (file_ < 0) throw symmem::test::Failure("cannot make a file for stderr");
    unlink(name);
    std::fflush(stderr);
    saved_ = dup(2);
    if (saved_ < 0 || dup2(file_, 2) < 0) {
      close(file_);
      if (saved_ >= 0) close(saved_);
      throw symmem::test::Failure("cannot send stderr to a file");
    }
  }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;
  ~StderrCapture() {
    const std::string said = text();
    if (!said.empty()) std::fwrite(said.data(), 1, said.size(), stderr);
    close(file_);
  }
  // What was written so far; stderr goes back to where it was.
  std::string text() {
    restore();
    std::string out;
    char chunk[4096];
    for (off_t at = 0;;) {
      const ssize_t n = pread(file_, chunk, sizeof(chunk), at);
      if (n <= 0) break;
      out.append(chunk, size_t(n));
      at += n;
    }
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
  }
  int file_ = -1;
  int saved_ = -1;
};

// Inner calls of ncclCommInitRank the stand-in made that reached the shim (fake_nccl.cpp).
int inner_inits_interposed() {
  void* fake = dlopen(std::getenv("SYMMEM_NCCL_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
  auto fn = fake ? reinterpret_cast<int (*)()>(dlsym(fake, "fake_nccl_inner_inits_interposed")) : nullptr;
  return fn ? fn() : -1;
}

}  // namespace

// The stand-in's ncclCommInitRankConfig calls its own ncclCommInitRank through the global lookup,
// as libnccl.so.2 calls its exported ncclCommGetAsyncError, ncclCommWindowDeregister,
// ncclCommInitAll: the shim receives that inner call too and must forward it unchanged. Handled as
// the program's call, it made a second rendezvous for the same communicator, which found its
// socket taken and said "NCCL shim: this rank forwards every call of a new communicator" on stderr
// (seen failing so on the GPU). The warning is said once per process: this case looks for it in
// the first world it runs.
TEST(shim_forwards_nccls_calls_of_its_own_functions) {
  serve_everything();
  int version = 0;
  NCCL_OK(ncclGetVersion(&version));  // the shim loads the stand-in, whose counter is read below
  for (int world : worlds()) {
    const int interposed_before = inner_inits_interposed();
    if (interposed_before < 0) throw symmem::test::Failure("the stand-in NCCL is not loaded");
    StderrCapture capture;
    run_ranks(
        world,
        [&](Rank& me) {
          float* buf = nullptr;
          CUDA_OK(cudaMalloc(&buf, 4096));
          CUDA_OK(cudaMemsetAsync(buf, 0, 4096, me.stream));
          me.meet();
          NCCL_OK(ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, me.comm, me.stream));
          CUDA_OK(cudaStreamSynchronize(me.stream));
          expect_no_device_failure(me, "the all-reduce");
          if (forwarded(me.comm) != 0) throw symmem::test::Failure("the all-reduce reached NCCL");
          me.meet();
          CUDA_OK(cudaFree(buf));
        },
        /*destroy=*/true, /*with_config=*/true);
    if (inner_inits_interposed() - interposed_before != world)
      throw symmem::test::Failure("world " + std::to_string(world) + ": the stand-in's inner inits did not reach the "
                                  "shim (" + std::to_string(inner_inits_interposed() - interposed_before) + " of " +
                                  std::to_string(world) + "): the case checks nothing");
    const std::string said = capture.text();
    if (said.find("NCCL shim: this rank forwards") != std::string::npos)
      throw symmem::test::Failure("world " + std::to_string(world) + ": the shim made a second rendezvous: " + said);
  }
}

// A communicator whose symmem side cannot be made (here a workspace larger than any GPU) forwards
// every call, and the shim says so on stderr, naming the cause, once per cause and rank: a program
// that preloads it learns that it runs on NCCL alone, and one that makes many communicators hears
// it once. It used to say it only under SYMMEM_DEBUG (seen failing so).
TEST(shim_says_why_a_communicator_forwards) {
  serve_everything();
  const SettingForThisCase huge_workspace("SYMMEM_NCCL_WORKSPACE_MB", "4194304");  // 4 TiB
  const SettingForThisCase quiet("SYMMEM_DEBUG", "0");  // (which would repeat every warning)
  auto forwarding_all_reduce = [](Rank& me) {
    float* buf = nullptr;
    CUDA_OK(cudaMalloc(&buf, 4096));
    CUDA_OK(cudaMemsetAsync(buf, 0, 4096, me.stream));
    me.meet();
    NCCL_OK(ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, me.comm, me.stream));  // tries to make the side
    CUDA_OK(cudaStreamSynchronize(me.stream));
    if (forwarded(me.comm) != 1)
      throw symmem::test::Failure("rank " + std::to_string(me.rank) + ": the all-reduce was not forwarded (" +
                                  std::to_string(forwarded(me.comm)) + " calls reached NCCL)");
    me.meet();
    CUDA_OK(cudaFree(buf));
  };
  std::set<int> heard;  // worlds whose warnings this process has said (a world listed twice)
  for (int world : worlds()) {
    std::string said;
    {
      StderrCapture capture;
      run_ranks(world, forwarding_all_reduce);
      said = capture.text();
    }
    const std::string where = "world " + std::to_string(world) + ": ";
    const bool first_time = heard.insert(world).second;
    for (int r = 0; r < world && first_time; ++r) {
      const std::string warning = "symmem warning: NCCL shim: a communicator (rank " + std::to_string(r) + " of " +
                                  std::to_string(world) + ") forwards every call to NCCL: ";
      const size_t at = said.find(warning);
      if (at == std::string::npos)
        throw symmem::test::Failure(where + "rank " + std::to_string(r) + " did not say why it forwards; stderr: " +
                                    said);
      if (said.find(warning, at + 1) != std::string::npos)
        throw symmem::test::Failure(where + "rank " + std::to_string(r) + " said it twice: " + said);
    }
    if (first_time && said.find("symmem communicator failed") == std::string::npos)
      throw symmem::test::Failure(where + "the warning does not name the cause: " + said);
    // New communicators failing for the same cause: nothing more is said.
    std::string said_again;
    {
      StderrCapture again;
      run_ranks(world, forwarding_all_reduce);
      said_again = again.text();
    }
    if (said_again.find("symmem warning: NCCL shim: a communicator") != std::string::npos)
      throw symmem::test::Failure(where + "the same cause was said again for new communicators: " + said_again);
  }
}

namespace {

// Polls ncclCommGetAsyncError until it reports something, for at most `seconds`.
ncclResult_t async_error_within(ncclComm_t comm, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  ncclResult_t state = ncclSuccess;
  while (std::chrono::steady_clock::now() < until) {
    // Every poll returns at once: PyTorch's watchdog polls holding its communicator's lock, which
    // the program's next call takes (a poll that waited for the ranks' records held it 0.5 s).
    const auto poll = std::chrono::steady_clock::now();
    const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
    const double poll_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - poll).count();
    if (poll_ms > 100) throw symmem::test::Failure("ncclCommGetAsyncError took " + std::to_string(poll_ms) + " ms");
    if (result != ncclSuccess) return ncclInternalError;
    if (state != ncclSuccess) return state;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return ncclSuccess;
}

// `bytes` of zeros on `me`'s device, after a first all-reduce of 1024 floats of them (which makes
// the communicator's symmem side) has finished on every rank.
float* zeros_after_a_first_all_reduce(Rank& me, size_t bytes = 4096) {
  float* buf = nullptr;
  CUDA_OK(cudaMalloc(&buf, bytes));
  CUDA_OK(cudaMemsetAsync(buf, 0, bytes, me.stream));
  me.meet();
  NCCL_OK(ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, me.comm, me.stream));  // makes the side
  CUDA_OK(cudaStreamSynchronize(me.stream));
  me.meet();
  return buf;
}

// A case where a rank misbehaves: every call served, the case's own device deadline, every world;
// the body's last step closes the ranks' communicators (an abort, or a destroy), not run_ranks.
void run_failure_case(const char* timeout_ms, const std::function<void(Rank&)>& body) {
  serve_everything();
  const SettingForThisCase timeout("SYMMEM_NCCL_TIMEOUT_MS", timeout_ms);
  for (int world : worlds()) run_ranks(world, body, /*destroy=*/false);
}

}  // namespace

TEST(shim_reports_a_mismatch_as_a_remote_error) {
  run_failure_case("5000", [](Rank& me) {
    float* buf = zeros_after_a_first_all_reduce(me, 1 << 20);
    // The last rank calls another count: found on the device, an error on every rank.
    const size_t count = me.rank == me.world - 1 ? 2000 : 1000;
    // A rank whose peers already found the mismatch gets the error from the call itself; the others
    // from ncclCommGetAsyncError once their device finds it. Only a launched call finds it: the
    // first ranks' calls must launch.
    const ncclResult_t launched = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, me.comm, me.stream);
    if (launched != ncclSuccess && launched != ncclRemoteError)
      throw symmem::test::Failure("the mismatched call returned " + std::to_string(launched));
    std::atomic<int>& launched_calls = me.shared[0];
    if (launched == ncclSuccess) ++launched_calls;
    CUDA_OK(cudaStreamSynchronize(me.stream));
    const ncclResult_t error = async_error_within(me.comm, 15);
    const std::string why = ncclGetLastError(me.comm) ? ncclGetLastError(me.comm) : "";
    if (error != ncclRemoteError)
      throw symmem::test::Failure("ncclCommGetAsyncError says " + std::to_string(error) + ": " + why);
    if (why.find("rank") == std::string::npos || why.find("all_reduce") == std::string::npos)
      throw symmem::test::Failure("the message names no rank or call: " + why);
    // PyTorch's watchdog asks from its own thread, without a communicator.
    std::string from_another_thread;
    std::thread([&] {
      const char* text = ncclGetLastError(nullptr);
      from_another_thread = text ? text : "";
    }).join();
    if (from_another_thread.find("all_reduce") == std::string::npos)
      throw symmem::test::Failure("ncclGetLastError(NULL) from another thread says: " + from_another_thread);
    // The next call fails with the same code.
    if (ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, me.comm, me.stream) != ncclRemoteError)
      throw symmem::test::Failure("a call after the mismatch did not fail");
    me.meet();
    if (launched_calls == 0) throw symmem::test::Failure("no rank launched the mismatched call");
    // The communicator's message outlives it, as NCCL's does: ncclCommDestroy frees the
    // communicator's state. Text read from freed memory differs with glibc: a freed chunk's first
    // bytes take its free list's links, and M_PERTURB fills those that skip the per-thread cache.
    struct Perturbed {
      bool on;
      explicit Perturbed(bool on) : on(on) {
        if (on) mallopt(M_PERTURB, 0xa5);
      }
      ~Perturbed() {
        if (on) mallopt(M_PERTURB, 0);
      }
    } perturbed(me.rank == 0);
    me.meet();
    const char* kept = ncclGetLastError(me.comm);
    const std::string text = kept ? kept : "";
    if (text.find("all_reduce") == std::string::npos)
      throw symmem::test::Failure("ncclGetLastError after the failed call says: " + text);
    NCCL_OK(ncclCommDestroy(me.comm));
    me.meet();  // every rank's communicator freed
    const bool unchanged = text == kept;
    me.meet();
    if (!unchanged) throw symmem::test::Failure("ncclGetLastError's text changed once the communicator was destroyed");
    CUDA_OK(cudaFree(buf));
  });
}

TEST(shim_names_a_rank_that_never_comes) {
  run_failure_case("3000", [](Rank& me) {
    float* buf = zeros_after_a_first_all_reduce(me);
    const std::string absent = "rank " + std::to_string(me.world - 1);
    if (me.rank != me.world - 1) {  // the last rank never comes
      const auto start = std::chrono::steady_clock::now();
      NCCL_OK(ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, me.comm, me.stream));
      // The call completes at its deadline, and the first poll after it reports: PyTorch's watchdog
      // polls a call only until it completes.
      CUDA_OK(cudaStreamSynchronize(me.stream));
      ncclResult_t first_poll = ncclSuccess;
      NCCL_OK(ncclCommGetAsyncError(me.comm, &first_poll));
      if (first_poll != ncclRemoteError)
        throw symmem::test::Failure("the first poll after the timed-out call completed says " +
                                    std::to_string(first_poll));
      const ncclResult_t error = async_error_within(me.comm, 15);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const std::string why = ncclGetLastError(me.comm) ? ncclGetLastError(me.comm) : "";
      if (error != ncclRemoteError || why.find(absent) == std::string::npos)
        throw symmem::test::Failure("after " + std::to_string(waited) + " s: error " + std::to_string(error) + " (" +
                                    absent + " never came): " + why);
      if (waited > 10) throw symmem::test::Failure("reported only after " + std::to_string(waited) + " s");
      CUDA_OK(cudaStreamSynchronize(me.stream));
    }
    me.meet();
    NCCL_OK(ncclCommAbort(me.comm));
    CUDA_OK(cudaFree(buf));
  });
}

TEST(shim_abort_releases_a_peers_wait) {
  run_failure_case("60000", [](Rank& me) {
    float* buf = zeros_after_a_first_all_reduce(me);
    std::atomic<int>& abort_began = me.shared[0];  // the last rank's
    if (me.rank != me.world - 1) {
      const auto start = std::chrono::steady_clock::now();
      // Waits for the last rank, or, when its abort came first, fails at once.
      const ncclResult_t launched = ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, me.comm, me.stream);
      if (launched != ncclSuccess && (launched != ncclRemoteError || abort_began == 0))
        throw symmem::test::Failure("the call returned " + std::to_string(launched) + " before the peer aborted");
      CUDA_OK(cudaStreamSynchronize(me.stream));  // released by its abort, not by the 60 s deadline
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > 10) throw symmem::test::Failure("the wait ended only after " + std::to_string(waited) + " s");
      if (async_error_within(me.comm, 5) == ncclSuccess) throw symmem::test::Failure("no error after the peer aborted");
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      abort_began = 1;
      NCCL_OK(ncclCommAbort(me.comm));
    }
    me.meet();
    if (me.rank != me.world - 1) NCCL_OK(ncclCommAbort(me.comm));
    CUDA_OK(cudaFree(buf));
  });
}

// PyTorch's watchdog aborts a communicator from its own thread while the program's thread may be
// inside a first served call, making the symmem side and waiting there for peers that never come:
// that call must fail with ncclRemoteError at the abort, never go on to the NCCL communicator the
// abort is freeing.
TEST(shim_an_abort_while_the_side_is_made_fails_that_call) {
  run_failure_case("60000", [](Rank& me) {
    float* buf = nullptr;
    CUDA_OK(cudaMalloc(&buf, 4096));
    me.meet();
    if (me.rank == 0) {  // its peers never make their sides: it waits in the making until the abort
      ncclResult_t aborted = ncclSuccess;
      std::thread watchdog([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        aborted = ncclCommAbort(me.comm);
      });
      const auto start = std::chrono::steady_clock::now();
      const ncclResult_t call = ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, me.comm, me.stream);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      watchdog.join();
      const std::string why = ncclGetLastError(nullptr) ? ncclGetLastError(nullptr) : "";
      NCCL_OK(aborted);
      if (call != ncclRemoteError || why.find("aborted") == std::string::npos)
        throw symmem::test::Failure("the call being made when its communicator was aborted gave " +
                                    std::to_string(call) + " after " + std::to_string(waited) + " s: " + why);
      if (waited > 10) throw symmem::test::Failure("the call ended only after " + std::to_string(waited) + " s");
    }
    me.meet();
    if (me.rank != 0) NCCL_OK(ncclCommAbort(me.comm));
    CUDA_OK(cudaFree(buf));
  });
}

// PyTorch aborts its communicators at exit when a program did not destroy its process groups, one
// rank at a time: a rank with nothing in flight must not see an error then (its watchdog would
// tear it down while it still works), only its next call on that communicator fails.
TEST(shim_abort_leaves_idle_peers_without_an_error) {
  run_failure_case("60000", [](Rank& me) {
    float* buf = zeros_after_a_first_all_reduce(me);
    const bool leaver = me.rank == me.world - 1;
    if (leaver) NCCL_OK(ncclCommAbort(me.comm));
    me.meet();
    if (!leaver) {
      if (const ncclResult_t error = async_error_within(me.comm, 0.5); error != ncclSuccess)
        throw symmem::test::Failure("an idle rank reports error " + std::to_string(error) + " after a peer aborted: " +
                                    (ncclGetLastError(me.comm) ? ncclGetLastError(me.comm) : ""));
      const auto start = std::chrono::steady_clock::now();
      const ncclResult_t next = ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, me.comm, me.stream);
      CUDA_OK(cudaStreamSynchronize(me.stream));
      const ncclResult_t after = next != ncclSuccess ? next : async_error_within(me.comm, 10);
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (after != ncclRemoteError)
        throw symmem::test::Failure("a call after the peer's abort gave " + std::to_string(after) + " after " +
                                    std::to_string(waited) + " s, not ncclRemoteError");
    }
    me.meet();
    if (!leaver) NCCL_OK(ncclCommAbort(me.comm));
    CUDA_OK(cudaFree(buf));
  });
}

// ncclCommRevoke: a call NCCL refuses (flags it does not take) changes nothing, so served calls
// go on (the shim used to release its waits first, failing every later call); after a revoke NCCL
// reports no asynchronous error (the program asked for it), where the shim reported its own
// abort as ncclRemoteError.
TEST(shim_revoke_keeps_nccls_outcome) {
  run_failure_case("60000", [](Rank& me) {
    float* buf = zeros_after_a_first_all_reduce(me);
    if (ncclCommRevoke(me.comm, 1) != ncclInvalidArgument)
      throw symmem::test::Failure("ncclCommRevoke with flags 1 was not refused");
    std::vector<float> ones(1024, 1.0f), out(1024);
    CUDA_OK(cudaMemcpyAsync(buf, ones.data(), 4096, cudaMemcpyHostToDevice, me.stream));
    NCCL_OK(ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, me.comm, me.stream));
    CUDA_OK(cudaMemcpyAsync(out.data(), buf, 4096, cudaMemcpyDeviceToHost, me.stream));
    CUDA_OK(cudaStreamSynchronize(me.stream));
    if (out[0] != float(me.world) || out[1023] != float(me.world))
      throw symmem::test::Failure("the call after a refused revoke summed to " + std::to_string(out[0]));
    ncclResult_t error = ncclSuccess;
    NCCL_OK(ncclCommGetAsyncError(me.comm, &error));
    if (error != ncclSuccess) throw symmem::test::Failure("an error after a refused revoke: " + std::to_string(error));
    me.meet();
    NCCL_OK(ncclCommRevoke(me.comm, 0));
    NCCL_OK(ncclCommGetAsyncError(me.comm, &error));
    if (error != ncclSuccess)
      throw symmem::test::Failure("ncclCommGetAsyncError after a revoke gave " + std::to_string(error) + ": " +
                                  (ncclGetLastError(me.comm) ? ncclGetLastError(me.comm) : ""));
    me.meet();
    NCCL_OK(ncclCommAbort(me.comm));
    CUDA_OK(cudaFree(buf));
  });
}

int main(int argc, char** argv) {
  // Before CUDA starts: ranks share GPU 0 and its hardware queues; multicast stays off.
  setenv("SYMMEM_TEST_SHARED_GPU", "1", 1);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  setenv("SYMMEM_CE_STREAMS", "1", 0);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 1);
#ifdef SYMMEM_FAKE_NCCL_PATH
  setenv("SYMMEM_NCCL_LIBRARY", SYMMEM_FAKE_NCCL_PATH, 0);
#endif
  setenv("SYMMEM_NCCL_TIMEOUT_MS", kSuiteTimeoutMs, 0);
  if (!std::getenv("SYMMEM_NCCL_LIBRARY")) {
    std::printf("SKIPPED: set SYMMEM_NCCL_LIBRARY to libsymmem_fake_nccl.so\n");
    return 77;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: the shim's shared-GPU tests need a GPU\n");
    return 77;
  }
  // The route log and the stand-in's meeting files, in a folder of this run's, removed at the end.
  char scratch[] = "/tmp/symmem_shim_tests_XXXXXX";
  if (!mkdtemp(scratch)) {
    std::printf("cannot make a scratch folder under /tmp\n");
    return 1;
  }
  const std::string routes = std::string(scratch) + "/routes";
  setenv("SYMMEM_NCCL_ROUTE_LOG", routes.c_str(), 0);  // the shim opens it at the first routed call
  setenv("SYMMEM_FAKE_NCCL_MEETING_DIR", scratch, 0);
  const int rc = symmem::test::run_all(argc, argv);
  std::error_code ignored;
  std::filesystem::remove_all(scratch, ignored);
  return rc;
}
