// All-gather: bit-exact against NCCL for every type, odd counts, every algorithm, in and out of
// place, heap and plain device buffers; thousands of back-to-back calls; graph replay.
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "fixture.hpp"
#include "test.hpp"
#include "test_kernels.hpp"

using namespace symmem;
using namespace symmem::test;

namespace {

const Algo kGatherAlgos[] = {Algo::kAuto, Algo::kPull, Algo::kPush, Algo::kCopyEngine, Algo::kLowLatency};
constexpr size_t kLowLatencyMaxBytes = size_t(1) << 20;  // per rank (Workspaces::kLowLatencySlotBytes)

enum class Placement { kHeap, kHeapInPlace, kDevice, kDeviceInPlace };

}  // namespace

TEST(all_gather_is_bit_exact_against_nccl) {
  Fixture& fx = Fixture::get();
  const int world = fx.world();
  // Odd counts take the narrow-vector paths; 65536 is 16-byte aligned for every type (bulk paths).
  const size_t counts[] = {1, 3, 4097, 65536, 1000003};
  const size_t max_bytes = 1000003 * 4;
  Buffer* heap_in = fx.comm->allocate(max_bytes);
  Buffer* heap_out = fx.comm->allocate(max_bytes * world);
  DeviceBuffer dev_in(max_bytes), dev_out(max_bytes * world), nccl_in(max_bytes), nccl_out(max_bytes * world);
  long wrong = 0, calls = 0, skipped = 0;
  for (DataType type :
       {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16, DataType::kInt32, DataType::kUInt8}) {
    const size_t elem = dtype_size(type);
    for (size_t count : counts) {
      const size_t bytes = count * elem;
      // NCCL on its own buffers gives the oracle for this (type, count).
      const uint64_t seed = mix_seed(fx.rank(), count, static_cast<uint64_t>(type));
      fill_pattern(nccl_in.ptr, bytes, seed, fx.stream);
      TEST_CUDA(cudaMemsetAsync(nccl_out.ptr, 0xEE, bytes * world, fx.stream));
      static const ncclDataType_t nccl_types[] = {ncclFloat32, ncclFloat16, ncclBfloat16, ncclInt32, ncclUint8};
      TEST_NCCL(
          ncclAllGather(nccl_in.ptr, nccl_out.ptr, count, nccl_types[static_cast<int>(type)], fx.nccl, fx.stream));
      fx.sync();
      const std::vector<uint8_t> expected = download(nccl_out.ptr, bytes * world);
      for (Algo algo : kGatherAlgos) {
        if (algo == Algo::kLowLatency && bytes > kLowLatencyMaxBytes) {  // refused (planner tests)
          skipped += 4;
          continue;
        }
        for (Placement where :
             {Placement::kHeap, Placement::kHeapInPlace, Placement::kDevice, Placement::kDeviceInPlace}) {
          const bool heap = where == Placement::kHeap || where == Placement::kHeapInPlace;
          const bool in_place = where == Placement::kHeapInPlace || where == Placement::kDeviceInPlace;
          // Heap buffers are symmetric operands (in place: this rank's slot of the output);
          // plain device memory is local.
          const Operand out_operand = heap ? Operand(heap_out) : Operand(dev_out.ptr);
          const Operand in_operand = in_place ? (heap ? Operand(heap_out, fx.rank() * bytes)
                                                      : Operand(static_cast<char*>(dev_out.ptr) + fx.rank() * bytes))
                                     : heap   ? Operand(heap_in)
                                              : Operand(dev_in.ptr);
          char* out = static_cast<char*>(out_operand.ptr());
          char* in = static_cast<char*>(in_operand.ptr());
          TEST_CUDA(cudaMemsetAsync(out, 0xA5, bytes * world, fx.stream));  // poison
          fill_pattern(in, bytes, seed, fx.stream);
          CollectiveOptions o;
          o.algo = algo;
          all_gather(out_operand, in_operand, count, type, *fx.comm, fx.stream, o);
          fx.comm->synchronize(fx.stream);
          const std::vector<uint8_t> got = download(out, bytes * world);
          if (got != expected) {
            ++wrong;
            if (wrong < 5)
              std::printf("rank %d: all_gather %s count %zu %s placement %d differs from NCCL\n", fx.rank(),
                          dtype_name(type), count, algo_name(algo), static_cast<int>(where));
          }
          ++calls;
        }
      }
    }
  }
  fx.comm->free(heap_out);
  fx.comm->free(heap_in);
  EXPECT_EQ(fx.sum(wrong), 0L);
  EXPECT_EQ(calls + skipped, long(5 * 5 * 5 * 4));
  EXPECT_EQ(skipped, long(4 * 4));  // low latency: 1000003 elements of 2 or 4 bytes
}

