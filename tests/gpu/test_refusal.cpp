// A call one rank refuses, between processes (symmem-run -n N): the last rank's all_to_all_v input
// is larger than the staging area it must go through (a local input that pull reads from the
// peers). That rank refuses the call; every rank must raise the same kInvalidArgument, naming it
// and the cause, well within a second (the deadline is 20 s), and find the communicator unusable
// afterwards. Before refusals (0bbf9f1) the peers timed out after the deadline, naming the rank
// without the cause: this test then fails on their time, code and message.

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "device_memory.hpp"
#include "fixture.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::test;

TEST(oversized_all_to_all_v_input_is_refused_on_every_rank_at_once) {
  Fixture& fx = Fixture::get();
  if (fx.comm->nodes() > 1) SKIP("one node: the all-to-all runs inside one node");
  CommConfig config;
  config.timeout_ms = 20000;
  config.workspace_bytes = size_t(64) << 20;  // a staging area of 16 MiB
  auto comm = Communicator::create(fx.bootstrap, fx.job.local_rank, config);
  const int refusing = fx.world() - 1;
  const bool me = fx.rank() == refusing;
  const size_t row_bytes = 1024, out_rows = 64;
  const size_t refused_rows = (size_t(17) << 20) / row_bytes;  // 17 MiB
  const size_t in_rows = me ? refused_rows : 64;
  DeviceBuffer in(in_rows * row_bytes), out(out_rows * row_bytes);
  const std::vector<int64_t> splits(fx.world(), 2), expected(fx.world(), 2);
  fx.bootstrap->barrier();

  std::string message = "no error";
  ErrorCode code = ErrorCode::kInternal;
  const auto start = std::chrono::steady_clock::now();
  try {
    all_to_all_v(Operand(out.ptr), out_rows, Operand(in.ptr), in_rows, splits.data(), expected.data(), row_bytes, *comm,
                 fx.stream);
    comm->synchronize(fx.stream);
  } catch (const Error& e) {
    message = e.what();
    code = e.code();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string named = "all_to_all_v: rank " + std::to_string(refusing) + " refused the call: the input (" +
                            std::to_string(refused_rows) + " rows";
  if (code != ErrorCode::kInvalidArgument || message.find(named) == std::string::npos ||
      message.find("must be staged") == std::string::npos)
    std::printf("[ CASE ] rank %d raised: %s\n", fx.rank(), message.c_str());
  EXPECT(code == ErrorCode::kInvalidArgument);
  EXPECT(message.find(named) != std::string::npos);
  EXPECT(message.find("staging workspace holds 16777216 bytes") != std::string::npos);
  EXPECT(seconds < 1.0);
  // The same message on every rank.
  EXPECT(fx.same_everywhere(hash_bytes(std::vector<uint8_t>(message.begin(), message.end()))));
  EXPECT_ERROR(comm->check(), ErrorCode::kAborted, "refused the call");
  comm->close();
}
