// symmem-bench argument parsing and reports, and the symmem-run launcher.
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "args.hpp"
#include "launcher.hpp"
#include "report.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::bench;

TEST(bench_args_follow_nccl_tests) {
  Args a;
  std::string error;
  EXPECT(parse_args({"all_gather", "-b", "1K", "-e", "64M", "-f", "4", "-n", "7", "-w", "2", "-c", "0", "-d", "bf16",
                     "--blocks", "4,8,16"},
                    &a, &error));
  EXPECT_EQ(a.op, std::string("all_gather"));
  EXPECT_EQ(a.min_bytes, size_t(1024));
  EXPECT_EQ(a.max_bytes, size_t(64) << 20);
  EXPECT_EQ(a.iters, 7);
  EXPECT_EQ(a.reps, 5);  // default: 5 interleaved batches per configuration
  EXPECT(!a.check);
  EXPECT(a.dtype == DataType::kBFloat16);
  EXPECT_EQ(a.blocks.size(), size_t(3));
  const auto sizes = sweep_sizes(a);
  EXPECT_EQ(sizes.front(), size_t(1024));
  EXPECT_EQ(sizes.back(), size_t(64) << 20);
  EXPECT_EQ(sizes.size(), size_t(9));
}

TEST(bench_args_defaults_sweep_1k_to_256m) {
  Args a;
  std::string error;
  EXPECT(parse_args({}, &a, &error));
  const auto sizes = sweep_sizes(a);
  EXPECT_EQ(sizes.front(), size_t(1024));
  EXPECT_EQ(sizes.back(), size_t(256) << 20);
}

TEST(bench_args_shapes_and_errors) {
  Args a;
  std::string error;
  EXPECT(parse_args({"all_gather", "-d", "fp16", "--shapes", "2048x4096,8192x8192"}, &a, &error));
  EXPECT_EQ(sweep_sizes(a).size(), size_t(2));
  EXPECT_EQ(sweep_sizes(a)[0], size_t(2048) * 4096 * 2);
  Args b;
  EXPECT(!parse_args({"all_gather", "-b", "1Q"}, &b, &error));
  EXPECT(error.find("unknown unit") != std::string::npos);
  Args h;
  EXPECT(parse_args({"host_cost", "-b", "4K", "-n", "200"}, &h, &error));
  EXPECT(h.op == "host_cost" && h.min_bytes == 4096 && h.iters == 200);
  Args c;
  EXPECT(!parse_args({"broadcast"}, &c, &error));
  EXPECT(error.find("unknown operation") != std::string::npos);
  Args d;
  EXPECT(!parse_args({"-b", "8M", "-e", "1M"}, &d, &error));
  Args e;
  EXPECT(!parse_args({"--algos", "teleport"}, &e, &error));
  EXPECT(error.find("teleport") != std::string::npos);
  Args f;
  EXPECT(parse_args({"all_reduce", "--vllm-table", "--graph", "--reps", "9"}, &f, &error));
  EXPECT_EQ(f.reps, 9);
  EXPECT(f.vllm_table && f.graph);
  Args g;
  EXPECT(!parse_args({"--reps", "0"}, &g, &error));
  EXPECT_EQ(parse_bytes("3000"), size_t(3000));
  EXPECT_EQ(parse_bytes("1G"), size_t(1) << 30);
}

TEST(sweep_sizes_round_to_whole_elements) {
  Args a;
  std::string error;
  EXPECT(parse_args({"all_gather", "-b", "3", "-e", "100", "-f", "3", "-d", "float32"}, &a, &error));
  for (size_t s : sweep_sizes(a)) EXPECT(s % 4 == 0 && s > 0);
}

TEST(bus_bandwidth_factors_match_nccl_tests) {
  Row ag;
  ag.op = "all_gather";
  ag.world = 4;
  ag.bytes_per_rank = 1000000;
  ag.time_us = 10;
  compute_bandwidth(&ag);
  EXPECT(std::fabs(ag.algbw_gbs - 400.0) < 1e-9);  // 4 * 1e6 B / 10 us
  EXPECT(std::fabs(ag.busbw_gbs - 300.0) < 1e-9);  // (world - 1) / world of algbw
  Row ar = ag;
  ar.op = "all_reduce";
  compute_bandwidth(&ar);
  EXPECT(std::fabs(ar.algbw_gbs - 100.0) < 1e-9);
  EXPECT(std::fabs(ar.busbw_gbs - 150.0) < 1e-9);  // 2 (world - 1) / world
}

TEST(spread_is_the_median_and_extremes_without_nans) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Spread s = spread_of({5, 1, nan, 3});
  EXPECT(s.median == 3 && s.min == 1 && s.max == 5);
  s = spread_of({4, 2, 8, 6});
  EXPECT(s.median == 5 && s.min == 2 && s.max == 8);
  s = spread_of({nan});
  EXPECT(std::isnan(s.median) && std::isnan(s.min) && std::isnan(s.max));
}

