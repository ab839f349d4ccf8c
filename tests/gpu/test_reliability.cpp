// Failure behaviour: a rank that never joins makes the others fail with a timeout naming it (SM,
// low-latency and copy-engine paths), bad input is refused with clear errors, teardown leaks
// nothing, and the copy-engine all-gather runs while every SM is busy (it uses none).

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "test.hpp"
#include "test_kernels.hpp"

using namespace symmem;
using namespace symmem::test;

namespace {

// Every rank but the last calls `op` on a fresh communicator with a short deadline; the last
// rank never joins. The others must fail with kTimeout naming the last rank, well within the
// deadline plus slack, and every later call must fail fast with kAborted.
void expect_dead_peer_timeout(const char* what, void (*op)(Communicator&, Buffer*, Buffer*, cudaStream_t)) {
  Fixture& fx = Fixture::get();
  if (fx.world() < 2) SKIP("needs two ranks");
  CommConfig config;
  config.timeout_ms = 1500;
  auto comm = Communicator::create(fx.bootstrap, fx.job.local_rank, config);
  Buffer* in = comm->allocate(1 << 20);
  Buffer* out = comm->allocate(fx.world() << 20);
  const int dead = fx.world() - 1;
  // One call with every rank first: whatever the call allocates collectively (staging, receive
  // areas) exists before the last rank stops joining.
  op(*comm, in, out, fx.stream);
  comm->synchronize(fx.stream);
  std::string message;
  long bad = 0;
  if (fx.rank() != dead) {
    const auto start = std::chrono::steady_clock::now();
    try {
      op(*comm, in, out, fx.stream);
      comm->synchronize(fx.stream);
      ++bad;
      std::printf("rank %d: %s finished without its peer\n", fx.rank(), what);
    } catch (const Error& e) {
      message = e.what();
      if (e.code() != ErrorCode::kTimeout) ++bad;
      if (message.find("rank " + std::to_string(dead)) == std::string::npos) ++bad;
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (seconds > 1.5 + 10) ++bad;
    try {
      op(*comm, in, out, fx.stream);
      ++bad;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kAborted) ++bad;
    }
    if (bad) std::printf("rank %d: %s: %s (%.1f s)\n", fx.rank(), what, message.c_str(), seconds);
  }
  EXPECT_EQ(fx.sum(bad), 0L);
  comm.reset();  // local release only: the communicator is aborted
}

}  // namespace

TEST(dead_peer_sm_all_gather_times_out_naming_the_rank) {
  expect_dead_peer_timeout("all_gather(pull)", [](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
    CollectiveOptions o;
    o.algo = Algo::kPull;
    all_gather(out, in, 1 << 20, DataType::kUInt8, c, s, o);
  });
}

TEST(dead_peer_copy_engine_all_gather_times_out_naming_the_rank) {
  expect_dead_peer_timeout("all_gather(copy_engine)", [](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
    CollectiveOptions o;
    o.algo = Algo::kCopyEngine;
    all_gather(out, in, 1 << 20, DataType::kUInt8, c, s, o);
  });
}

TEST(dead_peer_low_latency_all_reduce_times_out_naming_the_rank) {
  expect_dead_peer_timeout("all_reduce(low_latency)", [](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
    CollectiveOptions o;
    o.algo = Algo::kLowLatency;
    all_reduce(out, in, 1024, DataType::kFloat32, ReduceOp::kSum, c, s, o);
  });
}

TEST(dead_peer_low_latency_two_shot_all_reduce_times_out_naming_the_rank) {
  expect_dead_peer_timeout("all_reduce(low_latency_two_shot)",
                           [](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
                             CollectiveOptions o;
                             o.algo = Algo::kLowLatencyTwoShot;
                             all_reduce(out, in, 1 << 16, DataType::kFloat32, ReduceOp::kSum, c, s, o);
                           });
}

TEST(dead_peer_low_latency_all_gather_times_out_naming_the_rank) {
  expect_dead_peer_timeout("all_gather(low_latency)", [](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
    CollectiveOptions o;
    o.algo = Algo::kLowLatency;
    all_gather(out, in, 4096, DataType::kUInt8, c, s, o);
  });
}

TEST(dead_peer_low_latency_reduce_scatter_times_out_naming_the_rank) {
  expect_dead_peer_timeout(
      "reduce_scatter(low_latency)", [](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
        CollectiveOptions o;
        o.algo = Algo::kLowLatency;
        reduce_scatter(out, in, 1024, DataType::kFloat32, ReduceOp::kSum, c, s, o);
      });
}

TEST(dead_peer_two_shot_all_reduce_times_out_naming_the_rank) {
  expect_dead_peer_timeout("all_reduce(two_shot)", [](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
    CollectiveOptions o;
    o.algo = Algo::kTwoShot;
    all_reduce(out, in, 1 << 18, DataType::kFloat32, ReduceOp::kSum, c, s, o);
  });
}

