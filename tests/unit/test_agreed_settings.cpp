// The table of agreed settings (comm/agreed_settings.hpp): docs/environment.md documents exactly its
// variables, it parses and refuses values, and ranks that read different values all fail naming
// the setting.
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/agreed_settings.hpp"
#include "plan/moe_combine_path.hpp"
#include "symmem/bootstrap.hpp"
#include "symmem/error.hpp"
#include "test.hpp"

using namespace symmem;
using namespace symmem::detail;

namespace {

// The variables of the table under `heading` in a Markdown page: the backquoted names of each
// row's first cell, up to the next heading.
std::set<std::string> documented_variables(const std::string& page, const std::string& heading) {
  std::ifstream in(page);
  std::set<std::string> names;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("#", 0) == 0) inside = line == heading;
    if (!inside || line.rfind("| `", 0) != 0) continue;
    const std::string cell = line.substr(1, line.find('|', 1) - 1);
    for (size_t open = cell.find('`'); open != std::string::npos; open = cell.find('`', open + 1)) {
      const size_t close = cell.find('`', open + 1);
      names.insert(cell.substr(open + 1, close - open - 1));
      open = close;
    }
  }
  return names;
}

// Every rank's error message (empty: it passed) when `world` ranks agree on their settings.
std::vector<std::string> agreement_errors(const std::vector<AgreedSettings>& settings) {
  const int world = static_cast<int>(settings.size());
  auto group = make_thread_group(world, 5000);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank)
    threads.emplace_back([&, rank] {
      try {
        agree_on_settings(settings[rank], *make_thread_bootstrap(group, rank), rank, world);
      } catch (const Error& e) {
        errors[rank] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

TEST(agreed_settings_are_the_documented_ones) {
  const std::set<std::string> documented =
      documented_variables(SYMMEM_SOURCE_DIR "/docs/environment.md", "## Settings every rank agrees on");
  std::set<std::string> table;
  for (const char* variable : agreed_setting_variables()) table.insert(variable);
  EXPECT(table.size() >= 11);
  for (const std::string& v : table)
    if (!documented.count(v)) ::symmem::test::fail(__FILE__, __LINE__, v + " is not in docs/environment.md's table");
  for (const std::string& v : documented)
    if (!table.count(v))
      ::symmem::test::fail(__FILE__, __LINE__, v + " is documented as agreed but not in comm/agreed_settings.cpp");
}

TEST(agreed_settings_read_and_refuse_values) {
  const TuningTable tuning;
  CommConfig config;
  config.timeout_ms = 1234;
  setenv("SYMMEM_CE_DIRECTION", "push", 1);
  setenv("SYMMEM_CE_PIECE_KB", "64", 1);
  setenv("SYMMEM_ALGO", "one_shot", 1);
  AgreedSettings s = read_agreed_settings(config, tuning);
  EXPECT(s.copy_engine_push);
  EXPECT_EQ(s.copy_engine_piece_bytes, size_t(64) << 10);
  EXPECT(s.forced_algo == Algo::kOneShot);
  EXPECT_EQ(s.timeout_ms, int64_t(1234));
  EXPECT_EQ(s.workspace_bytes, size_t(256) << 20);
  unsetenv("SYMMEM_CE_PIECE_KB");
  unsetenv("SYMMEM_ALGO");
  setenv("SYMMEM_CE_DIRECTION", "sideways", 1);
  EXPECT_ERROR(read_agreed_settings(config, tuning), ErrorCode::kInvalidArgument,
               "SYMMEM_CE_DIRECTION='sideways' is neither push nor pull");
  unsetenv("SYMMEM_CE_DIRECTION");
  setenv("SYMMEM_MOE_COMBINE", "reduced", 1);
  EXPECT(read_agreed_settings(config, tuning).moe_combine_path == int(MoeCombinePath::kReduced));
  setenv("SYMMEM_MOE_COMBINE", "fast", 1);
  EXPECT_ERROR(read_agreed_settings(config, tuning), ErrorCode::kInvalidArgument, "SYMMEM_MOE_COMBINE='fast'");
  unsetenv("SYMMEM_MOE_COMBINE");
  setenv("SYMMEM_BLOCKS", "many", 1);
  EXPECT_ERROR(read_agreed_settings(config, tuning), ErrorCode::kInvalidArgument, "SYMMEM_BLOCKS='many'");
  unsetenv("SYMMEM_BLOCKS");
}

TEST(ranks_with_different_settings_all_fail_naming_the_setting) {
  std::vector<AgreedSettings> settings(3);
  for (const std::string& e : agreement_errors(settings)) EXPECT_EQ(e, std::string());
  settings[2].forced_blocks = 8;
  for (const std::string& e : agreement_errors(settings))
    EXPECT(e.find("SYMMEM_BLOCKS differs across ranks: rank ") != std::string::npos);
  settings[2] = AgreedSettings{};
  settings[1].copy_engine_push = true;
  const std::vector<std::string> errors = agreement_errors(settings);
  EXPECT(errors[0].find("SYMMEM_CE_DIRECTION differs across ranks: rank 1 has push, rank 0 has pull") !=
         std::string::npos);
  settings[1] = AgreedSettings{};
  settings[0].timeout_ms = 5;
  EXPECT(agreement_errors(settings)[2].find("the timeout (CommConfig::timeout_ms / SYMMEM_TIMEOUT_MS) differs") !=
         std::string::npos);
}

// The heap's ranges are taken without asking the peers ("every rank has the same free list"), which
// holds only when every rank reserved the same: a rank with a smaller reserve refused an allocation
// its peers made, and they waited for it until the deadline.
TEST(ranks_with_different_heap_reserves_all_fail_naming_it) {
  const TuningTable tuning;
  CommConfig config;
  setenv("SYMMEM_HEAP_RESERVE_GB", "3", 1);
  EXPECT_EQ(read_agreed_settings(config, tuning).heap_reserve_bytes, size_t(3) << 30);
  config.heap_reserve_bytes = size_t(5) << 30;
  EXPECT_EQ(read_agreed_settings(config, tuning).heap_reserve_bytes, size_t(5) << 30);
  unsetenv("SYMMEM_HEAP_RESERVE_GB");
  std::vector<AgreedSettings> settings(2);
  settings[0].heap_reserve_bytes = size_t(64) << 30;
  settings[1].heap_reserve_bytes = size_t(1) << 30;
  for (const std::string& e : agreement_errors(settings))
    EXPECT(e.find("the heap reserve (CommConfig::heap_reserve_bytes / SYMMEM_HEAP_RESERVE_GB) differs") !=
           std::string::npos);
}
