// The stand-in NCCL's data path (SYMMEM_FAKE_NCCL_MOVE_DATA=1, fake_nccl_exchange.cpp), which the
// torch GPU suite takes as its reference on one GPU: every collective, rooted or not, in place and
// not, sends and receives, in and out of groups, in float32, bf16, fp16 and int32, at 2, 3, 4 and 8
// ranks (threads sharing GPU 0), held to results computed here from the inputs' formula;
// pre-multiplied sums (host and device scalars), averages and NaN in max; one thread driving
// every rank in a group; ranks making different calls; a rank that never comes named within the
// deadline; a call under graph capture refused. Inputs are small integers, so every reduction is
// exact in every type.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <dlfcn.h>
#include <execinfo.h>
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "test.hpp"

namespace {

// The stand-in, opened by path (FAKE_NCCL, else where the build put it): it needs the CUDA driver,
// which a machine without a GPU lacks, and this test must load there to say it skipped (with a GPU,
// a stand-in that does not open is a failure). NCCL(f) is its f.
void* stand_in() {
  static void* library = [] {
    const char* path = std::getenv("FAKE_NCCL");
    return dlopen(path && *path ? path : SYMMEM_FAKE_NCCL_PATH, RTLD_NOW | RTLD_LOCAL);
  }();
  if (!library) symmem::test::fail(__FILE__, __LINE__, std::string("cannot open the stand-in NCCL: ") + dlerror());
  return library;
}
#define NCCL(f) (reinterpret_cast<decltype(&::f)>(dlsym(stand_in(), #f)))

#define CUDA_OK(call) EXPECT((call) == cudaSuccess)
#define NCCL_OK(call) EXPECT((call) == ncclSuccess)

constexpr size_t kCount = 1000;     // per rank (per peer for all-to-all, reduce-scatter and scatter)
constexpr float kPoison = -12288.f;  // what an output holds before a call: exact in bf16 too

// Rank r's element i: a small integer, different per rank and element.
float value(int rank, size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1)); }

void require_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) throw symmem::test::Skipped("no GPU");
  stand_in();
}

