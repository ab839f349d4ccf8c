// The settings every rank of a communicator must agree on: read once at creation (the environment,
// CommConfig, the tuning table), then compared across the ranks, so that no rank plans with a value
// another rank does not have (ranks that plan differently corrupt each other's memory). Creation
// fails on every rank naming the setting that differs.
//
// agreed_settings.cpp holds their table, one row per setting: its variable, how it is read and
// parsed, compared and printed. A new agreed setting is a field here, a row there and its line in
// docs/environment.md ("Settings every rank agrees on"; a CPU test holds the two lists equal).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "plan/tuning_table.hpp"
#include "symmem/bootstrap.hpp"
#include "symmem/communicator.hpp"
#include "symmem/types.hpp"

namespace symmem::detail {

// Plain values: the ranks exchange it as bytes.
struct AgreedSettings {
  Algo forced_algo = Algo::kAuto;      // SYMMEM_ALGO
  int forced_blocks = 0;               // SYMMEM_BLOCKS
  bool push_bulk = true;               // SYMMEM_PUSH_BULK
  bool copy_engine_push = false;       // SYMMEM_CE_DIRECTION=push
  int copy_engine_streams = 4;         // SYMMEM_CE_STREAMS
  bool copy_engine_batch = true;       // SYMMEM_CE_BATCH
  size_t copy_engine_piece_bytes = 0;  // SYMMEM_CE_PIECE_KB
  int moe_combine_path = 0;            // SYMMEM_MOE_COMBINE (detail::MoeCombinePath)
  size_t workspace_bytes = 0;          // CommConfig::workspace_bytes or SYMMEM_WORKSPACE_MB
  size_t heap_reserve_bytes = 0;       // CommConfig::heap_reserve_bytes or SYMMEM_HEAP_RESERVE_GB
  int64_t timeout_ms = 30000;          // CommConfig::timeout_ms or SYMMEM_TIMEOUT_MS
  uint64_t tuning_hash = 0;            // the tuning table in force (SYMMEM_TUNING_FILE or the GPU model)
};

// Every setting, read. Throws kInvalidArgument naming a variable whose value it does not take.
AgreedSettings read_agreed_settings(const CommConfig& config, const TuningTable& tuning);

// Collective over `bootstrap` (`rank` of `world`): throws kInvalidArgument naming the first setting
// in which a rank differs from `mine`, with both values.
void agree_on_settings(const AgreedSettings& mine, Bootstrap& bootstrap, int rank, int world);

// The environment variables of the table, in its order.
std::vector<const char*> agreed_setting_variables();

}  // namespace symmem::detail
