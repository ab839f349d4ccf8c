#include "nccl/cutover_table.hpp"

#include <cctype>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "common/env.hpp"
#include "common/hash.hpp"
#include "common/json_reader.hpp"
#include "shipped_nccl_cutover.hpp"
#include "symmem/error.hpp"

namespace symmem::nccl {
namespace {

using Reader = detail::FlatJsonReader;

CutoverEntry parse_entry(Reader& r) {
  CutoverEntry e;
  r.expect('{');
  bool first = true;
  while (!r.consume('}')) {
    if (!first) r.expect(',');
    first = false;
    const std::string key = r.string();
    r.expect(':');
    if (key == "op") {
      e.op = r.string();
    } else if (key == "world") {
      e.world = static_cast<int>(r.number());
    } else if (key == "nodes") {
      e.spans_nodes = r.number() > 1;
    } else if (key == "max_bytes") {
      e.max_bytes = static_cast<size_t>(r.number());
    } else if (key == "buffers") {
      const std::string kind = r.string();
      if (kind == "staged")
        e.buffers = BufferKind::kStaged;
      else if (kind == "window")
        e.buffers = BufferKind::kWindow;
      else
        r.fail("buffers '" + kind + "' is neither staged nor window");
    } else if (key == "route") {
      const std::string route = r.string();
      if (route == "symmem")
        e.route = Route::kSymmem;
      else if (route == "nccl")
        e.route = Route::kNccl;
      else
        r.fail("route '" + route + "' is neither symmem nor nccl");
    } else if (r.peek('"')) {
      r.string();  // unknown keys are ignored (e.g. measured times)
    } else {
      r.number();
    }
  }
  if (e.op.empty() || e.world <= 0) r.fail("entry without op or world");
  return e;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

}  // namespace

const char* route_name(Route route) { return route == Route::kNccl ? "nccl" : "symmem"; }
const char* buffer_kind_name(BufferKind kind) { return kind == BufferKind::kWindow ? "window" : "staged"; }

std::optional<Route> CutoverTable::lookup(const std::string& op, int world, BufferKind buffers, bool spans_nodes,
                                          size_t bytes, size_t workspace) const {
  if (buffers == BufferKind::kStaged && workspace != workspace_bytes) return std::nullopt;
  const CutoverEntry* best = nullptr;
  for (const auto& e : entries) {
    if (e.op != op || e.world != world || e.buffers != buffers || e.spans_nodes != spans_nodes || e.max_bytes < bytes)
      continue;
    if (!best || e.max_bytes < best->max_bytes) best = &e;
  }
  if (!best) return std::nullopt;
  return best->route;
}

CutoverTable parse_cutover_table(const std::string& json) {
  CutoverTable t;
  Reader r(json, "NCCL cutover table");
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
    } else if (key == "gpu") {
      t.gpu = r.string();
    } else if (key == "command") {
      t.command = r.string();
    } else if (key == "date") {
      t.date = r.string();
    } else if (key == "workspace_mb") {
      t.workspace_bytes = static_cast<size_t>(r.number()) << 20;
    } else if (r.peek('"')) {
      r.string();
    } else {
      r.number();
    }
  }
  r.done();
  return t;
}

std::string format_cutover_table(const CutoverTable& t) {
  std::ostringstream o;
  o << "{\n  \"gpu\": " << quote(t.gpu) << ",\n  \"command\": " << quote(t.command) << ",\n  \"date\": " << quote(t.date)
    << ",\n  \"workspace_mb\": " << (t.workspace_bytes >> 20) << ",\n  \"entries\": [\n";
  for (size_t i = 0; i < t.entries.size(); ++i) {
    const auto& e = t.entries[i];
    o << "    {\"op\": " << quote(e.op) << ", \"world\": " << e.world << ", \"buffers\": \""
      << buffer_kind_name(e.buffers) << "\", \"nodes\": " << (e.spans_nodes ? 2 : 1) << ", \"max_bytes\": " << e.max_bytes
      << ", \"route\": \"" << route_name(e.route) << "\"}" << (i + 1 < t.entries.size() ? "," : "") << "\n";
  }
  o << "  ]\n}\n";
  return o.str();
}

uint64_t cutover_table_hash(const CutoverTable& table) {
  return detail::Fnv1a().text(format_cutover_table(table)).digest();
}

const CutoverTable& cutover_table_for(const std::string& gpu_name) {
  static std::mutex mutex;
  static std::map<std::string, CutoverTable> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(gpu_name);
  if (it != cache.end()) return it->second;
  const std::string path = env::nccl_cutover_file();
  CutoverTable table;
  if (!path.empty()) {
    std::ifstream in(path);
    if (!in) throw Error(ErrorCode::kInvalidArgument, "SYMMEM_NCCL_CUTOVER_FILE=" + path + " cannot be read");
    std::stringstream text;
    text << in.rdbuf();
    table = parse_cutover_table(text.str());
  } else {
    std::string file = gpu_name;
    for (char& c : file)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    for (const detail::ShippedTable* t = detail::kShippedCutoverTables; t->gpu_file; ++t)
      if (file == t->gpu_file) table = parse_cutover_table(t->json);
  }
  return cache.emplace(gpu_name, std::move(table)).first->second;
}

}  // namespace symmem::nccl
