// The tuning table: for each (collective, world size), the algorithm and block count to use up to
// a message size. `symmem-bench --tune` writes it as JSON; the repository ships one per GPU we
// measured under tuning/. Pure C++, no CUDA.
//
// Format (one object, every entry flat):
//   {"gpu": "NVIDIA H200", "command": "...", "date": "...",
//    "entries": [{"op": "all_gather", "world": 4, "max_bytes": 65536, "algo": "push", "blocks": 8}, ...]}
// max_bytes is per rank for all_gather and reduce_scatter, the whole tensor for all_reduce.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "symmem/types.hpp"

namespace symmem::detail {

struct TuningEntry {
  std::string op;
  int world = 0;
  size_t max_bytes = 0;
  Algo algo = Algo::kAuto;
  int blocks = 0;
};

struct TuningTable {
  std::string gpu;
  std::string command;
  std::string date;
  std::vector<TuningEntry> entries;

  // The entry for the smallest max_bytes >= bytes; nothing when the table has no row for it.
  std::optional<TuningEntry> lookup(const std::string& op, int world, size_t bytes) const;
};

// Throws kInvalidArgument with the position of the first error.
TuningTable parse_tuning_table(const std::string& json);
std::string format_tuning_table(const TuningTable& table);

// The table for this GPU: SYMMEM_TUNING_FILE if set, else tuning/<gpu name>.json as embedded in
// the library at build time, else an empty table (built-in rules apply). Cached per GPU name.
const TuningTable& tuning_table_for(const std::string& gpu_name);

}  // namespace symmem::detail
