// All-reduce and reduce-scatter: against a float64 host reference on random data for every type,
// odd counts, every algorithm, in and out of place; identical bits on every rank; thousands of
// back-to-back calls of changing size and algorithm; graph replay with inputs changed in place.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "fixture.hpp"
#include "test.hpp"
#include "test_kernels.hpp"

using namespace symmem;
using namespace symmem::test;

namespace {

const DataType kTypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16, DataType::kInt32};

// Rank r's input: uniform in [-1, 1) (integers in [-1000, 1000] for int32), as the stored type.
std::vector<uint8_t> random_input(int rank, size_t count, DataType type, uint64_t salt) {
  std::mt19937_64 rng(mix_seed(rank, count, salt));
  std::uniform_real_distribution<float> real(-1.f, 1.f);
  std::uniform_int_distribution<int> integer(-1000, 1000);
  const size_t elem = dtype_size(type);
  std::vector<uint8_t> out(count * elem);
  for (size_t i = 0; i < count; ++i) {
    uint8_t* p = out.data() + i * elem;
    switch (type) {
      case DataType::kFloat32: {
        float f = real(rng);
        std::memcpy(p, &f, 4);
        break;
      }
      case DataType::kFloat16: {
        __half h = __float2half(real(rng));
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        __nv_bfloat16 h = __float2bfloat16(real(rng));
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kInt32: {
        int32_t v = integer(rng);
        std::memcpy(p, &v, 4);
        break;
      }
      default: break;
    }
  }
  return out;
}

// Accumulation in fp32, one rounding to the output type: half an ulp of the output plus slack.
double tolerance(DataType type, double reference, double magnitude) {
  switch (type) {
    case DataType::kFloat32: return 1e-6 * magnitude + 1e-7;
    case DataType::kFloat16: return std::fabs(reference) * (1.0 / 1024) + 1e-4;
    case DataType::kBFloat16: return std::fabs(reference) * (1.0 / 128) + 1e-3;
    default: return 0;
  }
}

// Elements of `got` farther from the float64 reduction of every rank's input than the tolerance.
long count_wrong(const std::vector<uint8_t>& got, const std::vector<std::vector<uint8_t>>& inputs, size_t first,
                 size_t count, DataType type, ReduceOp op) {
  long wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    double ref = element_to_double(inputs[0].data(), type, first + i), magnitude = std::fabs(ref);
    for (size_t r = 1; r < inputs.size(); ++r) {
      const double v = element_to_double(inputs[r].data(), type, first + i);
      magnitude += std::fabs(v);
      ref = op == ReduceOp::kSum ? ref + v : op == ReduceOp::kMax ? std::max(ref, v) : std::min(ref, v);
    }
    const double g = element_to_double(got.data(), type, i);
    if (!(std::fabs(g - ref) <= tolerance(type, ref, magnitude))) ++wrong;  // NaN counts as wrong
  }
  return wrong;
}

}  // namespace