// The low-latency protocol packs each 4-byte word with a tag into one 8-byte line: payload words
// that look like empty lines (0), like all ones, like -0.0, NaN or infinities, must arrive intact,
// and sums of them must be what the host computes.
TEST(low_latency_payloads_that_look_like_flags_arrive_intact) {
  Fixture& fx = Fixture::get();
  const int world = fx.world();
  const uint32_t specials[] = {0x00000000u, 0xFFFFFFFFu, 0x80000000u, 0x7FC00000u, 0xFFC00001u, 0x7F800000u,
                               0xFF800000u, 0x80008000u, 0x7E007E00u, 0xFFFF0000u, 0x0000FFFFu, 0x00000001u};
  constexpr size_t kSpecials = sizeof(specials) / sizeof(specials[0]);
  const size_t words = 4099;  // odd, and more than one block's threads
  auto input_of = [&](int rank) {
    std::vector<uint32_t> v(words);
    for (size_t i = 0; i < words; ++i)
      v[i] = i < 256 * 4 ? 0x01010101u * uint32_t((i + rank) % 256)  // every byte value
                         : specials[(i + size_t(rank) * 5) % kSpecials];
    return v;
  };
  Buffer* in = fx.comm->allocate(words * 4);
  Buffer* out = fx.comm->allocate(words * 4 * world);
  DeviceBuffer local_out(words * 4 * world);
  long wrong = 0;
  const std::vector<uint32_t> mine = input_of(fx.rank());
  for (int round = 0; round < 3; ++round) {  // back to back: both parities, then the first again
    for (bool local : {false, true}) {
      char* dst = local ? static_cast<char*>(local_out.ptr) : static_cast<char*>(out->ptr());
      TEST_CUDA(cudaMemcpyAsync(in->ptr(), mine.data(), words * 4, cudaMemcpyHostToDevice, fx.stream));
      TEST_CUDA(cudaMemsetAsync(dst, 0xA5, words * 4 * world, fx.stream));
      CollectiveOptions o;
      o.algo = Algo::kLowLatency;
      all_gather(local ? Operand(dst) : Operand(out), in, words, DataType::kInt32, *fx.comm, fx.stream, o);
      fx.comm->synchronize(fx.stream);
      const std::vector<uint8_t> got = download(dst, words * 4 * world);
      for (int r = 0; r < world; ++r) {
        const std::vector<uint32_t> theirs = input_of(r);
        if (std::memcmp(got.data() + r * words * 4, theirs.data(), words * 4) != 0) ++wrong;
      }
    }
  }
  // The last line of every slot: exactly the capacity, 1 MiB per rank, twice (both parities).
  {
    const size_t bytes = kLowLatencyMaxBytes;
    Buffer* big_in = fx.comm->allocate(bytes);
    Buffer* big_out = fx.comm->allocate(bytes * world);
    MismatchCounter mismatches;
    for (int round = 0; round < 2; ++round) {
      fill_pattern(big_in->ptr(), bytes, pattern_seed(fx.rank(), 5000 + round), fx.stream);
      TEST_CUDA(cudaMemsetAsync(big_out->ptr(), 0xA5, bytes * world, fx.stream));
      CollectiveOptions o;
      o.algo = Algo::kLowLatency;
      all_gather(big_out, big_in, bytes, DataType::kUInt8, *fx.comm, fx.stream, o);
      count_gather_mismatches(big_out->ptr(), bytes, world, 5000 + round, mismatches.get(), fx.stream);
    }
    fx.comm->synchronize(fx.stream);
    wrong += mismatches.read(fx.stream);
    fx.comm->free(big_out);
    fx.comm->free(big_in);
  }
  // Reduce-scatter, fp32 sums in rank order (as the kernel adds): -0.0 + -0.0 stays -0.0, NaN stays
  // NaN, infinities add as the host adds them.
  Buffer* rs_in = fx.comm->allocate(words * 4 * world);
  std::vector<uint32_t> rs_mine(words * world);
  auto rs_input_of = [&](int rank) {
    std::vector<uint32_t> v(words * world);
    for (size_t i = 0; i < v.size(); ++i) v[i] = specials[(i * 7 + size_t(rank)) % kSpecials];
    return v;
  };
  rs_mine = rs_input_of(fx.rank());
  std::vector<std::vector<uint32_t>> all_inputs;
  for (int r = 0; r < world; ++r) all_inputs.push_back(rs_input_of(r));
  for (int round = 0; round < 2; ++round) {
    TEST_CUDA(cudaMemcpyAsync(rs_in->ptr(), rs_mine.data(), words * 4 * world, cudaMemcpyHostToDevice, fx.stream));
    TEST_CUDA(cudaMemsetAsync(out->ptr(), 0xA5, words * 4, fx.stream));
    CollectiveOptions o;
    o.algo = Algo::kLowLatency;
    reduce_scatter(out, rs_in, words, DataType::kFloat32, ReduceOp::kSum, *fx.comm, fx.stream, o);
    fx.comm->synchronize(fx.stream);
    const std::vector<uint8_t> got = download(out->ptr(), words * 4);
    for (size_t i = 0; i < words; ++i) {
      float expected = 0;
      for (int r = 0; r < world; ++r) {
        float x;
        std::memcpy(&x, &all_inputs[r][fx.rank() * words + i], 4);
        expected = r == 0 ? x : expected + x;
      }
      float g;
      std::memcpy(&g, got.data() + i * 4, 4);
      const bool ok = std::isnan(expected) ? std::isnan(g) : std::memcmp(&g, &expected, 4) == 0;
      if (!ok && ++wrong < 5)
        std::printf("rank %d: reduce_scatter low_latency word %zu: got %08x\n", fx.rank(), i,
                    *reinterpret_cast<const uint32_t*>(got.data() + i * 4));
    }
  }
  fx.comm->free(rs_in);
  fx.comm->free(out);
  fx.comm->free(in);
  EXPECT_EQ(fx.sum(wrong), 0L);
}

