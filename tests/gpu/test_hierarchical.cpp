// The hierarchical all-gather. On one node (symmem-run -n 2) it runs when asked for by name (the
// copy engine's schedule); across nodes (symmem-run -n N --simulate-nodes K: NCCL between the
// groups over its network transport) it is what kAuto runs, and the node-only collectives fail at
// the call. What each layout exercises: 2 x 1 the one-GPU-per-node schedule (one NCCL all-gather,
// plus symmem's operands, in place and staging plumbing); 2 x 2 (4 GPUs) the send/recv pieces,
// broadcasts, handshakes with the network stream and staged chunks.
// Oracles: NCCL's flat all-gather on the same inputs (bit-exact, every type; across simulated
// nodes NCCL under the same simulation) and patterns whose every byte is known (on the device,
// for thousands of calls and graph replays).
#include <cstdio>
#include <vector>

#include "fixture.hpp"
#include "test.hpp"
#include "test_kernels.hpp"

using namespace symmem;
using namespace symmem::test;

namespace {

enum class Placement { kHeap, kHeapInPlace, kDevice, kDeviceInPlace };

CollectiveOptions hierarchical() {
  CollectiveOptions o;
  o.algo = Algo::kHierarchical;
  return o;
}

// The operands of one call: heap buffers are symmetric operands, plain device memory is local; in
// place, the input is this rank's slot of the output.
struct CallOperands {
  Operand out;
  Operand in;
};
CallOperands operands(Placement where, Buffer* heap_in, Buffer* heap_out, void* dev_in, void* dev_out, size_t bytes,
                      int rank) {
  switch (where) {
    case Placement::kHeap: return {Operand(heap_out), Operand(heap_in)};
    case Placement::kHeapInPlace: return {Operand(heap_out), Operand(heap_out, rank * bytes)};
    case Placement::kDevice: return {Operand(dev_out), Operand(dev_in)};
    case Placement::kDeviceInPlace: return {Operand(dev_out), Operand(static_cast<char*>(dev_out) + rank * bytes)};
  }
  return {Operand(dev_out), Operand(dev_in)};
}

}  // namespace

TEST(hierarchical_all_gather_is_bit_exact_against_nccl) {
  Fixture& fx = Fixture::get();
  const int world = fx.world();
  EXPECT_EQ(fx.comm->world(), world);
  EXPECT_EQ(fx.comm->nodes() * fx.comm->local_world(), world);
  // 1 element to past the pipeline's pieces (1 MiB each from 2 MiB on) with odd tails.
  const size_t counts[] = {1, 3, 4097, 1000003, (size_t(5) << 20) / 4 + 7};
  const size_t max_bytes = ((size_t(5) << 20) / 4 + 7) * 4;
  Buffer* heap_in = fx.comm->allocate(max_bytes);
  Buffer* heap_out = fx.comm->allocate(max_bytes * world);
  DeviceBuffer dev_in(max_bytes), dev_out(max_bytes * world), nccl_in(max_bytes), nccl_out(max_bytes * world);
  long wrong = 0, calls = 0;
  for (DataType type :
       {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16, DataType::kInt32, DataType::kUInt8}) {
    const size_t elem = dtype_size(type);
    static const ncclDataType_t nccl_types[] = {ncclFloat32, ncclFloat16, ncclBfloat16, ncclInt32, ncclUint8};
    for (size_t count : counts) {
      const size_t bytes = count * elem;
      const uint64_t seed = mix_seed(fx.rank(), count, 100 + static_cast<uint64_t>(type));
      fill_pattern(nccl_in.ptr, bytes, seed, fx.stream);
      TEST_CUDA(cudaMemsetAsync(nccl_out.ptr, 0xEE, bytes * world, fx.stream));
      TEST_NCCL(
          ncclAllGather(nccl_in.ptr, nccl_out.ptr, count, nccl_types[static_cast<int>(type)], fx.nccl, fx.stream));
      fx.sync();
      const std::vector<uint8_t> expected = download(nccl_out.ptr, bytes * world);
      for (Placement where :
           {Placement::kHeap, Placement::kHeapInPlace, Placement::kDevice, Placement::kDeviceInPlace}) {
        const CallOperands ops = operands(where, heap_in, heap_out, dev_in.ptr, dev_out.ptr, bytes, fx.rank());
        TEST_CUDA(cudaMemsetAsync(ops.out.ptr(), 0xA5, bytes * world, fx.stream));  // poison
        fill_pattern(ops.in.ptr(), bytes, seed, fx.stream);
        // Across nodes kAuto must run the hierarchical all-gather too: alternate the two.
        CollectiveOptions o = hierarchical();
        if (fx.comm->nodes() > 1 && calls % 2 == 1) o.algo = Algo::kAuto;
        all_gather(ops.out, ops.in, count, type, *fx.comm, fx.stream, o);
        fx.comm->synchronize(fx.stream);
        if (download(ops.out.ptr(), bytes * world) != expected) {
          if (++wrong < 5)
            std::printf("rank %d: hierarchical all_gather %s count %zu placement %d differs from NCCL\n", fx.rank(),
                        dtype_name(type), count, static_cast<int>(where));
        }
        ++calls;
      }
    }
  }
  fx.comm->free(heap_out);
  fx.comm->free(heap_in);
  EXPECT_EQ(fx.sum(wrong), 0L);
  EXPECT_EQ(calls, long(5 * 5 * 4));
}

