#include "plan/tuning_table.hpp"

#include <sstream>
#include <string>

#include "common/check.hpp"
#include "common/env.hpp"
#include "common/json_reader.hpp"
#include "common/shipped_table.hpp"
#include "shipped_tuning.hpp"

namespace symmem::detail {
namespace {

using Reader = FlatJsonReader;

TuningEntry parse_entry(Reader& r) {
  TuningEntry e;
  r.object([&](const std::string& key) {
    if (key == "op") {
      e.op = r.string();
    } else if (key == "algo") {
      const std::string name = r.string();
      if (!parse_algo(name, &e.algo)) r.fail("unknown algorithm '" + name + "'");
    } else if (key == "world") {
      e.world = static_cast<int>(r.number());
    } else if (key == "max_bytes") {
      e.max_bytes = static_cast<size_t>(r.number());
    } else if (key == "blocks") {
      e.blocks = static_cast<int>(r.number());
    } else {
      return false;  // unknown keys are ignored (e.g. measured times)
    }
    return true;
  });
  if (e.op.empty() || e.world <= 0) r.fail("entry without op or world");
  return e;
}

}  // namespace

std::optional<TuningEntry> TuningTable::lookup(const std::string& op, int world, size_t bytes) const {
  std::optional<TuningEntry> best;
  for (const auto& e : entries) {
    if (e.op != op || e.world != world || e.max_bytes < bytes) continue;
    if (!best || e.max_bytes < best->max_bytes) best = e;
  }
  return best;
}

TuningTable parse_tuning_table(const std::string& json) {
  TuningTable t;
  Reader r(json, "tuning table");
  r.object([&](const std::string& key) {
    if (key != "entries") return read_origin(r, key, t);
    r.array([&] { t.entries.push_back(parse_entry(r)); });
    return true;
  });
  r.done();
  return t;
}

std::string format_tuning_table(const TuningTable& t) {
  std::ostringstream o;
  write_origin(o, t);
  o << ",\n  \"entries\": [\n";
  for (size_t i = 0; i < t.entries.size(); ++i) {
    const auto& e = t.entries[i];
    o << "    {\"op\": " << json_quote(e.op) << ", \"world\": " << e.world << ", \"max_bytes\": " << e.max_bytes
      << ", \"algo\": " << json_quote(algo_name(e.algo)) << ", \"blocks\": " << e.blocks << "}"
      << (i + 1 < t.entries.size() ? "," : "") << "\n";
  }
  o << "  ]\n}\n";
  return o.str();
}

const TuningTable& tuning_table_for(const std::string& gpu_name) {
  return table_for_gpu<TuningTable>(gpu_name, env::tuning_file, "SYMMEM_TUNING_FILE", kShippedTables,
                                    parse_tuning_table);
}

}  // namespace symmem::detail