TEST(dead_peer_two_shot_push_all_reduce_times_out_naming_the_rank) {
  expect_dead_peer_timeout("all_reduce(two_shot_push)", [](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
    CollectiveOptions o;
    o.algo = Algo::kTwoShotPush;
    all_reduce(out, in, 1 << 18, DataType::kFloat32, ReduceOp::kSum, c, s, o);
  });
}

TEST(dead_peer_one_shot_push_all_reduce_times_out_naming_the_rank) {
  expect_dead_peer_timeout("all_reduce(one_shot_push)", [](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
    CollectiveOptions o;
    o.algo = Algo::kOneShotPush;
    all_reduce(out, in, 1 << 16, DataType::kFloat32, ReduceOp::kSum, c, s, o);
  });
}

TEST(dead_peer_reduce_scatter_push_times_out_naming_the_rank) {
  expect_dead_peer_timeout(
      "reduce_scatter(two_shot_push)", [](Communicator& c, Buffer* in, Buffer* out, cudaStream_t s) {
        CollectiveOptions o;
        o.algo = Algo::kTwoShotPush;
        reduce_scatter(out, in, (1 << 18) / c.world(), DataType::kFloat32, ReduceOp::kSum, c, s, o);
      });
}

TEST(bad_input_is_refused_with_the_values_in_the_message) {
  Fixture& fx = Fixture::get();
  std::vector<char> host(4096);
  // A rank's own operands (host memory; an input inside the output that is not this rank's slot,
  // which would be overwritten mid-call): the call is refused (every rank raises it, naming the
  // rank), and the communicator is unusable after, so each case takes a communicator of its own.
  struct Own {
    const char* expect;
    std::function<void(Communicator&, Buffer*)> call;
  };
  const Own own[] = {
      {"host memory",
       [&](Communicator& c, Buffer* b) { all_gather(b, host.data(), 16, DataType::kUInt8, c, fx.stream); }},
      {"overlap", [&](Communicator& c, Buffer* b) { all_gather(b, Operand(b, 1), 16, DataType::kUInt8, c, fx.stream); }},
  };
  for (const Own& k : own) {
    auto comm = Communicator::create(fx.bootstrap, fx.job.local_rank);
    Buffer* b = comm->allocate(4096);
    EXPECT_ERROR(k.call(*comm, b), ErrorCode::kInvalidArgument, k.expect);
    EXPECT_ERROR(comm->check(), ErrorCode::kAborted, "refused the call");
    comm->close();
  }
  // What every rank passes alike (the dtype, the algorithm, the SM budget): a plain error, and the
  // communicator stays usable.
  Buffer* buf = fx.comm->allocate(4096);
  EXPECT_ERROR(all_reduce(buf, buf, 16, DataType::kUInt8, ReduceOp::kSum, *fx.comm, fx.stream),
               ErrorCode::kInvalidArgument, "uint8 is not reducible");
  CollectiveOptions o;
  o.algo = Algo::kOneShot;
  const Operand mine(buf, fx.rank());  // in place: this rank's slot
  EXPECT_ERROR(all_gather(buf, mine, 1, DataType::kUInt8, *fx.comm, fx.stream, o), ErrorCode::kInvalidArgument,
               "not an all-gather algorithm");
  o.algo = Algo::kPull;
  o.max_blocks = 0;
  EXPECT_ERROR(all_gather(buf, mine, 1, DataType::kUInt8, *fx.comm, fx.stream, o), ErrorCode::kInvalidArgument,
               "max_blocks is 0");
  fx.comm->check();
  // Sizes that differ across ranks are named on every rank, and nothing is allocated.
  const size_t size = fx.rank() == 0 ? 4096 : 8192;
  if (fx.world() > 1) EXPECT_ERROR(fx.comm->allocate(size), ErrorCode::kInvalidArgument, "bytes, rank");
  fx.comm->free(buf);
  EXPECT(fx.all(true));
}

TEST(create_and_close_cycles_leak_no_descriptors_or_memory) {
  Fixture& fx = Fixture::get();
  // One cycle first, so that what CUDA creates once per process (pools, stream priority
  // queues) is not counted; every later cycle must give everything back.
  auto cycle = [&] {
    auto comm = Communicator::create(fx.bootstrap, fx.job.local_rank);
    Buffer* in = comm->allocate(32 << 20);
    Buffer* out = comm->allocate(size_t(32 << 20) * fx.world());
    for (Algo algo : {Algo::kPull, Algo::kCopyEngine}) {
      CollectiveOptions o;
      o.algo = algo;
      all_gather(out, in, 32 << 20, DataType::kUInt8, *comm, fx.stream, o);
    }
    comm->synchronize(fx.stream);
    comm->close();
  };
  cycle();
  // A peer releases this rank's memory only when it has closed too.
  fx.bootstrap->barrier();
  TEST_CUDA(cudaDeviceSynchronize());
  const int fds_before = open_descriptors();
  size_t free_before = 0, total = 0;
  TEST_CUDA(cudaMemGetInfo(&free_before, &total));
  for (int i = 0; i < 10; ++i) cycle();
  fx.bootstrap->barrier();
  TEST_CUDA(cudaDeviceSynchronize());
  size_t free_after = 0;
  TEST_CUDA(cudaMemGetInfo(&free_after, &total));
  const int fds_after = open_descriptors();
  const long leaked_mib = (static_cast<long>(free_before) - static_cast<long>(free_after)) >> 20;
  if (fds_after != fds_before || leaked_mib > 8)
    std::printf("rank %d: fds %d -> %d, device memory %ld MiB lower\n", fx.rank(), fds_before, fds_after, leaked_mib);
  EXPECT(fx.all(fds_after == fds_before && leaked_mib <= 8));
}

