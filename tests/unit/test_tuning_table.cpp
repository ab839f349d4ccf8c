#include "plan/tuning_table.hpp"
#include "symmem/error.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::detail;

TEST(tuning_table_round_trips) {
  TuningTable t;
  t.gpu = "NVIDIA H200";
  t.command = "symmem-bench all_gather --tune \"x.json\"";
  t.date = "2026-11-21";
  t.entries.push_back({"all_gather", 4, 65536, Algo::kPush, 8});
  t.entries.push_back({"all_reduce", 2, 1 << 20, Algo::kLowLatency, 32});
  const TuningTable back = parse_tuning_table(format_tuning_table(t));
  EXPECT_EQ(back.gpu, t.gpu);
  EXPECT_EQ(back.command, t.command);
  EXPECT_EQ(back.entries.size(), size_t(2));
  EXPECT(back.entries[1].algo == Algo::kLowLatency);
  EXPECT_EQ(back.entries[1].blocks, 32);
  EXPECT_EQ(back.entries[0].max_bytes, size_t(65536));
}

TEST(tuning_lookup_takes_the_smallest_row_that_holds_the_size) {
  TuningTable t;
  t.entries.push_back({"all_gather", 4, 1 << 20, Algo::kPull, 32});
  t.entries.push_back({"all_gather", 4, 4096, Algo::kPush, 4});
  t.entries.push_back({"all_gather", 2, 4096, Algo::kPull, 2});
  EXPECT(t.lookup("all_gather", 4, 100)->algo == Algo::kPush);
  EXPECT(t.lookup("all_gather", 4, 4096)->algo == Algo::kPush);
  EXPECT(t.lookup("all_gather", 4, 4097)->algo == Algo::kPull);
  EXPECT(!t.lookup("all_gather", 4, (1 << 20) + 1));
  EXPECT(!t.lookup("all_reduce", 4, 1));
  EXPECT(t.lookup("all_gather", 2, 1)->blocks == 2);
}

TEST(tuning_parse_errors_say_where) {
  EXPECT_ERROR(parse_tuning_table("{\"entries\": [ {\"op\": \"all_gather\", \"world\": 4, \"algo\": \"warp\"} ]}"),
               ErrorCode::kInvalidArgument, "unknown algorithm 'warp'");
  EXPECT_ERROR(parse_tuning_table("{\"gpu\": \"x\" "), ErrorCode::kInvalidArgument, "at character");
  EXPECT_ERROR(parse_tuning_table("{\"entries\": [ {\"world\": 4} ]}"), ErrorCode::kInvalidArgument, "without op");
}

TEST(tuning_parse_ignores_unknown_keys) {
  const TuningTable t = parse_tuning_table(
      "{\"gpu\": \"g\", \"extra\": 5, \"entries\": [{\"op\": \"all_gather\", \"world\": 2, \"max_bytes\": 10, "
      "\"algo\": \"pull\", \"blocks\": 3, \"time_us\": 1.5, \"note\": \"x\"}]}");
  EXPECT_EQ(t.entries.size(), size_t(1));
  EXPECT_EQ(t.entries[0].blocks, 3);
}

TEST(shipped_tables_parse) {
  // Every table embedded at build time parses (an unknown GPU gets an empty table).
  const TuningTable& h200 = tuning_table_for("NVIDIA H200");
  for (const auto& e : h200.entries) EXPECT(e.world >= 1 && e.algo != Algo::kAuto);
  EXPECT(tuning_table_for("No Such GPU").entries.empty());
}
