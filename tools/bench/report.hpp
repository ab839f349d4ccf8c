// Result rows of symmem-bench: the nccl-tests style table, CSV and JSON. No CUDA here.
//
// Times: every configuration of one size is timed in `reps` batches of `iters` calls, the
// configurations interleaved (each repetition runs one batch of each in turn, so clock and power
// drift fall on all alike); a batch's time is that of the slowest rank; time_us is the median
// batch, time_min_us / time_max_us the fastest and slowest batch (the spread).
//
// Bus bandwidth (as nccl-tests): all_gather and reduce_scatter busbw = (world - 1) * bytes_per_rank
// / time; all_reduce busbw = 2 (world - 1) / world * bytes / time; all_to_all (any split) algbw =
// bytes each rank sends / time and busbw = algbw * (world - 1) / world; algbw = bytes moved into the
// output per rank / time (all_gather: world * bytes_per_rank).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace symmem::bench {

struct Row {
  std::string op;              // all_gather, all_reduce, reduce_scatter, overlap
  std::string impl;            // nccl, nccl_symmetric, nccl_ce, symmem_pull, symmem_copy_engine, ...
  std::string mode = "eager";  // eager | graph
  int world = 1;
  int nodes = 1;  // nodes the ranks span (simulated ones included: symmem-bench --simulate-nodes)
  std::string dtype;
  size_t bytes_per_rank = 0;  // all_reduce: the whole tensor
  size_t count = 0;           // elements per rank
  int blocks = 0;             // SM blocks (0: copy engine / not applicable, -1: NCCL's choice)
  double time_us = 0;         // median batch, per call
  double time_min_us = 0;     // fastest batch, per call
  double time_max_us = 0;     // slowest batch, per call
  double algbw_gbs = 0;
  double busbw_gbs = 0;
  long wrong = 0;           // elements differing from the reference, summed over ranks; -1: not checked
  double vs_best_nccl = 0;  // busbw / best NCCL busbw at this size (0: no NCCL row)
};

struct Meta {
  std::string gpu;
  std::string commit;
  std::string date;
  std::string command;
  int world = 1;
};

// The median of `values` and their extremes, NaNs left out (all three NaN when none is left):
// how every bench reports a figure over its repetitions.
struct Spread {
  double median, min, max;
};
Spread spread_of(std::vector<double> values);

// Fills algbw/busbw from op, world, bytes and time.
void compute_bandwidth(Row* row);
// Sets vs_best_nccl on every symmem row from the best NCCL row of the same op and size.
void compare_with_nccl(std::vector<Row>* rows);

std::string table_header();
std::string table_row(const Row& row);
std::string csv_header();
// A CSV field, quoted when it holds a comma, a quote or a newline.
std::string csv_field(const std::string& text);
std::string csv_row(const Row& row, const Meta& meta);
std::string to_json(const std::vector<Row>& rows, const Meta& meta);

// Writes CSV and JSON; throws std::runtime_error when a file cannot be written.
void write_files(const std::vector<Row>& rows, const Meta& meta, const std::string& csv_path,
                 const std::string& json_path);

std::string format_bytes(size_t bytes);  // "1K", "64M", "3000"

}  // namespace symmem::bench
