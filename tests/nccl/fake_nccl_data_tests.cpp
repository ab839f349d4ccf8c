// The stand-in NCCL's data path (SYMMEM_FAKE_NCCL_MOVE_DATA=1, fake_nccl_exchange.cpp), which the
// torch GPU suite takes as its reference on one GPU: every collective, rooted or not, sends and
// receives, in and out of groups, at 2, 3, 4 and 8 ranks (threads sharing GPU 0), held to results
// computed here from the inputs' formula; one thread driving every rank in a group; a rank that
// never comes named within the deadline; a call under graph capture refused. Inputs are small
// integers, so every reduction is exact in every type.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <dlfcn.h>
#include <execinfo.h>
#include <stdlib.h>

#include <cmath>
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
// which a machine without a GPU lacks, and this test must load there to say it skipped. NCCL(f) is
// its f.
void* stand_in() {
  static void* library = [] {
    const char* path = std::getenv("FAKE_NCCL");
    return dlopen(path && *path ? path : SYMMEM_FAKE_NCCL_PATH, RTLD_NOW | RTLD_LOCAL);
  }();
  if (!library) throw symmem::test::Skipped(std::string("cannot open the stand-in NCCL: ") + dlerror());
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

// A device buffer of `n` floats or bf16, filled from `fill` or poisoned; read back as floats.
struct Buffer {
  ncclDataType_t type;
  size_t n;
  void* device = nullptr;
  Buffer(ncclDataType_t t, size_t count, const std::function<float(size_t)>& fill = nullptr) : type(t), n(count) {
    CUDA_OK(cudaMalloc(&device, bytes()));
    if (type == ncclBfloat16) {
      std::vector<__nv_bfloat16> host(n, __float2bfloat16(kPoison));
      for (size_t i = 0; fill && i < n; ++i) host[i] = __float2bfloat16(fill(i));
      CUDA_OK(cudaMemcpy(device, host.data(), bytes(), cudaMemcpyHostToDevice));
    } else {
      std::vector<float> host(n, kPoison);
      for (size_t i = 0; fill && i < n; ++i) host[i] = fill(i);
      CUDA_OK(cudaMemcpy(device, host.data(), bytes(), cudaMemcpyHostToDevice));
    }
  }
  ~Buffer() { cudaFree(device); }
  size_t bytes() const { return n * (type == ncclBfloat16 ? 2 : 4); }
  std::vector<float> read() const {
    std::vector<float> out(n);
    if (type == ncclBfloat16) {
      std::vector<__nv_bfloat16> host(n);
      CUDA_OK(cudaMemcpy(host.data(), device, bytes(), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; ++i) out[i] = __bfloat162float(host[i]);
    } else {
      CUDA_OK(cudaMemcpy(out.data(), device, bytes(), cudaMemcpyDeviceToHost));
    }
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
    for (ncclDataType_t type : {ncclFloat32, ncclBfloat16}) every_collective(world, type);
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
