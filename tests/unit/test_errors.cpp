#include <cstdlib>

#include "board/host_board.hpp"
#include "comm/refusal.hpp"
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

TEST(a_refusal_message_names_the_rank_and_the_cause_once) {
  // An Error's what() and a bare message give the same text: the code's prefix and the op's are dropped.
  const Error cause(ErrorCode::kInvalidArgument, "all_to_all_v: the input (70000 rows, 300 MB) must be staged");
  const std::string from_error = detail::refusal_message("all_to_all_v", 2, cause.code(), cause.what());
  const std::string from_text =
      detail::refusal_message("all_to_all_v", 2, ErrorCode::kInvalidArgument, "the input (70000 rows, 300 MB) must be staged");
  EXPECT_EQ(from_error, from_text);
  EXPECT(from_error.find("all_to_all_v: rank 2 refused the call: the input (70000 rows, 300 MB) must be staged;") == 0);
  EXPECT(from_error.find("symmem invalid argument") == std::string::npos);
  // A long cause is cut to what the host board holds.
  const std::string longer = detail::refusal_message("op", 0, ErrorCode::kInvalidArgument, std::string(4000, 'x'));
  EXPECT(longer.size() < detail::BoardPage::kRefusalText);
  EXPECT(longer.find("...") != std::string::npos);
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

TEST(elements_convert_to_double) {
  const float f[2] = {1.5f, -3.25f};
  EXPECT_EQ(element_to_double(f, DataType::kFloat32, 1), -3.25);
  const uint16_t half_two = 0x4000, bf16_minus_one = 0xBF80;  // 2.0 in fp16, -1.0 in bf16
  EXPECT_EQ(element_to_double(&half_two, DataType::kFloat16, 0), 2.0);
  EXPECT_EQ(element_to_double(&bf16_minus_one, DataType::kBFloat16, 0), -1.0);
  const int32_t i[3] = {7, -8, 9};
  EXPECT_EQ(element_to_double(i, DataType::kInt32, 1), -8.0);
  const uint8_t b[2] = {0, 255};
  EXPECT_EQ(element_to_double(b, DataType::kUInt8, 1), 255.0);
}
