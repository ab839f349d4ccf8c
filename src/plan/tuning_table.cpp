#include "plan/tuning_table.hpp"

#include <cctype>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "common/check.hpp"
#include "common/env.hpp"
#include "common/json_reader.hpp"
#include "shipped_tuning.hpp"

namespace symmem::detail {
namespace {

using Reader = FlatJsonReader;

TuningEntry parse_entry(Reader& r) {
  TuningEntry e;
  r.expect('{');
  bool first = true;
  while (!r.consume('}')) {
    if (!first) r.expect(',');
    first = false;
    const std::string key = r.string();
    r.expect(':');
    if (key == "op")
      e.op = r.string();
    else if (key == "algo") {
      const std::string name = r.string();
      if (!parse_algo(name, &e.algo)) r.fail("unknown algorithm '" + name + "'");
    } else if (key == "world")
      e.world = static_cast<int>(r.number());
    else if (key == "max_bytes")
      e.max_bytes = static_cast<size_t>(r.number());
    else if (key == "blocks")
      e.blocks = static_cast<int>(r.number());
    else if (r.peek('"'))
      r.string();  // unknown keys are ignored (e.g. measured times)
    else
      r.number();
  }
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
  r.expect('{');
  bool first = true;
  while (!r.consume('}')) {
    if (!first) r.expect(',');
    first = false;
    const std::string key = r.string();
    r.expect(':');
    if (key == "entries") {
      r.expect('[');
      bool first_entry = true;
      while (!r.consume(']')) {
        if (!first_entry) r.expect(',');
        first_entry = false;
        t.entries.push_back(parse_entry(r));
      }
    } else if (key == "gpu")
      t.gpu = r.string();
    else if (key == "command")
      t.command = r.string();
    else if (key == "date")
      t.date = r.string();
    else if (r.peek('"'))
      r.string();
    else
      r.number();
  }
  r.done();
  return t;
}

std::string format_tuning_table(const TuningTable& t) {
  auto quote = [](const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') out.push_back('\\');
      out.push_back(c);
    }
    return out + "\"";
  };
  std::ostringstream o;
  o << "{\n  \"gpu\": " << quote(t.gpu) << ",\n  \"command\": " << quote(t.command)
    << ",\n  \"date\": " << quote(t.date) << ",\n  \"entries\": [\n";
  for (size_t i = 0; i < t.entries.size(); ++i) {
    const auto& e = t.entries[i];
    o << "    {\"op\": " << quote(e.op) << ", \"world\": " << e.world << ", \"max_bytes\": " << e.max_bytes
      << ", \"algo\": " << quote(algo_name(e.algo)) << ", \"blocks\": " << e.blocks << "}"
      << (i + 1 < t.entries.size() ? "," : "") << "\n";
  }
  o << "  ]\n}\n";
  return o.str();
}

const TuningTable& tuning_table_for(const std::string& gpu_name) {
  static std::mutex mutex;
  static std::map<std::string, TuningTable> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(gpu_name);
  if (it != cache.end()) return it->second;
  const std::string path = env::tuning_file();
  TuningTable table;
  if (!path.empty()) {
    std::ifstream in(path);
    if (!in) throw Error(ErrorCode::kInvalidArgument, "SYMMEM_TUNING_FILE=" + path + " cannot be read");
    std::stringstream text;
    text << in.rdbuf();
    table = parse_tuning_table(text.str());
  } else {
    std::string file = gpu_name;
    for (char& c : file)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    for (const ShippedTable* t = kShippedTables; t->gpu_file; ++t)
      if (file == t->gpu_file) table = parse_tuning_table(t->json);
  }
  return cache.emplace(gpu_name, std::move(table)).first->second;
}

}  // namespace symmem::detail
