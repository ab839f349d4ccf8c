// Calls of one communicator on several streams run in host order (src/comm/call_order.hpp), and a
// CUDA graph that captured a call holds the communicator (src/comm/graph_references.hpp).
// On 8ad5a53 the first case returned wrong sums: two staged all-reduces on unordered streams
// shared the staging workspace (first found through symmem.torch).
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "device_memory.hpp"
#include "fixture.hpp"
#include "test.hpp"
#include "test_kernels.hpp"

using namespace symmem;
using namespace symmem::test;

namespace {

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { TEST_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

}  // namespace

// Local (staged) operands on three streams, each call delayed on its stream by a different amount
// so that, unordered, they would run at once: every sum exact.
TEST(calls_on_several_streams_run_in_host_order) {
  Fixture& fx = Fixture::get();
  constexpr size_t kCount = size_t(4) << 20;  // 16 MiB of float32 per call: staged in chunks
  constexpr int kStreams = 3, kIterations = 24;
  Stream streams[kStreams];
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  for (int s = 0; s < kStreams; ++s) buffers.push_back(std::make_unique<DeviceBuffer>(kCount * 4));
  Counters counters(kStreams * kIterations);
  fx.sync();
  for (int it = 0; it < kIterations; ++it) {
    for (int s = 0; s < kStreams; ++s) {
      const uint64_t iteration = uint64_t(it) * kStreams + s;
      cudaStream_t stream = streams[s].s;
      fill_small_integers(buffers[s]->ptr, kCount, DataType::kFloat32, pattern_seed(fx.rank(), iteration), stream);
      launch_delay(((it + s) % 4) * 15, stream);
      all_reduce(buffers[s]->ptr, buffers[s]->ptr, kCount, DataType::kFloat32, ReduceOp::kSum, *fx.comm, stream);
      count_sum_mismatches(buffers[s]->ptr, kCount, 0, DataType::kFloat32, fx.world(), iteration,
                           counters.at(iteration), stream);
    }
  }
  long wrong = 0;
  for (auto& s : streams) TEST_CUDA(cudaStreamSynchronize(s.s));
  for (auto n : counters.read(fx.stream)) wrong += long(n);
  fx.comm->check();
  EXPECT(fx.sum(wrong) == 0);
}

TEST(a_graph_that_captured_a_call_holds_its_communicator) {
  Fixture& fx = Fixture::get();
  constexpr size_t kCount = 1 << 16;
  DeviceBuffer data(kCount * 4);
  fill_small_integers(data.ptr, kCount, DataType::kFloat32, 1, fx.stream);
  all_reduce(data.ptr, data.ptr, kCount, DataType::kFloat32, ReduceOp::kSum, *fx.comm, fx.stream);  // eager first
  fx.sync();
  const int before = fx.comm->live_graphs();
  {
    CapturedGraph graph(fx.stream, [&] {
      all_reduce(data.ptr, data.ptr, kCount, DataType::kFloat32, ReduceOp::kSum, *fx.comm, fx.stream);
      all_reduce(data.ptr, data.ptr, kCount, DataType::kFloat32, ReduceOp::kMax, *fx.comm, fx.stream);
    });
    EXPECT(fx.comm->live_graphs() == before + 1);  // one reference per graph, however many calls
    graph.launch(fx.stream);
    fx.sync();
    EXPECT(fx.comm->live_graphs() == before + 1);
  }
  // CUDA destroys a graph's user objects soon after the graph, on a thread of its own.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (fx.comm->live_graphs() != before && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT(fx.comm->live_graphs() == before);
  fx.comm->check();
}