TEST(all_gather_10000_back_to_back_calls_with_changing_sizes_and_algorithms) {
  Fixture& fx = Fixture::get();
  const int world = fx.world();
  constexpr int kCalls = 10000;
  constexpr size_t kMaxBytes = 65536;
  Buffer* in = fx.comm->allocate(kMaxBytes);
  Buffer* out = fx.comm->allocate(kMaxBytes * world);
  DeviceBuffer plain_out(kMaxBytes * world);
  MismatchCounter mismatches;
  const Algo algos[] = {Algo::kPull, Algo::kPush, Algo::kCopyEngine, Algo::kAuto, Algo::kLowLatency};
  for (int i = 0; i < kCalls; ++i) {
    const size_t bytes = 1 + (size_t(i) * 7919) % kMaxBytes;
    // Every fifth call gathers into plain device memory (the staging path), and every other
    // low-latency call does too (it never stages).
    const Operand dst = i % 5 == 3 || i % 10 == 4 ? Operand(plain_out.ptr) : Operand(out);
    fill_pattern(in->ptr(), bytes, pattern_seed(fx.rank(), i), fx.stream);
    CollectiveOptions o;
    o.algo = algos[i % 5];
    if (i % 3 == 0) o.blocks = 1 + (i / 3) % 24;  // grids smaller and larger than the message
    all_gather(dst, in, bytes, DataType::kUInt8, *fx.comm, fx.stream, o);
    count_gather_mismatches(dst.ptr(), bytes, world, i, mismatches.get(), fx.stream);
  }
  fx.comm->synchronize(fx.stream);
  const long wrong = mismatches.read(fx.stream);
  fx.comm->free(out);
  fx.comm->free(in);
  EXPECT_EQ(fx.sum(wrong), 0L);
}

TEST(all_gather_graph_replays_follow_inputs_changed_in_place) {
  Fixture& fx = Fixture::get();
  const int world = fx.world();
  const size_t max_bytes = 131072;
  Buffer* in = fx.comm->allocate(max_bytes);
  Buffer* out = fx.comm->allocate(max_bytes * world);
  long wrong = 0;
  // An odd size (narrow vectors) and an aligned one (16-byte and bulk paths).
  for (size_t bytes : {size_t(100003), max_bytes})
    for (Algo algo : {Algo::kPull, Algo::kPush, Algo::kCopyEngine, Algo::kLowLatency}) {
      CollectiveOptions o;
      o.algo = algo;
      CapturedGraph graph(fx.stream, [&] { all_gather(out, in, bytes, DataType::kUInt8, *fx.comm, fx.stream, o); });
      MismatchCounter mismatches;
      for (int replay = 0; replay < 20; ++replay) {
        const uint64_t iteration = 1000000 + replay;
        mismatches.reset(fx.stream);
        fill_pattern(in->ptr(), bytes, pattern_seed(fx.rank(), iteration), fx.stream);
        TEST_CUDA(cudaMemsetAsync(out->ptr(), 0x5A, bytes * world, fx.stream));
        graph.launch(fx.stream);
        count_gather_mismatches(out->ptr(), bytes, world, iteration, mismatches.get(), fx.stream);
        fx.comm->synchronize(fx.stream);
        if (const long bad = mismatches.read(fx.stream)) {
          ++wrong;
          std::printf("rank %d: %s %zu bytes replay %d: %ld wrong bytes\n", fx.rank(), algo_name(algo), bytes, replay,
                      bad);
        }
      }
    }
  fx.comm->free(out);
  fx.comm->free(in);
  EXPECT_EQ(fx.sum(wrong), 0L);
}

