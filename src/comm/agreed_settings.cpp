// The table of agreed settings (agreed_settings.hpp): one row per setting, in the order creation
// compares them.
#include "comm/agreed_settings.hpp"

#include <string>

#include "common/env.hpp"
#include "common/hash.hpp"
#include "plan/moe_combine_path.hpp"
#include "symmem/error.hpp"

namespace symmem::detail {
namespace {

// What a row reads a setting from, besides its environment variable.
struct Sources {
  const CommConfig& config;
  const TuningTable& tuning;
};

struct AgreedSetting {
  const char* variable;  // its environment variable (docs/environment.md)
  const char* label;     // how a "differs across ranks" error names it; null: the variable
  // Reads and parses the setting into its field; throws kInvalidArgument for a value it does not take.
  void (*read)(const char* variable, const Sources& from, AgreedSettings& into);
  bool (*same)(const AgreedSettings& a, const AgreedSettings& b);
  std::string (*print)(const AgreedSettings& s);
};

template <auto kField>
bool same(const AgreedSettings& a, const AgreedSettings& b) {
  return a.*kField == b.*kField;
}

template <auto kField>
std::string number(const AgreedSettings& s) {
  return std::to_string(s.*kField);
}

Error not_taken(const char* variable, const std::string& value, const char* why) {
  return Error(ErrorCode::kInvalidArgument, std::string(variable) + "='" + value + "' " + why);
}

using S = AgreedSettings;

// clang-format off
const AgreedSetting kAgreedSettings[] = {
  {"SYMMEM_ALGO", nullptr,
   [](const char* v, const Sources&, S& s) {
     const std::string name = env::get_string(v, "");
     if (!name.empty() && !parse_algo(name, &s.forced_algo)) throw not_taken(v, name, "names no algorithm");
   },
   same<&S::forced_algo>, [](const S& s) { return std::string(algo_name(s.forced_algo)); }},
  {"SYMMEM_BLOCKS", nullptr,
   [](const char* v, const Sources&, S& s) { s.forced_blocks = static_cast<int>(env::get_int(v, 0)); },
   same<&S::forced_blocks>, number<&S::forced_blocks>},
  {"SYMMEM_PUSH_BULK", nullptr,
   [](const char* v, const Sources&, S& s) { s.push_bulk = env::get_int(v, 1) != 0; },
   same<&S::push_bulk>, number<&S::push_bulk>},
  {"SYMMEM_CE_DIRECTION", nullptr,
   [](const char* v, const Sources&, S& s) {
     const std::string direction = env::get_string(v, "pull");
     if (direction != "push" && direction != "pull") throw not_taken(v, direction, "is neither push nor pull");
     s.copy_engine_push = direction == "push";
   },
   same<&S::copy_engine_push>, [](const S& s) { return std::string(s.copy_engine_push ? "push" : "pull"); }},
  {"SYMMEM_CE_STREAMS", nullptr,
   [](const char* v, const Sources&, S& s) { s.copy_engine_streams = static_cast<int>(env::get_int(v, 4)); },
   same<&S::copy_engine_streams>, number<&S::copy_engine_streams>},
  {"SYMMEM_CE_BATCH", nullptr,
   [](const char* v, const Sources&, S& s) { s.copy_engine_batch = env::get_int(v, 1) != 0; },
   same<&S::copy_engine_batch>, number<&S::copy_engine_batch>},
  // 1 GiB by default: no cutting (measured on H200: one large copy per peer is fastest).
  {"SYMMEM_CE_PIECE_KB", nullptr,
   [](const char* v, const Sources&, S& s) {
     s.copy_engine_piece_bytes = static_cast<size_t>(env::get_int(v, 1 << 20)) << 10;
   },
   same<&S::copy_engine_piece_bytes>, [](const S& s) { return std::to_string(s.copy_engine_piece_bytes >> 10); }},
  {"SYMMEM_MOE_COMBINE", nullptr,
   [](const char* v, const Sources&, S& s) {
     const std::string path = env::get_string(v, "auto");
     if (path != "auto" && path != "bulk" && path != "registers" && path != "reduced")
       throw not_taken(v, path, "is none of auto, bulk, registers, reduced");
     s.moe_combine_path = int(path == "bulk"        ? MoeCombinePath::kBulk
                              : path == "registers" ? MoeCombinePath::kRegisters
                              : path == "reduced"   ? MoeCombinePath::kReduced
                                                    : MoeCombinePath::kAuto);
   },
   same<&S::moe_combine_path>, number<&S::moe_combine_path>},
  {"SYMMEM_WORKSPACE_MB", "the workspace budget (CommConfig::workspace_bytes / SYMMEM_WORKSPACE_MB)",
   [](const char* v, const Sources& from, S& s) {
     s.workspace_bytes = from.config.workspace_bytes ? from.config.workspace_bytes
                                                     : static_cast<size_t>(env::get_int(v, 256)) << 20;
   },
   same<&S::workspace_bytes>, number<&S::workspace_bytes>},
  // The heap's free list is the same on every rank only when its reserve is: an allocation that fits
  // on one rank and not on another would fail there alone.
  {"SYMMEM_HEAP_RESERVE_GB", "the heap reserve (CommConfig::heap_reserve_bytes / SYMMEM_HEAP_RESERVE_GB)",
   [](const char*, const Sources& from, S& s) {
     s.heap_reserve_bytes = from.config.heap_reserve_bytes ? from.config.heap_reserve_bytes : env::heap_reserve_bytes();
   },
   same<&S::heap_reserve_bytes>, number<&S::heap_reserve_bytes>},
  // The bootstrap reads it too (JobInfo): its default lives in env::timeout_ms.
  {"SYMMEM_TIMEOUT_MS", "the timeout (CommConfig::timeout_ms / SYMMEM_TIMEOUT_MS)",
   [](const char*, const Sources& from, S& s) {
     s.timeout_ms = from.config.timeout_ms > 0 ? from.config.timeout_ms : env::timeout_ms();
   },
   same<&S::timeout_ms>, number<&S::timeout_ms>},
  // The table in force, read by tuning_table_for (SYMMEM_TUNING_FILE, else the GPU's own).
  {"SYMMEM_TUNING_FILE", "the tuning table (SYMMEM_TUNING_FILE or the GPU model)",
   [](const char*, const Sources& from, S& s) {
     s.tuning_hash = Fnv1a().text(format_tuning_table(from.tuning)).digest();
   },
   same<&S::tuning_hash>, [](const S& s) { return "hash " + std::to_string(s.tuning_hash); }},
};
// clang-format on

}  // namespace

AgreedSettings read_agreed_settings(const CommConfig& config, const TuningTable& tuning) {
  const Sources from{config, tuning};
  AgreedSettings settings;
  for (const AgreedSetting& row : kAgreedSettings) row.read(row.variable, from, settings);
  return settings;
}

void agree_on_settings(const AgreedSettings& mine, Bootstrap& bootstrap, int rank, int world) {
  std::vector<AgreedSettings> all(world);
  bootstrap.all_gather(&mine, all.data(), sizeof(mine));
  for (int r = 0; r < world; ++r)
    for (const AgreedSetting& row : kAgreedSettings)
      if (!row.same(all[r], mine))
        throw Error(ErrorCode::kInvalidArgument,
                    std::string("Communicator::create: ") + (row.label ? row.label : row.variable) +
                        " differs across ranks: rank " + std::to_string(r) + " has " + row.print(all[r]) + ", rank " +
                        std::to_string(rank) + " has " + row.print(mine) + "; set it identically for every rank");
}

std::vector<const char*> agreed_setting_variables() {
  std::vector<const char*> variables;
  for (const AgreedSetting& row : kAgreedSettings) variables.push_back(row.variable);
  return variables;
}

}  // namespace symmem::detail