// body(rank, comm) on a thread per rank of a fresh communicator of `world` ranks on GPU 0.
void on_ranks(int world, const std::function<void(int, ncclComm_t)>& body) {
  ncclUniqueId id;
  NCCL_OK(NCCL(ncclGetUniqueId)(&id));
  std::vector<std::string> failures(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        CUDA_OK(cudaSetDevice(0));
        ncclComm_t comm = nullptr;
        NCCL_OK(NCCL(ncclCommInitRank)(&comm, world, id, r));
        body(r, comm);
        NCCL_OK(NCCL(ncclCommDestroy)(comm));
      } catch (const std::exception& e) {
        failures[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r)
    if (!failures[r].empty()) symmem::test::fail(__FILE__, __LINE__, "rank " + std::to_string(r) + ": " + failures[r]);
}

// A device buffer of `n` elements of float32, bf16, fp16 or int32, filled from `fill` or poisoned;
// read back as floats (every value here is a small integer or half of one: exact in each type).
struct Buffer {
  ncclDataType_t type;
  size_t n;
  void* device = nullptr;
  Buffer(ncclDataType_t t, size_t count, const std::function<float(size_t)>& fill = nullptr) : type(t), n(count) {
    CUDA_OK(cudaMalloc(&device, bytes()));
    std::vector<unsigned char> host(bytes());
    for (size_t i = 0; i < n; ++i) encode(fill ? fill(i) : kPoison, host.data() + i * size());
    CUDA_OK(cudaMemcpy(device, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  ~Buffer() { cudaFree(device); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  size_t size() const { return type == ncclBfloat16 || type == ncclFloat16 ? 2 : 4; }
  size_t bytes() const { return n * size(); }
  void encode(float v, unsigned char* at) const {
    if (type == ncclBfloat16) { const __nv_bfloat16 x = __float2bfloat16(v); std::memcpy(at, &x, 2); }
    else if (type == ncclFloat16) { const __half x = __float2half(v); std::memcpy(at, &x, 2); }
    else if (type == ncclInt32) { const int32_t x = static_cast<int32_t>(v); std::memcpy(at, &x, 4); }
    else std::memcpy(at, &v, 4);
  }
  float decode(const unsigned char* at) const {
    if (type == ncclBfloat16) { __nv_bfloat16 x; std::memcpy(&x, at, 2); return __bfloat162float(x); }
    if (type == ncclFloat16) { __half x; std::memcpy(&x, at, 2); return __half2float(x); }
    if (type == ncclInt32) { int32_t x; std::memcpy(&x, at, 4); return static_cast<float>(x); }
    float x;
    std::memcpy(&x, at, 4);
    return x;
  }
  // Element `i`'s address on the device (in-place calls).
  void* at(size_t i) const { return static_cast<unsigned char*>(device) + i * size(); }
  std::vector<float> read() const {
    std::vector<unsigned char> host(bytes());
    CUDA_OK(cudaMemcpy(host.data(), device, bytes(), cudaMemcpyDeviceToHost));
    std::vector<float> out(n);
    for (size_t i = 0; i < n; ++i) out[i] = decode(host.data() + i * size());
    return out;
  }
};

void expect_equal(const std::vector<float>& got, const std::function<float(size_t)>& want, const char* what) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want(i) && !(std::isnan(got[i]) && std::isnan(want(i))))
      symmem::test::fail(__FILE__, __LINE__, std::string(what) + ": element " + std::to_string(i) + " is " +
                                                  std::to_string(got[i]) + ", not " + std::to_string(want(i)));
}

float sum_over_ranks(int world, size_t i) {
  float s = 0;
  for (int r = 0; r < world; ++r) s += value(r, i);
  return s;
}

void every_collective(int world, ncclDataType_t type) {
  on_ranks(world, [world, type](int me, ncclComm_t comm) {
    const size_t n = kCount, w = static_cast<size_t>(world);
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    {
      Buffer in(type, n, [me](size_t i) { return value(me, i); }), out(type, n);
      NCCL_OK(NCCL(ncclAllReduce)(in.device, out.device, n, type, ncclSum, comm, s));
      expect_equal(out.read(), [world](size_t i) { return sum_over_ranks(world, i); }, "all_reduce sum");
      NCCL_OK(NCCL(ncclAllReduce)(in.device, out.device, n, type, ncclMax, comm, s));
      expect_equal(out.read(), [world](size_t i) { return value(world - 1, i); }, "all_reduce max");
      NCCL_OK(NCCL(ncclAllReduce)(in.device, in.device, n, type, ncclMin, comm, s));  // in place
      expect_equal(in.read(), [](size_t i) { return value(0, i); }, "all_reduce min in place");
    }
    {
      Buffer in(type, n, [me](size_t i) { return value(me, i); }), out(type, n * w);
      NCCL_OK(NCCL(ncclAllGather)(in.device, out.device, n, type, comm, s));
      expect_equal(out.read(), [n](size_t i) { return value(static_cast<int>(i / n), i % n); }, "all_gather");
    }
    {
      // Rank r's input block b holds value(r, b * n + i): the reduce-scatter's and all-to-all's.
      Buffer in(type, n * w, [me](size_t i) { return value(me, i); }), out(type, n), all(type, n * w);
      NCCL_OK(NCCL(ncclReduceScatter)(in.device, out.device, n, type, ncclSum, comm, s));
      expect_equal(out.read(), [&](size_t i) { return sum_over_ranks(world, me * n + i); }, "reduce_scatter");
      NCCL_OK(NCCL(ncclAlltoAll)(in.device, all.device, n, type, comm, s));
      expect_equal(all.read(), [&](size_t i) { return value(static_cast<int>(i / n), me * n + i % n); }, "all_to_all");
      NCCL_OK(NCCL(ncclScatter)(in.device, out.device, n, type, world - 1, comm, s));
      expect_equal(out.read(), [&](size_t i) { return value(world - 1, me * n + i); }, "scatter from the last rank");
    }
    {
      const int root = world / 2;
      Buffer in(type, n, [me](size_t i) { return value(me, i); }), out(type, n), gathered(type, n * w);
      NCCL_OK(NCCL(ncclBroadcast)(in.device, out.device, n, type, root, comm, s));
      expect_equal(out.read(), [root](size_t i) { return value(root, i); }, "broadcast");
      Buffer untouched(type, n);
      NCCL_OK(NCCL(ncclReduce)(in.device, me == root ? out.device : untouched.device, n, type, ncclSum, root, comm, s));
      if (me == root) expect_equal(out.read(), [world](size_t i) { return sum_over_ranks(world, i); }, "reduce");
      expect_equal(untouched.read(), [](size_t) { return kPoison; }, "a non-root's reduce output is left alone");
      NCCL_OK(NCCL(ncclGather)(in.device, gathered.device, n, type, root, comm, s));
      if (me == root)
        expect_equal(gathered.read(), [n](size_t i) { return value(static_cast<int>(i / n), i % n); }, "gather");
    }
    {
      // In place, as torch calls them: the all-gather's input is this rank's block of its output,
      // the reduce-scatter's output this rank's block of its input.
      Buffer gather(type, n * w, [&](size_t i) { return i / n == static_cast<size_t>(me) ? value(me, i % n) : kPoison; });
      NCCL_OK(NCCL(ncclAllGather)(gather.at(me * n), gather.device, n, type, comm, s));
      expect_equal(gather.read(), [n](size_t i) { return value(static_cast<int>(i / n), i % n); },
                   "all_gather in place");
      Buffer scatter(type, n * w, [me](size_t i) { return value(me, i); });
      NCCL_OK(NCCL(ncclReduceScatter)(scatter.device, scatter.at(me * n), n, type, ncclSum, comm, s));
      const std::vector<float> got = scatter.read();
      expect_equal(std::vector<float>(got.begin() + me * n, got.begin() + (me + 1) * n),
                   [&](size_t i) { return sum_over_ranks(world, me * n + i); }, "reduce_scatter in place");
    }
    if (type == ncclInt32) {
      Buffer in(type, n, [me](size_t i) { return value(me, i); }), avg(type, n);
      NCCL_OK(NCCL(ncclAllReduce)(in.device, avg.device, n, type, ncclAvg, comm, s));
      expect_equal(avg.read(), [world](size_t i) { return std::trunc(sum_over_ranks(world, i) / world); },
                   "integer average (truncated)");
    }
    {
      // Two messages to one peer in one group arrive in order.
      const int next = (me + 1) % world, prev = (me + world - 1) % world;
      Buffer a(type, n, [me](size_t i) { return value(me, i); }), b(type, n, [me](size_t i) { return value(me, i + 3); });
      Buffer got_a(type, n), got_b(type, n);
      NCCL_OK(NCCL(ncclGroupStart)());
      NCCL_OK(NCCL(ncclSend)(a.device, n, type, next, comm, s));
      NCCL_OK(NCCL(ncclSend)(b.device, n, type, next, comm, s));
      NCCL_OK(NCCL(ncclRecv)(got_a.device, n, type, prev, comm, s));
      NCCL_OK(NCCL(ncclRecv)(got_b.device, n, type, prev, comm, s));
      NCCL_OK(NCCL(ncclGroupEnd)());
      expect_equal(got_a.read(), [prev](size_t i) { return value(prev, i); }, "first message");
      expect_equal(got_b.read(), [prev](size_t i) { return value(prev, i + 3); }, "second message");
    }
    {
      // A ring in one group, each rank receiving before it sends (the group must pair them).
      const int next = (me + 1) % world, prev = (me + world - 1) % world;
      Buffer in(type, n, [me](size_t i) { return value(me, i); }), out(type, n);
      NCCL_OK(NCCL(ncclGroupStart)());
      NCCL_OK(NCCL(ncclRecv)(out.device, n, type, prev, comm, s));
      NCCL_OK(NCCL(ncclSend)(in.device, n, type, next, comm, s));
      NCCL_OK(NCCL(ncclGroupEnd)());
      expect_equal(out.read(), [prev](size_t i) { return value(prev, i); }, "send / receive ring");
    }
    if (type == ncclFloat32) {
      Buffer in(type, n, [me](size_t i) { return value(me, i); }), out(type, n), avg(type, n);
      const float half = 0.5f;
      ncclRedOp_t premul;
      NCCL_OK(NCCL(ncclRedOpCreatePreMulSum)(&premul, const_cast<float*>(&half), type, ncclScalarHostImmediate, comm));
      NCCL_OK(NCCL(ncclAllReduce)(in.device, out.device, n, type, premul, comm, s));
      expect_equal(out.read(), [world](size_t i) { return 0.5f * sum_over_ranks(world, i); }, "pre-multiplied sum");
      NCCL_OK(NCCL(ncclRedOpDestroy)(premul, comm));
      // A scalar on the device, the op destroyed inside the group (NCCL allows it once the call
      // that takes it has returned; torch's coalesced calls do so).
      Buffer quarter(type, 1, [](size_t) { return 0.25f; });
      NCCL_OK(NCCL(ncclRedOpCreatePreMulSum)(&premul, quarter.device, type, ncclScalarDevice, comm));
      NCCL_OK(NCCL(ncclGroupStart)());
      NCCL_OK(NCCL(ncclAllReduce)(in.device, out.device, n, type, premul, comm, s));
      NCCL_OK(NCCL(ncclRedOpDestroy)(premul, comm));
      NCCL_OK(NCCL(ncclGroupEnd)());
      expect_equal(out.read(), [world](size_t i) { return 0.25f * sum_over_ranks(world, i); },
                   "pre-multiplied sum, device scalar, in a group");
      NCCL_OK(NCCL(ncclAllReduce)(in.device, avg.device, n, type, ncclAvg, comm, s));
      expect_equal(avg.read(), [world](size_t i) { return sum_over_ranks(world, i) / static_cast<float>(world); },
                   "average");
      // Max ignores NaN unless every rank holds NaN there (NCCL's fmaxf): rank 0's NaN at even
      // places is not the answer, everyone's at every fifth is.
      Buffer nan(type, n, [me](size_t i) { return i % 5 == 0 || (me == 0 && i % 2 == 0) ? NAN : value(me, i); });
      NCCL_OK(NCCL(ncclAllReduce)(nan.device, out.device, n, type, ncclMax, comm, s));
      expect_equal(out.read(), [world](size_t i) { return i % 5 == 0 ? NAN : value(world - 1, i); }, "max with NaN");
    }
    CUDA_OK(cudaStreamDestroy(s));
  });
}

TEST(stand_in_moves_every_collective_exactly) {
  require_gpu();
  for (int world : {2, 3, 4, 8})
    for (ncclDataType_t type : {ncclFloat32, ncclBfloat16, ncclFloat16, ncclInt32}) every_collective(world, type);
}

TEST(stand_in_runs_a_group_of_every_rank_from_one_thread) {
  require_gpu();
  const int world = 3;
  std::vector<ncclComm_t> comms(world);
  const std::vector<int> devices(world, 0);
  NCCL_OK(NCCL(ncclCommInitAll)(comms.data(), world, devices.data()));
  std::vector<Buffer*> ins, outs;
  for (int r = 0; r < world; ++r) {
    ins.push_back(new Buffer(ncclFloat32, kCount, [r](size_t i) { return value(r, i); }));
    outs.push_back(new Buffer(ncclFloat32, kCount));
  }
  NCCL_OK(NCCL(ncclGroupStart)());
  for (int r = 0; r < world; ++r)
    NCCL_OK(NCCL(ncclAllReduce)(ins[r]->device, outs[r]->device, kCount, ncclFloat32, ncclSum, comms[r], nullptr));
  NCCL_OK(NCCL(ncclGroupEnd)());
  for (int r = 0; r < world; ++r) {
    expect_equal(outs[r]->read(), [world](size_t i) { return sum_over_ranks(world, i); }, "grouped all_reduce");
    delete ins[r];
    delete outs[r];
    NCCL_OK(NCCL(ncclCommDestroy)(comms[r]));
  }
}

TEST(stand_in_names_a_rank_that_never_comes) {
  require_gpu();
  on_ranks(2, [](int me, ncclComm_t comm) {
    if (me == 1) return;  // never calls
    Buffer in(ncclFloat32, kCount, [](size_t i) { return value(0, i); });
    EXPECT(NCCL(ncclAllReduce)(in.device, in.device, kCount, ncclFloat32, ncclSum, comm, nullptr) == ncclRemoteError);
    const std::string why = NCCL(ncclGetLastError)(comm);
    EXPECT(why.find("rank 1 of 2 never came") != std::string::npos);
  });
}

TEST(stand_in_refuses_calls_that_differ_across_ranks) {
  require_gpu();
  on_ranks(2, [](int me, ncclComm_t comm) {
    Buffer in(ncclFloat32, kCount, [me](size_t i) { return value(me, i); });
    // The same bytes, another op: the header says so on both ranks.
    EXPECT(NCCL(ncclAllReduce)(in.device, in.device, kCount, ncclFloat32, me == 0 ? ncclSum : ncclMax, comm, nullptr) ==
           ncclInvalidUsage);
    EXPECT(std::string(NCCL(ncclGetLastError)(comm)).find("ranks made different calls") != std::string::npos);
    // And the communicator stays failed: its call numbers may differ across ranks now.
    EXPECT(NCCL(ncclAllReduce)(in.device, in.device, kCount, ncclFloat32, ncclSum, comm, nullptr) == ncclInvalidUsage);
    EXPECT(std::string(NCCL(ncclGetLastError)(comm)).find("an earlier call on this communicator failed") !=
           std::string::npos);
    ncclResult_t async = ncclSuccess;
    NCCL_OK(NCCL(ncclCommGetAsyncError)(comm, &async));
    EXPECT(async == ncclInvalidUsage);  // what PyTorch's watchdog reads
  });
}

TEST(stand_in_refuses_a_call_under_graph_capture) {
  require_gpu();
  on_ranks(1, [](int, ncclComm_t comm) {
    Buffer in(ncclFloat32, kCount, [](size_t i) { return value(0, i); });
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    const ncclResult_t r = NCCL(ncclAllReduce)(in.device, in.device, kCount, ncclFloat32, ncclSum, comm, s);
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphDestroy(graph));
    CUDA_OK(cudaStreamDestroy(s));
    EXPECT(r == ncclInvalidUsage);
  });
}

}  // namespace

// A crash says where (the GPU machines have no debugger).
void print_backtrace(int signal) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, 2);
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

int main(int argc, char** argv) {
  std::signal(SIGSEGV, print_backtrace);
  // Before the stand-in's first call (it reads these once); its files in a folder of their own.
  char dir[] = "/tmp/symmem-fake-nccl-data-XXXXXX";
  if (!mkdtemp(dir)) return 1;
  setenv("SYMMEM_FAKE_NCCL_MEETING_DIR", dir, 1);
  setenv("SYMMEM_FAKE_NCCL_MOVE_DATA", "1", 1);
  setenv("SYMMEM_NCCL_TIMEOUT_MS", "3000", 1);
  const int rc = symmem::test::run_all(argc, argv);
  const std::string remove = std::string("rm -rf ") + dir;
  if (std::system(remove.c_str()) != 0) return rc == 0 ? 1 : rc;
  return rc;
}
