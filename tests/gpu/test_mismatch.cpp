// Ranks that call different things (scenario 4 of the ownership and mismatch tests). Every rank must
// raise kMismatch, or kAborted where another rank's failure reached it first, within the
// deadline plus a few seconds: never success, never a hang. The message names the ranks and both
// calls, with the values that differ. Each case runs on a communicator of its own with a 3 s
// deadline (a failed communicator is unusable). In the old tree these calls timed out (kTimeout)
// or returned garbage.
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "api_compat.hpp"
#include "fixture.hpp"
#include "oracle.hpp"
#include "test.hpp"
#include "test_kernels.hpp"

using namespace symmem;
using namespace symmem::test;

namespace {

constexpr int64_t kTimeoutMs = 3000;
constexpr size_t kBufferBytes = size_t(1) << 20;  // per rank: the largest input of any case

// Calls `mine` (which differs across ranks) on a fresh communicator with symmetric buffers `in`
// (kBufferBytes, random data) and `out` (kBufferBytes * world), then checks every rank failed as
// a mismatch whose message contains `names` (see expect_mismatch_everywhere). Problems, agreed.
long mismatch_case(const std::string& what, const std::vector<std::string>& names,
                   const std::function<void(Communicator&, Buffer* in, Buffer* out, cudaStream_t)>& mine) {
  Fixture& fx = Fixture::get();
  auto comm = fresh_communicator(kTimeoutMs, size_t(16) << 20);
  Buffer* in = comm->allocate(kBufferBytes);
  Buffer* out = comm->allocate(kBufferBytes * fx.world());
  fill_exact(in->ptr(), kBufferBytes / 4, DataType::kFloat32, mix_seed(fx.rank(), 11), fx.stream);
  TEST_CUDA(cudaStreamSynchronize(fx.stream));
  fx.bootstrap->barrier();
  const Outcome o = run_and_synchronize(*comm, fx.stream, [&] { mine(*comm, in, out, fx.stream); });
  const long problems = expect_mismatch_everywhere(what, o, kTimeoutMs / 1000.0 + 5, names);
  comm.reset();  // local release: the communicator has failed (or must be dropped anyway)
  return problems;
}

CollectiveOptions with(Algo algo) {
  CollectiveOptions o;
  o.algo = algo;
  return o;
}

}  // namespace