TEST(all_reduce_matches_a_float64_reference_on_every_rank) {
  Fixture& fx = Fixture::get();
  const size_t max_count = 1000003;
  Buffer* heap_in = fx.comm->allocate(max_count * 4);
  Buffer* heap_out = fx.comm->allocate(max_count * 4);
  DeviceBuffer dev_in(max_count * 4), dev_out(max_count * 4);
  long wrong = 0, skipped = 0, differing = 0;
  for (DataType type : kTypes) {
    for (size_t count : {size_t(1), size_t(3), size_t(4097), max_count}) {
      const size_t bytes = count * dtype_size(type);
      std::vector<std::vector<uint8_t>> inputs;
      for (int r = 0; r < fx.world(); ++r) inputs.push_back(random_input(r, count, type, 1));
      for (Algo algo : {Algo::kAuto, Algo::kOneShot, Algo::kOneShotPush, Algo::kTwoShot, Algo::kTwoShotPush,
                        Algo::kLowLatency, Algo::kLowLatencyTwoShot}) {
        for (int where = 0; where < 3; ++where) {  // heap, heap in place, plain device memory
          const Operand out_operand = where == 2 ? Operand(dev_out.ptr) : Operand(heap_out);
          const Operand in_operand = where == 1 ? out_operand : where == 2 ? Operand(dev_in.ptr) : Operand(heap_in);
          char* out = static_cast<char*>(out_operand.ptr());
          char* in = static_cast<char*>(in_operand.ptr());
          CollectiveOptions o;
          o.algo = algo;
          try {
            describe_all_reduce(out_operand, in_operand, count, type, *fx.comm, o);
          } catch (const Error&) {
            ++skipped;  // e.g. low latency past its capacity: the same on every rank
            continue;
          }
          // Stream-ordered: a pageable cudaMemcpy may return before its DMA lands.
          TEST_CUDA(cudaMemcpyAsync(in, inputs[fx.rank()].data(), bytes, cudaMemcpyHostToDevice, fx.stream));
          if (out != in) TEST_CUDA(cudaMemsetAsync(out, 0xFF, bytes, fx.stream));  // poison: NaN / -1
          all_reduce(out_operand, in_operand, count, type, ReduceOp::kSum, *fx.comm, fx.stream, o);
          fx.comm->synchronize(fx.stream);
          const std::vector<uint8_t> got = download(out, bytes);
          const long bad = count_wrong(got, inputs, 0, count, type, ReduceOp::kSum);
          if (bad && wrong < 5)
            std::printf("rank %d: all_reduce %s count %zu %s placement %d: %ld wrong\n", fx.rank(), dtype_name(type),
                        count, algo_name(algo), where, bad);
          wrong += bad;
          if (!fx.same_everywhere(hash_bytes(got))) ++differing;
        }
      }
    }
  }
  // max and min on one shape.
  for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
    const size_t count = 4097;
    std::vector<std::vector<uint8_t>> inputs;
    for (int r = 0; r < fx.world(); ++r) inputs.push_back(random_input(r, count, DataType::kFloat32, 2));
    TEST_CUDA(cudaMemcpyAsync(heap_in->ptr(), inputs[fx.rank()].data(), count * 4, cudaMemcpyHostToDevice, fx.stream));
    all_reduce(heap_out, heap_in, count, DataType::kFloat32, op, *fx.comm, fx.stream);
    fx.comm->synchronize(fx.stream);
    wrong += count_wrong(download(heap_out->ptr(), count * 4), inputs, 0, count, DataType::kFloat32, op);
  }
  fx.comm->free(heap_out);
  fx.comm->free(heap_in);
  EXPECT_EQ(fx.sum(wrong), 0L);
  EXPECT_EQ(differing, 0L);
  EXPECT(skipped < 4 * 4 * 7 * 3);
}

TEST(reduce_scatter_matches_a_float64_reference) {
  Fixture& fx = Fixture::get();
  const int world = fx.world();
  const size_t max_count = 250007;
  Buffer* heap_in = fx.comm->allocate(max_count * 4 * world);
  Buffer* heap_out = fx.comm->allocate(max_count * 4);
  DeviceBuffer dev_in(max_count * 4 * world), dev_out(max_count * 4);
  long wrong = 0;
  for (DataType type : kTypes) {
    for (size_t count : {size_t(1), size_t(3), size_t(4097), max_count}) {
      const size_t bytes = count * dtype_size(type);
      std::vector<std::vector<uint8_t>> inputs;
      for (int r = 0; r < world; ++r) inputs.push_back(random_input(r, count * world, type, 3));
      for (Algo algo : {Algo::kAuto, Algo::kTwoShot, Algo::kTwoShotPush, Algo::kLowLatency}) {
        for (int where = 0; where < 3; ++where) {  // heap, heap in place, plain device memory
          // In place: the output is this rank's slice of the (symmetric) input.
          const Operand in_operand = where == 2 ? Operand(dev_in.ptr) : Operand(heap_in);
          const Operand out_operand = where == 1   ? Operand(heap_in, fx.rank() * bytes)
                                      : where == 2 ? Operand(dev_out.ptr)
                                                   : Operand(heap_out);
          char* in = static_cast<char*>(in_operand.ptr());
          char* out = static_cast<char*>(out_operand.ptr());
          TEST_CUDA(cudaMemcpyAsync(in, inputs[fx.rank()].data(), bytes * world, cudaMemcpyHostToDevice, fx.stream));
          if (where != 1) TEST_CUDA(cudaMemsetAsync(out, 0xFF, bytes, fx.stream));
          CollectiveOptions o;
          o.algo = algo;
          reduce_scatter(out_operand, in_operand, count, type, ReduceOp::kSum, *fx.comm, fx.stream, o);
          fx.comm->synchronize(fx.stream);
          const std::vector<uint8_t> got = download(out, bytes);
          const long bad = count_wrong(got, inputs, fx.rank() * count, count, type, ReduceOp::kSum);
          if (bad && wrong < 5)
            std::printf("rank %d: reduce_scatter %s count %zu %s placement %d: %ld wrong\n", fx.rank(),
                        dtype_name(type), count, algo_name(algo), where, bad);
          wrong += bad;
        }
      }
    }
  }
  fx.comm->free(heap_out);
  fx.comm->free(heap_in);
  EXPECT_EQ(fx.sum(wrong), 0L);
}

