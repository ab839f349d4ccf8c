// The cutover table: where NCCL is faster than symmem behind the NCCL API, so that a call symmem
// could serve goes to NCCL instead. Measured by running nccl-tests on plain NCCL and through
// libsymmem_nccl.so with SYMMEM_NCCL=all (scripts/nccl_tests_run.sh), turned into a table by
// tools/nccl_cutover.py, shipped per GPU under tuning/nccl/ and embedded at build time. Pure C++.
//
// Format (one object, entries flat; sizes in nccl-tests' "size" column: the larger of the two
// buffers, i.e. all_gather's output, reduce_scatter's input, all_reduce's and alltoall's buffer):
//   {"gpu": "NVIDIA H200", "command": "...", "date": "...", "workspace_mb": 16,
//    "entries": [{"op": "all_reduce", "world": 2, "buffers": "staged", "nodes": 1,
//                 "max_bytes": 8388608, "route": "symmem"}, ...]}
// buffers: "staged" (plain device memory, staged through the workspace) or "window" (registered
// with ncclCommWindowRegister: zero copy). nodes: 1, or 2 for a communicator spanning nodes (any
// number). Rows hold only for the workspace they were measured with (workspace_mb): staged calls run in
// chunks of its areas, and so do some algorithms on windows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace symmem::nccl {

enum class Route { kNccl, kSymmem };
enum class BufferKind { kStaged, kWindow };

const char* route_name(Route route);           // "nccl", "symmem"
const char* buffer_kind_name(BufferKind kind);  // "staged", "window"

struct CutoverEntry {
  std::string op;  // "all_reduce", "all_gather", "reduce_scatter", "alltoall"
  int world = 0;
  BufferKind buffers = BufferKind::kStaged;
  bool spans_nodes = false;
  size_t max_bytes = 0;
  Route route = Route::kSymmem;
};

struct CutoverTable {
  std::string gpu;
  std::string command;
  std::string date;
  size_t workspace_bytes = 0;  // the budget the rows were measured with
  std::vector<CutoverEntry> entries;

  // The row for the smallest max_bytes >= bytes among those of (op, world, buffers, spans_nodes);
  // nothing when there is none, or when the table was measured with another workspace budget.
  std::optional<Route> lookup(const std::string& op, int world, BufferKind buffers, bool spans_nodes, size_t bytes,
                              size_t workspace_bytes) const;
};

// Throws kInvalidArgument with the position of the first error.
CutoverTable parse_cutover_table(const std::string& json);
std::string format_cutover_table(const CutoverTable& table);
// A hash every rank compares (the ranks must route alike).
uint64_t cutover_table_hash(const CutoverTable& table);

// The table for this GPU: SYMMEM_NCCL_CUTOVER_FILE if set, else tuning/nccl/<gpu name>.json as
// embedded in the library, else an empty table (the built-in rules of serve_plan.hpp apply).
// Cached per GPU name.
const CutoverTable& cutover_table_for(const std::string& gpu_name);

}  // namespace symmem::nccl