// 16 MiB to 256 MiB per rank (the sizes of the benchmark's bar), heap and plain device memory (the
// latter staged through the workspace in chunks), checked byte by byte against known patterns.
TEST(hierarchical_all_gather_large_messages_land_exactly) {
  Fixture& fx = Fixture::get();
  const int world = fx.world();
  const size_t max_bytes = size_t(256) << 20;
  Buffer* heap_in = fx.comm->allocate(max_bytes);
  Buffer* heap_out = fx.comm->allocate(max_bytes * world);
  DeviceBuffer dev_in(max_bytes), dev_out(max_bytes * world);
  MismatchCounter mismatches;
  long wrong = 0;
  uint64_t iteration = 7000000;
  for (size_t bytes : {size_t(16) << 20, (size_t(64) << 20) + 4093, max_bytes})
    for (Placement where : {Placement::kHeap, Placement::kDeviceInPlace, Placement::kDevice}) {
      const CallOperands ops = operands(where, heap_in, heap_out, dev_in.ptr, dev_out.ptr, bytes, fx.rank());
      mismatches.reset(fx.stream);
      TEST_CUDA(cudaMemsetAsync(ops.out.ptr(), 0x3C, bytes * world, fx.stream));
      fill_pattern(ops.in.ptr(), bytes, pattern_seed(fx.rank(), ++iteration), fx.stream);
      all_gather(ops.out, ops.in, bytes, DataType::kUInt8, *fx.comm, fx.stream);  // kAuto
      count_gather_mismatches(ops.out.ptr(), bytes, world, iteration, mismatches.get(), fx.stream);
      fx.comm->synchronize(fx.stream);
      if (const long bad = mismatches.read(fx.stream)) {
        ++wrong;
        std::printf("rank %d: %zu bytes placement %d: %ld wrong bytes\n", fx.rank(), bytes, static_cast<int>(where),
                    bad);
      }
    }
  fx.comm->free(heap_out);
  fx.comm->free(heap_in);
  EXPECT_EQ(fx.sum(wrong), 0L);
}

// Small and large calls in rapid alternation on one communicator, without synchronising: the
// pieces, handshakes and network steps of consecutive calls must never overlap wrongly.
TEST(hierarchical_all_gather_alternates_small_and_large_calls) {
  Fixture& fx = Fixture::get();
  const int world = fx.world();
  constexpr int kCalls = 2000;
  const size_t max_bytes = size_t(6) << 20;
  Buffer* in = fx.comm->allocate(max_bytes);
  Buffer* out = fx.comm->allocate(max_bytes * world);
  DeviceBuffer plain_out(max_bytes * world);
  MismatchCounter mismatches;
  for (int i = 0; i < kCalls; ++i) {
    // Odd calls tiny (1 byte to 4 KiB), even ones large (up to 6 MiB: several pieces).
    const size_t bytes = i % 2 ? 1 + (size_t(i) * 131) % 4096 : (size_t(i) * 7919 * 97) % max_bytes + 1;
    const Operand dst = i % 5 == 2 ? Operand(plain_out.ptr) : Operand(out);
    fill_pattern(in->ptr(), bytes, pattern_seed(fx.rank(), i), fx.stream);
    all_gather(dst, in, bytes, DataType::kUInt8, *fx.comm, fx.stream, hierarchical());
    count_gather_mismatches(dst.ptr(), bytes, world, i, mismatches.get(), fx.stream);
    if (i % 256 == 255) fx.comm->synchronize(fx.stream);
  }
  fx.comm->synchronize(fx.stream);
  const long wrong = mismatches.read(fx.stream);
  fx.comm->free(out);
  fx.comm->free(in);
  EXPECT_EQ(fx.sum(wrong), 0L);
}