TEST(mismatched_calls_fail_on_every_rank) {
  Fixture& fx = Fixture::get();
  if (fx.world() < 2) SKIP("needs two ranks");
  const bool first = fx.rank() == 0;  // rank 0 calls one thing, every other rank another
  long problems = 0;

  // Element counts: 100000 fp16 on rank 0, 100002 on the others.
  problems += mismatch_case("all_gather count 100000 vs 100002", {"all_gather(", "all_gather(", "100000", "100002"},
                            [&](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
                              all_gather(sym(out), sym(in), first ? 100000 : 100002, DataType::kFloat16, c, s);
                            });
  // The same bytes as different types.
  problems +=
      mismatch_case("all_gather bfloat16 vs float16", {"bfloat16", "float16", "float16"},
                    [&](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
                      all_gather(sym(out), sym(in), 100000, first ? DataType::kBFloat16 : DataType::kFloat16, c, s);
                    });
  // Different collectives.
  problems += mismatch_case("all_gather vs all_reduce", {"all_gather(", "all_reduce("},
                            [&](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
                              if (first)
                                all_gather(sym(out), sym(in), 65536, DataType::kBFloat16, c, s);
                              else
                                all_reduce(sym(out), sym(in), 65536, DataType::kBFloat16, ReduceOp::kSum, c, s);
                            });
  // Different algorithms of one collective.
  problems += mismatch_case("all_reduce low_latency vs two_shot", {"low_latency", "two_shot"},
                            [&](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
                              all_reduce(sym(out), sym(in), 16384, DataType::kBFloat16, ReduceOp::kSum, c, s,
                                         with(first ? Algo::kLowLatency : Algo::kTwoShot));
                            });
  // The low-latency all-gather against another low-latency collective (one receive area, other
  // signatures in the lines) and against a barrier algorithm.
  problems += mismatch_case("all_gather low_latency vs all_reduce low_latency", {"all_gather(", "all_reduce("},
                            [&](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
                              if (first)
                                all_gather(sym(out), sym(in), 8192, DataType::kBFloat16, c, s,
                                           with(Algo::kLowLatency));
                              else
                                all_reduce(sym(out), sym(in), 8192, DataType::kBFloat16, ReduceOp::kSum, c, s,
                                           with(Algo::kLowLatency));
                            });
  problems += mismatch_case("all_gather low_latency vs push", {"low_latency", "push"},
                            [&](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
                              all_gather(sym(out), sym(in), 8192, DataType::kBFloat16, c, s,
                                         with(first ? Algo::kLowLatency : Algo::kPush));
                            });
  problems += mismatch_case("reduce_scatter low_latency vs all_reduce low_latency", {"reduce_scatter(", "all_reduce("},
                            [&](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
                              if (first)
                                reduce_scatter(sym(out), sym(in), 4096, DataType::kFloat32, ReduceOp::kSum, c, s,
                                               with(Algo::kLowLatency));
                              else
                                all_reduce(sym(out), sym(in), 4096, DataType::kFloat32, ReduceOp::kSum, c, s,
                                           with(Algo::kLowLatency));
                            });
  // (Reduce-scatter's two_shot is named for what it does, pull: src/plan/algorithms.cpp.)
  problems += mismatch_case("reduce_scatter low_latency vs two_shot", {"low_latency", "pull"},
                            [&](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
                              reduce_scatter(sym(out), sym(in), 4096, DataType::kFloat32, ReduceOp::kSum, c, s,
                                             with(first ? Algo::kLowLatency : Algo::kTwoShot));
                            });
  // Different reduce ops.
  problems += mismatch_case("all_reduce sum vs max", {"all_reduce(", "all_reduce(", "sum", "max"},
                            [&](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
                              all_reduce(sym(out), sym(in), 65536, DataType::kFloat32,
                                         first ? ReduceOp::kSum : ReduceOp::kMax, c, s, with(Algo::kTwoShot));
                            });
  // The copy engines on one side, SM loads on the other.
  problems += mismatch_case("all_gather copy_engine vs pull", {"copy_engine", "pull"},
                            [&](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
                              all_gather(sym(out), sym(in), 262144, DataType::kUInt8, c, s,
                                         with(first ? Algo::kCopyEngine : Algo::kPull));
                            });
  // Counts of a reduce-scatter (per rank).
  problems += mismatch_case(
      "reduce_scatter count 50000 vs 50002", {"reduce_scatter(", "reduce_scatter(", "50000", "50002"},
      [&](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
        reduce_scatter(sym(out), sym(in), first ? 50000 : 50002, DataType::kBFloat16, ReduceOp::kSum, c, s);
      });
  EXPECT_EQ(problems, 0L);
}

// Scenario 3's environment half: SYMMEM_* overrides that a plan depends on, set differently on
// the ranks, made ranks plan different algorithms in the old tree. Creation must now fail on every
// rank, naming the variable; nothing is launched.
TEST(settings_that_differ_across_ranks_fail_creation_naming_them) {
  Fixture& fx = Fixture::get();
  if (fx.world() < 2) SKIP("needs two ranks");
  const bool first = fx.rank() == 0;
  struct Setting {
    const char* name;
    const char* on_rank0;
    const char* elsewhere;
  };
  const Setting settings[] = {{"SYMMEM_ALGO", "pull", "push"},
                              {"SYMMEM_BLOCKS", "8", "16"},
                              {"SYMMEM_WORKSPACE_MB", "64", "128"},
                              {"SYMMEM_CE_DIRECTION", "pull", "push"},
                              {"SYMMEM_TIMEOUT_MS", "3000", "4000"}};
  long problems = 0;
  for (const Setting& s : settings) {
    setenv(s.name, first ? s.on_rank0 : s.elsewhere, 1);
    std::string message;
    bool invalid_argument = false;
    try {
      // timeout_ms < 0 and workspace 0: the environment decides, as a user's default config would.
      CommConfig config;
      auto comm = Communicator::create(fx.bootstrap, fx.job.local_rank, config);
      comm->close();
    } catch (const Error& e) {
      message = e.what();
      invalid_argument = e.code() == ErrorCode::kInvalidArgument;
    }
    unsetenv(s.name);
    if (!invalid_argument || message.find(s.name) == std::string::npos) {
      ++problems;
      std::printf("[ CASE ] %s differs across ranks: rank %d: %s\n", s.name, fx.rank(),
                  message.empty() ? "creation succeeded" : message.c_str());
    }
    fx.bootstrap->barrier();
  }
  EXPECT_EQ(fx.sum(problems), 0L);
}
