#include <cstdlib>

#include "common/env.hpp"
#include "symmem/error.hpp"
#include "symmem/types.hpp"
#include "test.hpp"

using namespace symmem;

TEST(errors_carry_code_and_message) {
  const Error e(ErrorCode::kTimeout, "all_gather: rank 1 waited for rank 3");
  EXPECT(e.code() == ErrorCode::kTimeout);
  EXPECT(std::string(e.what()).find("symmem timeout: all_gather: rank 1 waited for rank 3") == 0);
}

TEST(names_round_trip) {
  for (DataType t : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16, DataType::kInt32, DataType::kUInt8}) {
    DataType back;
    EXPECT(parse_dtype(dtype_name(t), &back) && back == t);
  }
  for (Algo a :
       {Algo::kAuto, Algo::kPull, Algo::kPush, Algo::kCopyEngine, Algo::kOneShot, Algo::kTwoShot, Algo::kLowLatency}) {
    Algo back;
    EXPECT(parse_algo(algo_name(a), &back) && back == a);
  }
  DataType t;
  EXPECT(parse_dtype("bf16", &t) && t == DataType::kBFloat16);
  EXPECT(!parse_dtype("float64", &t));
  ReduceOp op;
  EXPECT(parse_reduce_op("MAX", &op) && op == ReduceOp::kMax);
}

TEST(environment_knobs_validate_their_values) {
  setenv("SYMMEM_TIMEOUT_MS", "1500", 1);
  EXPECT_EQ(env::timeout_ms(), int64_t(1500));
  setenv("SYMMEM_TIMEOUT_MS", "soon", 1);
  EXPECT_ERROR(env::timeout_ms(), ErrorCode::kInvalidArgument, "SYMMEM_TIMEOUT_MS='soon'");
  unsetenv("SYMMEM_TIMEOUT_MS");
  EXPECT_EQ(env::timeout_ms(), int64_t(30000));
}
