#include "calls.hpp"

#include "test.hpp"
#include "test_kernels.hpp"

namespace symmem::test {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::kAllGather: return "all_gather";
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kReduceScatter: return "reduce_scatter";
  }
  return "?";
}

size_t input_bytes(const Call& c, int world) {
  const size_t bytes = c.count * dtype_size(c.type);
  return c.collective == Collective::kReduceScatter ? bytes * world : bytes;
}

size_t output_bytes(const Call& c, int world) {
  const size_t bytes = c.count * dtype_size(c.type);
  return c.collective == Collective::kAllGather ? bytes * world : bytes;
}

std::string describe(const Call& c) {
  std::string s = std::string(collective_name(c.collective)) + " " + algo_name(c.algo) + " " + dtype_name(c.type);
  if (c.collective != Collective::kAllGather && c.op != ReduceOp::kSum) s += std::string(" ") + reduce_op_name(c.op);
  return s + " count=" + std::to_string(c.count);
}

namespace {

CollectiveOptions options_of(const Call& c) {
  CollectiveOptions o;
  o.algo = c.algo;
  return o;
}

}  // namespace

bool plannable(const Call& c, Communicator& comm) {
  try {
    switch (c.collective) {
      case Collective::kAllGather: describe_all_gather(c.out, c.in, c.count, c.type, comm, options_of(c)); break;
      case Collective::kAllReduce: describe_all_reduce(c.out, c.in, c.count, c.type, comm, options_of(c)); break;
      case Collective::kReduceScatter:
        describe_reduce_scatter(c.out, c.in, c.count, c.type, comm, options_of(c));
        break;
    }
  } catch (const Error&) {
    return false;
  }
  return true;
}

void launch(const Call& c, Communicator& comm, cudaStream_t stream) {
  switch (c.collective) {
    case Collective::kAllGather: all_gather(c.out, c.in, c.count, c.type, comm, stream, options_of(c)); return;
    case Collective::kAllReduce: all_reduce(c.out, c.in, c.count, c.type, c.op, comm, stream, options_of(c)); return;
    case Collective::kReduceScatter:
      reduce_scatter(c.out, c.in, c.count, c.type, c.op, comm, stream, options_of(c));
      return;
  }
}

void prepare(const Call& c, uint64_t seed, NcclOracle& oracle, cudaStream_t stream, int world) {
  void* out = address_of(c.out);
  void* in = address_of(c.in);
  // Poison: 0xA5 bytes for gathers; 0xFF is NaN (or -1) for every reducible type.
  TEST_CUDA(cudaMemsetAsync(out, c.collective == Collective::kAllGather ? 0xA5 : 0xFF, output_bytes(c, world), stream));
  const size_t in_count = c.collective == Collective::kReduceScatter ? c.count * world : c.count;
  if (c.collective == Collective::kAllGather)
    fill_pattern(in, input_bytes(c, world), seed, stream);
  else
    fill_exact(in, in_count, c.type, seed, stream);
  oracle.take_input(in, input_bytes(c, world), stream);
}

void check_against_nccl(const Call& c, NcclOracle& oracle, unsigned long long* mismatches, Fixture& fx) {
  switch (c.collective) {
    case Collective::kAllGather: oracle.all_gather(c.count, c.type, fx); break;
    case Collective::kAllReduce: oracle.all_reduce(c.count, c.type, c.op, fx); break;
    case Collective::kReduceScatter: oracle.reduce_scatter(c.count, c.type, c.op, fx); break;
  }
  oracle.count_differences(address_of(c.out), output_bytes(c, fx.world()), mismatches, fx.stream);
}

}  // namespace symmem::test
