// One collective call as data: what it is, where its operands are; with the steps every test of
// it repeats (can it be planned, poison the output and fill the input with fresh random data,
// launch, ask NCCL the same question, compare bit-exactly on the device). Reductions use
// fill_exact inputs, whose sums are exact in every order, so they too compare bit-exactly.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "api_compat.hpp"
#include "fixture.hpp"
#include "oracle.hpp"

namespace symmem::test {

enum class Collective { kAllGather, kAllReduce, kReduceScatter };
const char* collective_name(Collective c);

struct Call {
  Collective collective = Collective::kAllGather;
  Algo algo = Algo::kAuto;
  DataType type = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;
  size_t count = 0;  // all-gather and reduce-scatter: per rank
  OperandArg out = static_cast<void*>(nullptr);
  OperandArg in = static_cast<void*>(nullptr);
};

size_t input_bytes(const Call& c, int world);
size_t output_bytes(const Call& c, int world);
// e.g. "all_reduce two_shot_push bfloat16 count=1048576"
std::string describe(const Call& c);

// True when the call can be planned (describe_* does not throw); nothing is launched. The answer
// depends only on values every rank shares, so ranks agree (tests still check that they do).
bool plannable(const Call& c, Communicator& comm);
void launch(const Call& c, Communicator& comm, cudaStream_t stream);

// Poisons the output, fills the input from `seed` (pattern bytes for all-gather, fill_exact for
// reductions) and hands the input to the oracle. In place, the input lies inside the output and
// is filled after the poison.
void prepare(const Call& c, uint64_t seed, NcclOracle& oracle, cudaStream_t stream, int world);
// NCCL on the input `prepare` handed over, then *mismatches += output bytes that differ from it.
void check_against_nccl(const Call& c, NcclOracle& oracle, unsigned long long* mismatches, Fixture& fx);

}  // namespace symmem::test