TEST(reports_carry_the_required_columns) {
  const std::string header = csv_header();
  for (const char* column : {"op", "impl", "mode", "world", "nodes", "dtype", "bytes_per_rank", "blocks", "time_us",
                             "time_min_us", "time_max_us", "algbw_gbs", "busbw_gbs", "wrong", "gpu", "commit", "date"})
    EXPECT(header.find(column) != std::string::npos);
  std::vector<Row> rows(2);
  rows[0].op = rows[1].op = "all_gather";
  rows[0].impl = "nccl";
  rows[1].impl = "symmem_pull";
  rows[0].busbw_gbs = 100;
  rows[1].busbw_gbs = 150;
  compare_with_nccl(&rows);
  EXPECT(std::fabs(rows[1].vs_best_nccl - 1.5) < 1e-9);
  Meta m;
  m.gpu = "NVIDIA H200";
  m.commit = "abc1234";
  rows[1].time_us = 10;
  rows[1].time_min_us = 9.5;
  rows[1].time_max_us = 12.25;
  m.date = "2026-11-23T00:00:00Z";
  const std::string line = csv_row(rows[1], m);
  EXPECT(line.rfind("all_gather,symmem_pull,", 0) == 0);
  EXPECT(line.find(",10.000,9.500,12.250,") != std::string::npos);  // median, min, max in header order
  EXPECT(line.find("NVIDIA H200,abc1234,2026-11-23T00:00:00Z") != std::string::npos);
  size_t header_fields = 1, line_fields = 1;
  for (char c : header) header_fields += c == ',';
  for (char c : line) line_fields += c == ',';
  EXPECT_EQ(line_fields, header_fields);
  const std::string json = to_json(rows, m);
  EXPECT(json.find("\"impl\": \"symmem_pull\"") != std::string::npos);
  EXPECT(json.find("\"time_max_us\": 12.250") != std::string::npos);
  EXPECT(table_row(rows[1]).find("1.50x") != std::string::npos);
  EXPECT(table_row(rows[1]).find("12.25") != std::string::npos);
}

TEST(every_row_records_the_command_that_reproduces_it) {
  Args a;
  std::string error;
  EXPECT(parse_args({"all_gather", "-b", "1K", "--algos", "pull,push", "--csv", "out.csv", "--json", "out.json",
                     "--tune", "t.json", "--graph"},
                    &a, &error));
  EXPECT_EQ(a.command_line, std::string("all_gather -b 1K --algos pull,push --graph"));  // not where results go
  Meta m;
  m.gpu = "NVIDIA H200";
  m.commit = "abc1234";
  m.date = "2026-11-23T00:00:00Z";
  m.command = reproducing_command({{"SYMMEM_TUNING_FILE", "t.json"}}, a.command_line);
  EXPECT_EQ(m.command,
            std::string("SYMMEM_TUNING_FILE=t.json symmem-bench all_gather -b 1K --algos pull,push --graph"));
  const std::string header = csv_header();
  EXPECT(header.size() > 8 && header.compare(header.size() - 8, 8, ",command") == 0);
  Row r;
  r.op = "all_gather";
  r.impl = "symmem_pull";
  const std::string line = csv_row(r, m);
  // The command holds a comma: quoted, so the row keeps the header's columns.
  EXPECT(line.find(",\"SYMMEM_TUNING_FILE=t.json symmem-bench all_gather -b 1K --algos pull,push --graph\"") !=
         std::string::npos);
}

TEST(launcher_runs_every_rank_with_the_job_variables) {
  launch::LaunchOptions o;
  o.processes = 3;
  o.prefix_output = false;
  const int rc =
      launch::run(o, {"/bin/sh", "-c",
                      "test \"$WORLD_SIZE\" = 3 && test -n \"$SYMMEM_TOKEN\" && test \"$RANK\" = \"$LOCAL_RANK\" "
                      "&& test \"$NCCL_NVLS_ENABLE\" = 0 && test -n \"$MASTER_PORT\""});
  EXPECT_EQ(rc, 0);
}

TEST(launcher_stops_the_job_when_one_rank_fails) {
  launch::LaunchOptions o;
  o.processes = 3;
  o.grace_s = 1;
  const auto start = std::chrono::steady_clock::now();
  const int rc = launch::run(o, {"/bin/sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 7; fi; sleep 60"});
  EXPECT_EQ(rc, 7);
  EXPECT(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}

TEST(launcher_kills_ranks_that_ignore_sigterm) {
  launch::LaunchOptions o;
  o.processes = 2;
  o.grace_s = 0.5;
  o.timeout_s = 1;
  const auto start = std::chrono::steady_clock::now();
  const int rc = launch::run(o, {"/bin/sh", "-c", "trap '' TERM; sleep 60"});
  EXPECT_EQ(rc, 124);
  EXPECT(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}

TEST(launcher_arguments) {
  launch::LaunchOptions o;
  std::vector<std::string> command;
  std::string error;
  EXPECT(launch::parse_args({"-n", "4", "--timeout", "30", "prog", "-n", "x"}, &o, &command, &error));
  EXPECT_EQ(o.processes, 4);
  EXPECT_EQ(command.size(), size_t(3));  // the program's own -n is its own
  EXPECT(!launch::parse_args({"-n", "0", "prog"}, &o, &command, &error));
  EXPECT(!launch::parse_args({"-n", "2"}, &o, &command, &error));
  EXPECT(error.find("no program") != std::string::npos);
}

TEST(bench_all_to_all_arguments_and_bandwidth) {
  Args a;
  std::string error;
  EXPECT(parse_args({"all_to_all", "-b", "1K", "-e", "1G", "--splits", "zipf"}, &a, &error));
  EXPECT_EQ(a.op, std::string("all_to_all"));
  EXPECT_EQ(a.splits, std::string("zipf"));
  Args b;
  EXPECT(!parse_args({"all_to_all", "--splits", "gaussian"}, &b, &error));
  EXPECT(error.find("uniform, zipf or onehot") != std::string::npos);
  // nccl-tests' alltoall: algbw = bytes per rank / time, busbw = algbw (world - 1) / world.
  Row r;
  r.op = "all_to_all_onehot";
  r.world = 4;
  r.bytes_per_rank = size_t(1) << 30;
  r.time_us = 1e6;
  compute_bandwidth(&r);
  EXPECT(std::abs(r.algbw_gbs - 1.073741824) < 1e-9);
  EXPECT(std::abs(r.busbw_gbs - 1.073741824 * 0.75) < 1e-9);
}