// A CUDA graph of hierarchical all-gathers (NCCL steps included), replayed after eager calls with
// inputs changed in place between replays.
TEST(hierarchical_all_gather_graph_replays_follow_inputs_changed_in_place) {
  Fixture& fx = Fixture::get();
  const int world = fx.world();
  const size_t max_bytes = size_t(3) << 20;
  Buffer* in = fx.comm->allocate(max_bytes);
  Buffer* out = fx.comm->allocate(max_bytes * world);
  long wrong = 0;
  for (size_t bytes : {size_t(100003), max_bytes + 0}) {
    // Eager first (NCCL connects lazily), then capture.
    all_gather(out, in, bytes, DataType::kUInt8, *fx.comm, fx.stream, hierarchical());
    fx.comm->synchronize(fx.stream);
    CapturedGraph graph(fx.stream,
                        [&] { all_gather(out, in, bytes, DataType::kUInt8, *fx.comm, fx.stream, hierarchical()); });
    MismatchCounter mismatches;
    for (int replay = 0; replay < 20; ++replay) {
      const uint64_t iteration = 3000000 + replay + bytes;
      mismatches.reset(fx.stream);
      fill_pattern(in->ptr(), bytes, pattern_seed(fx.rank(), iteration), fx.stream);
      TEST_CUDA(cudaMemsetAsync(out->ptr(), 0x5A, bytes * world, fx.stream));
      if (replay % 4 == 3)  // an eager call between replays
        all_gather(out, in, bytes, DataType::kUInt8, *fx.comm, fx.stream, hierarchical());
      else
        graph.launch(fx.stream);
      count_gather_mismatches(out->ptr(), bytes, world, iteration, mismatches.get(), fx.stream);
      fx.comm->synchronize(fx.stream);
      if (const long bad = mismatches.read(fx.stream)) {
        ++wrong;
        std::printf("rank %d: %zu bytes replay %d: %ld wrong bytes\n", fx.rank(), bytes, replay, bad);
      }
    }
  }
  fx.comm->free(out);
  fx.comm->free(in);
  EXPECT_EQ(fx.sum(wrong), 0L);
}

// Across nodes: kAuto plans the hierarchical all-gather, a single-node algorithm is refused by name,
// and the collectives that run inside one node fail at the call, clearly, launching nothing.
TEST(hierarchical_communicator_refuses_node_only_collectives) {
  Fixture& fx = Fixture::get();
  Buffer* buffer = fx.comm->allocate(size_t(1) << 20);
  const size_t count = 1024;
  if (fx.comm->nodes() == 1) {
    const std::string plan = describe_all_gather(buffer, Operand(buffer, fx.rank() * count), count, DataType::kUInt8,
                                                 *fx.comm, hierarchical());
    fx.comm->free(buffer);
    EXPECT(plan.find("hierarchical") != std::string::npos);
    SKIP("one node: the refusals concern communicators spanning nodes (symmem-run --simulate-nodes 2)");
  }
  EXPECT(describe_all_gather(Operand(buffer), Operand(buffer, fx.rank() * count), count, DataType::kUInt8, *fx.comm)
             .find("hierarchical") != std::string::npos);
  CollectiveOptions pull;
  pull.algo = Algo::kPull;
  EXPECT_ERROR(
      all_gather(buffer, Operand(buffer, fx.rank() * count), count, DataType::kUInt8, *fx.comm, fx.stream, pull),
      ErrorCode::kInvalidArgument, "runs inside one node");
  EXPECT_ERROR(all_reduce(buffer, buffer, count, DataType::kFloat32, ReduceOp::kSum, *fx.comm, fx.stream),
               ErrorCode::kUnsupported, "spans");
  EXPECT_ERROR(
      reduce_scatter(buffer, buffer, count / fx.world(), DataType::kFloat32, ReduceOp::kSum, *fx.comm, fx.stream),
      ErrorCode::kUnsupported, "spans");
  EXPECT_ERROR(fx.comm->barrier(fx.stream), ErrorCode::kUnsupported, "spans");
  // Nothing was launched and the communicator is still usable.
  all_gather(buffer, Operand(buffer, fx.rank() * count), count, DataType::kUInt8, *fx.comm, fx.stream);
  fx.comm->synchronize(fx.stream);
  fx.comm->free(buffer);
}
