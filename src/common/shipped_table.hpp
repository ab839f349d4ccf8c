// The per-GPU tables the library ships (the tuning tables, plan/tuning_table.hpp; the NCCL cutover
// tables, nccl/cutover_table.hpp), embedded at build time by cmake/embed_tuning.cmake: the one for a
// GPU, or the file an environment variable names instead, each parsed once per GPU name. No CUDA.
#pragma once

#include <cctype>
#include <fstream>
#include <map>
#include <mutex>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>

#include "common/json_reader.hpp"
#include "symmem/error.hpp"

namespace symmem::detail {

#ifndef SYMMEM_SHIPPED_TABLE_DEFINED
#define SYMMEM_SHIPPED_TABLE_DEFINED
struct ShippedTable {  // as cmake/embed_tuning.cmake generates it
  const char* gpu_file;
  const char* json;
};
#endif

// Where every table says it comes from (a Table's gpu, command and date): read_origin reads the
// value of one of those keys into `t` (false for any other key), write_origin writes them as the
// table's JSON opens, `{"gpu": ..., "command": ..., "date": ...` (the caller goes on).
template <typename Table>
bool read_origin(FlatJsonReader& r, const std::string& key, Table& t) {
  if (key == "gpu")
    t.gpu = r.string();
  else if (key == "command")
    t.command = r.string();
  else if (key == "date")
    t.date = r.string();
  else
    return false;
  return true;
}
template <typename Table>
void write_origin(std::ostream& o, const Table& t) {
  o << "{\n  \"gpu\": " << json_quote(t.gpu) << ",\n  \"command\": " << json_quote(t.command)
    << ",\n  \"date\": " << json_quote(t.date);
}

// The table for `gpu_name`, parsed by `parse` (JSON text -> Table) once per name: the file that
// `path_of()` names when it names one (the environment variable `variable`; an unreadable file is
// an error naming it), else the one of `shipped` whose gpu_file is the GPU's name with every
// character but letters and digits as '_', else an empty Table (no table).
template <typename Table, typename Parse>
const Table& table_for_gpu(const std::string& gpu_name, std::string (*path_of)(), const char* variable,
                           const ShippedTable* shipped, Parse&& parse) {
  // Kept for the process (never destroyed): communicators hold references into it, and threads may
  // still plan calls while exit() runs the destructors of statics.
  static std::mutex mutex;  // (trivially destructible)
  static std::map<std::string, Table>& cache = *new std::map<std::string, Table>;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(gpu_name);
  if (it != cache.end()) return it->second;
  const std::string path = path_of();
  Table table;
  if (!path.empty()) {
    std::ifstream in(path);
    if (!in) throw Error(ErrorCode::kInvalidArgument, std::string(variable) + "=" + path + " cannot be read");
    std::stringstream text;
    text << in.rdbuf();
    table = parse(text.str());
  } else {
    std::string file = gpu_name;
    for (char& c : file)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    for (const ShippedTable* t = shipped; t->gpu_file; ++t)
      if (file == t->gpu_file) table = parse(t->json);
  }
  return cache.emplace(gpu_name, std::move(table)).first->second;
}

}  // namespace symmem::detail