namespace {

// Runs the copy-engine all-gather while a kernel occupies every SM of every GPU for a few
// seconds; true when the all-gather finished before the SMs were free again.
bool gathers_while_every_sm_is_busy(bool in_place, long* wrong) {
  Fixture& fx = Fixture::get();
  constexpr int kHogMs = 4000;
  const size_t bytes = 8 << 20;
  Buffer* out = fx.comm->allocate(bytes * fx.world());
  Buffer* separate_in = in_place ? nullptr : fx.comm->allocate(bytes);
  // Symmetric operands: a local input would first be copied into the staging area (an SM copy).
  const Operand in = in_place ? Operand(out, fx.rank() * bytes) : Operand(separate_in);
  fill_pattern(in.ptr(), bytes, pattern_seed(fx.rank(), 77), fx.stream);
  fx.sync();
  cudaStream_t hog_stream;
  TEST_CUDA(cudaStreamCreateWithFlags(&hog_stream, cudaStreamNonBlocking));
  cudaEvent_t hog_done, gather_done;
  TEST_CUDA(cudaEventCreateWithFlags(&hog_done, cudaEventDisableTiming));
  TEST_CUDA(cudaEventCreateWithFlags(&gather_done, cudaEventDisableTiming));
  int* never_device = nullptr;  // the hog's release flag, never set: it stops on its clock
  TEST_CUDA(cudaMalloc(&never_device, sizeof(int)));
  TEST_CUDA(cudaMemset(never_device, 0, sizeof(int)));
  TEST_CUDA(cudaDeviceSynchronize());
  fx.bootstrap->barrier();
  launch_sm_hog(fx.sm_count, never_device, kHogMs, hog_stream);
  TEST_CUDA(cudaEventRecord(hog_done, hog_stream));
  fx.bootstrap->barrier();  // every GPU is full before any all-gather starts
  CollectiveOptions o;
  o.max_blocks = 0;  // "no SMs": the planner must take the copy engine
  all_gather(out, in, bytes, DataType::kUInt8, *fx.comm, fx.stream, o);
  TEST_CUDA(cudaEventRecord(gather_done, fx.stream));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kHogMs - 1000);
  cudaError_t state = cudaErrorNotReady;
  while ((state = cudaEventQuery(gather_done)) == cudaErrorNotReady && std::chrono::steady_clock::now() < deadline) {
  }
  const bool busy = cudaEventQuery(hog_done) == cudaErrorNotReady;
  const bool finished_first = state == cudaSuccess && busy;
  TEST_CUDA(cudaStreamSynchronize(hog_stream));
  fx.comm->synchronize(fx.stream);
  MismatchCounter bad;
  count_gather_mismatches(out->ptr(), bytes, fx.world(), 77, bad.get(), fx.stream);
  *wrong += bad.read(fx.stream);
  cudaFree(never_device);
  cudaEventDestroy(hog_done);
  cudaEventDestroy(gather_done);
  cudaStreamDestroy(hog_stream);
  if (separate_in) fx.comm->free(separate_in);
  fx.comm->free(out);
  if (!finished_first)
    std::printf("rank %d: the %s copy-engine all-gather waited for the SMs\n", fx.rank(),
                in_place ? "in-place" : "out-of-place");
  return finished_first;
}

}  // namespace

TEST(copy_engine_all_gather_completes_while_every_sm_is_busy) {
  // Proof that the copy-engine path uses no SM: a kernel occupies every SM of every GPU; the
  // all-gather on another stream must still finish while it runs.
  Fixture& fx = Fixture::get();
  long wrong = 0;
  const bool in_place = gathers_while_every_sm_is_busy(true, &wrong);
  EXPECT(fx.all(in_place));
  EXPECT_EQ(fx.sum(wrong), 0L);
  // Out of place, this rank's own slot is a local device-to-device copy, which the CUDA driver
  // (580, H200) runs on an SM even inside a copy batch that prefers the copy engines; the result
  // is still right, and docs/algorithms.md states this limit. Shown here, not asserted.
  const bool out_of_place = gathers_while_every_sm_is_busy(false, &wrong);
  if (fx.rank() == 0)
    std::printf("note: out-of-place copy-engine all-gather %s while every SM was busy\n",
                out_of_place ? "completed" : "waited for an SM (local copy)");
  EXPECT_EQ(fx.sum(wrong), 0L);
}