// The copy engine issues a call's copies as one cudaMemcpyBatchAsync when there are several,
// and that API refuses the legacy default stream: calls on the default streams (torch's default
// stream is stream 0) keep the batch on a side stream. SYMMEM_CE_PIECE_KB cuts each peer's copy
// into pieces so that two ranks batch too. In and out of place, every round new data.
TEST(copy_engine_all_gather_in_pieces_on_the_default_streams) {
  Fixture& fx = Fixture::get();
  const int world = fx.world();
  setenv("SYMMEM_CE_PIECE_KB", "64", 1);  // read at creation, agreed by every rank
  auto comm = Communicator::create(fx.bootstrap, fx.job.local_rank);
  unsetenv("SYMMEM_CE_PIECE_KB");
  constexpr size_t kBytes = (size_t(1) << 20) + 4096 + 3;  // per rank: 17 pieces, the last one short
  Buffer* in = comm->allocate(kBytes);
  Buffer* out = comm->allocate(kBytes * world);
  DeviceBuffer expected(kBytes * world);
  CollectiveOptions o;
  o.algo = Algo::kCopyEngine;
  long wrong = 0, calls = 0;
  for (cudaStream_t s : {cudaStream_t(nullptr), cudaStreamLegacy, cudaStreamPerThread}) {
    for (int round = 0; round < 4; ++round) {
      const bool in_place = round % 2 == 1;
      for (int r = 0; r < world; ++r)
        fill_pattern(static_cast<char*>(expected.ptr) + r * kBytes, kBytes, mix_seed(r, round, 77), s);
      TEST_CUDA(cudaMemsetAsync(out->ptr(), 0xA5, kBytes * world, s));  // poison
      const Operand src = in_place ? Operand(out, fx.rank() * kBytes) : Operand(in);
      fill_pattern(src.ptr(), kBytes, mix_seed(fx.rank(), round, 77), s);
      all_gather(out, src, kBytes, DataType::kUInt8, *comm, s, o);
      comm->synchronize(s);
      if (download(out->ptr(), kBytes * world) != download(expected.ptr, kBytes * world)) ++wrong;
      ++calls;
    }
  }
  comm->close();
  EXPECT_EQ(fx.sum(wrong), 0L);
  EXPECT_EQ(calls, 12L);
}

TEST(in_process_threads_share_one_job) {
  // One process drives two GPUs on threads (run with one rank on a machine with two GPUs).
  Fixture& fx = Fixture::get();
  int gpus = 0;
  TEST_CUDA(cudaGetDeviceCount(&gpus));
  if (fx.world() != 1 || gpus < 2) SKIP("needs a one-rank job on a machine with two GPUs");
  auto group = make_thread_group(2, 20000);
  long wrong[2] = {0, 0};
  std::thread threads[2];
  for (int t = 0; t < 2; ++t) {
    threads[t] = std::thread([&, t] {
      try {
        TEST_CUDA(cudaSetDevice(t));
        auto comm = Communicator::create(make_thread_bootstrap(group, t), t);
        Buffer* in = comm->allocate(4096);
        Buffer* out = comm->allocate(8192);
        cudaStream_t s;
        TEST_CUDA(cudaStreamCreate(&s));
        fill_pattern(in->ptr(), 4096, pattern_seed(t, 7), s);
        all_gather(out, in, 4096, DataType::kUInt8, *comm, s);
        MismatchCounter bad;
        count_gather_mismatches(out->ptr(), 4096, 2, 7, bad.get(), s);
        comm->synchronize(s);
        wrong[t] = bad.read(s);
        cudaStreamDestroy(s);
        comm->close();
      } catch (const std::exception& e) {
        std::printf("thread %d: %s\n", t, e.what());
        wrong[t] = -1;
      }
    });
  }
  for (auto& t : threads) t.join();
  TEST_CUDA(cudaSetDevice(fx.job.local_rank));
  EXPECT_EQ(wrong[0], 0L);
  EXPECT_EQ(wrong[1], 0L);
}