TEST(reductions_10000_back_to_back_calls_with_changing_sizes_and_algorithms) {
  Fixture& fx = Fixture::get();
  const int world = fx.world();
  constexpr int kCalls = 10000;
  constexpr size_t kMaxCount = 40000;
  Buffer* in = fx.comm->allocate(kMaxCount * 4 * world);
  Buffer* out = fx.comm->allocate(kMaxCount * 4);
  MismatchCounter mismatches;
  // Parity-alternating kernels (low latency, one-shot push, reduce-scatter push) interleave with
  // the barrier kernels, so that every order of the two kinds occurs at changing grid sizes.
  const Algo algos[] = {Algo::kOneShot,    Algo::kLowLatencyTwoShot, Algo::kOneShotPush, Algo::kTwoShot,
                        Algo::kLowLatency, Algo::kTwoShotPush,       Algo::kOneShotPush, Algo::kAuto};
  constexpr int kAlgos = sizeof(algos) / sizeof(algos[0]);
  for (int i = 0; i < kCalls; ++i) {
    const size_t count = 1 + (size_t(i) * 7919) % kMaxCount;
    const DataType type = i % 3 == 0 ? DataType::kFloat32 : DataType::kBFloat16;
    const uint64_t seed = pattern_seed(fx.rank(), i);
    if (i % 5 == 4) {  // a reduce-scatter between the all-reduces
      fill_small_integers(in->ptr(), count * world, type, seed, fx.stream);
      CollectiveOptions o;
      const Algo rs_algos[] = {Algo::kTwoShot, Algo::kTwoShotPush, Algo::kLowLatency};
      o.algo = rs_algos[(i / 5) % 3];
      reduce_scatter(out, in, count, type, ReduceOp::kSum, *fx.comm, fx.stream, o);
      count_sum_mismatches(out->ptr(), count, fx.rank() * count, type, world, i, mismatches.get(), fx.stream);
    } else {
      fill_small_integers(in->ptr(), count, type, seed, fx.stream);
      CollectiveOptions o;
      o.algo = algos[i % kAlgos];
      all_reduce(out, in, count, type, ReduceOp::kSum, *fx.comm, fx.stream, o);
      count_sum_mismatches(out->ptr(), count, 0, type, world, i, mismatches.get(), fx.stream);
    }
  }
  fx.comm->synchronize(fx.stream);
  const long wrong = mismatches.read(fx.stream);
  fx.comm->free(out);
  fx.comm->free(in);
  EXPECT_EQ(fx.sum(wrong), 0L);
}

TEST(all_reduce_graph_replays_follow_inputs_changed_in_place) {
  Fixture& fx = Fixture::get();
  const size_t count = 70001;
  Buffer* in = fx.comm->allocate(count * 2);
  Buffer* out = fx.comm->allocate(count * 2);
  long wrong = 0;
  for (Algo algo : {Algo::kOneShot, Algo::kOneShotPush, Algo::kTwoShot, Algo::kTwoShotPush, Algo::kLowLatency,
                    Algo::kLowLatencyTwoShot}) {
    CollectiveOptions o;
    o.algo = algo;
    // An eager call before the capture (capture no longer needs one: the workspaces exist from
    // creation), so that the replays follow an eager call of the same algorithm.
    all_reduce(out, in, count, DataType::kBFloat16, ReduceOp::kSum, *fx.comm, fx.stream, o);
    fx.comm->synchronize(fx.stream);
    CapturedGraph graph(
        fx.stream, [&] { all_reduce(out, in, count, DataType::kBFloat16, ReduceOp::kSum, *fx.comm, fx.stream, o); });
    MismatchCounter mismatches;
    for (int replay = 0; replay < 20; ++replay) {
      const uint64_t iteration = 2000000 + replay;
      mismatches.reset(fx.stream);
      fill_small_integers(in->ptr(), count, DataType::kBFloat16, pattern_seed(fx.rank(), iteration), fx.stream);
      TEST_CUDA(cudaMemsetAsync(out->ptr(), 0xFF, count * 2, fx.stream));
      graph.launch(fx.stream);
      count_sum_mismatches(out->ptr(), count, 0, DataType::kBFloat16, fx.world(), iteration, mismatches.get(),
                           fx.stream);
      fx.comm->synchronize(fx.stream);
      if (const long bad = mismatches.read(fx.stream)) {
        ++wrong;
        std::printf("rank %d: %s replay %d: %ld wrong\n", fx.rank(), algo_name(algo), replay, bad);
      }
    }
  }
  fx.comm->free(out);
  fx.comm->free(in);
  EXPECT_EQ(fx.sum(wrong), 0L);
}
