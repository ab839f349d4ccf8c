#include "nccl/cutover_table.hpp"

#include <sstream>
#include <string>

#include "common/env.hpp"
#include "common/hash.hpp"
#include "common/json_reader.hpp"
#include "common/shipped_table.hpp"
#include "shipped_nccl_cutover.hpp"
#include "symmem/error.hpp"

namespace symmem::nccl {
namespace {

using detail::json_quote;
using Reader = detail::FlatJsonReader;

CutoverEntry parse_entry(Reader& r) {
  CutoverEntry e;
  r.object([&](const std::string& key) {
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
    } else {
      return false;  // unknown keys are ignored (e.g. measured times)
    }
    return true;
  });
  if (e.op.empty() || e.world <= 0) r.fail("entry without op or world");
  return e;
}

}  // namespace

const char* route_name(Route route) { return route == Route::kNccl ? "nccl" : "symmem"; }
const char* buffer_kind_name(BufferKind kind) { return kind == BufferKind::kWindow ? "window" : "staged"; }

std::optional<Route> CutoverTable::lookup(const std::string& op, int world, BufferKind buffers, bool spans_nodes,
                                          size_t bytes, size_t workspace) const {
  // Staged calls run in chunks of the workspace's areas, and so do some algorithms on windows.
  if (workspace != workspace_bytes) return std::nullopt;
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
  r.object([&](const std::string& key) {
    if (key == "entries")
      r.array([&] { t.entries.push_back(parse_entry(r)); });
    else if (key == "workspace_mb")
      t.workspace_bytes = static_cast<size_t>(r.number()) << 20;
    else
      return detail::read_origin(r, key, t);
    return true;
  });
  r.done();
  return t;
}

std::string format_cutover_table(const CutoverTable& t) {
  std::ostringstream o;
  detail::write_origin(o, t);
  o << ",\n  \"workspace_mb\": " << (t.workspace_bytes >> 20) << ",\n  \"entries\": [\n";
  for (size_t i = 0; i < t.entries.size(); ++i) {
    const auto& e = t.entries[i];
    o << "    {\"op\": " << json_quote(e.op) << ", \"world\": " << e.world << ", \"buffers\": \""
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
  return detail::table_for_gpu<CutoverTable>(gpu_name, env::nccl_cutover_file, "SYMMEM_NCCL_CUTOVER_FILE",
                                             detail::kShippedCutoverTables, parse_cutover_table);
}

}  // namespace symmem::nccl
