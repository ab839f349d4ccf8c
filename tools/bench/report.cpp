#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

namespace symmem::bench {

void compute_bandwidth(Row* r) {
  if (r->time_us <= 0) return;
  const double seconds = r->time_us * 1e-6;
  const double w = r->world;
  const double bytes = static_cast<double>(r->bytes_per_rank);
  if (r->op == "all_gather" || r->op == "overlap") {
    r->algbw_gbs = w * bytes / seconds / 1e9;
    r->busbw_gbs = (w - 1) * bytes / seconds / 1e9;
  } else if (r->op.rfind("all_to_all", 0) == 0) {
    // nccl-tests' alltoall: algbw = bytes each rank sends / time; busbw = algbw (world - 1) / world.
    r->algbw_gbs = bytes / seconds / 1e9;
    r->busbw_gbs = (w - 1) / w * bytes / seconds / 1e9;
  } else if (r->op == "reduce_scatter") {
    r->algbw_gbs = w * bytes / seconds / 1e9;
    r->busbw_gbs = (w - 1) * bytes / seconds / 1e9;
  } else {  // all_reduce
    r->algbw_gbs = bytes / seconds / 1e9;
    r->busbw_gbs = 2 * (w - 1) / w * bytes / seconds / 1e9;
  }
}

void compare_with_nccl(std::vector<Row>* rows) {
  std::map<std::pair<std::string, size_t>, double> best;
  for (const auto& r : *rows)
    if (r.impl.rfind("nccl", 0) == 0) {
      auto& b = best[{r.op + "/" + r.mode, r.bytes_per_rank}];
      b = std::max(b, r.busbw_gbs);
    }
  for (auto& r : *rows) {
    if (r.impl.rfind("symmem", 0) != 0) continue;
    auto it = best.find({r.op + "/" + r.mode, r.bytes_per_rank});
    if (it != best.end() && it->second > 0) r.vs_best_nccl = r.busbw_gbs / it->second;
  }
}

std::string format_bytes(size_t b) {
  char buf[32];
  if (b >= (size_t(1) << 30) && b % (size_t(1) << 30) == 0)
    std::snprintf(buf, sizeof(buf), "%zuG", b >> 30);
  else if (b >= (size_t(1) << 20) && b % (size_t(1) << 20) == 0)
    std::snprintf(buf, sizeof(buf), "%zuM", b >> 20);
  else if (b >= (size_t(1) << 10) && b % (size_t(1) << 10) == 0)
    std::snprintf(buf, sizeof(buf), "%zuK", b >> 10);
  else
    std::snprintf(buf, sizeof(buf), "%zu", b);
  return buf;
}

std::string table_header() {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%12s %12s %9s %-26s %6s %11s %10s %10s %9s %9s %7s %8s", "size", "count", "type",
                "impl", "blocks", "time(us)", "min(us)", "max(us)", "algbw", "busbw", "#wrong", "vs_nccl");
  return buf;
}

std::string table_row(const Row& r) {
  char wrong[24], ratio[16], blocks[16];
  if (r.wrong < 0)
    std::snprintf(wrong, sizeof(wrong), "N/A");
  else
    std::snprintf(wrong, sizeof(wrong), "%ld", r.wrong);
  if (r.vs_best_nccl > 0)
    std::snprintf(ratio, sizeof(ratio), "%.2fx", r.vs_best_nccl);
  else
    std::snprintf(ratio, sizeof(ratio), "-");
  if (r.blocks < 0)
    std::snprintf(blocks, sizeof(blocks), "auto");
  else
    std::snprintf(blocks, sizeof(blocks), "%d", r.blocks);
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%12zu %12zu %9s %-26s %6s %11.2f %10.2f %10.2f %9.2f %9.2f %7s %8s",
                r.bytes_per_rank, r.count, r.dtype.c_str(), r.impl.c_str(), blocks, r.time_us, r.time_min_us,
                r.time_max_us, r.algbw_gbs, r.busbw_gbs, wrong, ratio);
  return buf;
}

std::string csv_header() {
  return "op,impl,mode,world,nodes,dtype,bytes_per_rank,count,blocks,time_us,time_min_us,time_max_us,algbw_gbs,"
         "busbw_gbs,wrong,vs_best_nccl,gpu,commit,date,command";
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

Spread spread_of(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  if (v.empty()) return {NAN, NAN, NAN};
  std::sort(v.begin(), v.end());
  const size_t k = v.size();
  return {k % 2 ? v[k / 2] : (v[k / 2 - 1] + v[k / 2]) / 2, v.front(), v.back()};
}

std::string csv_row(const Row& r, const Meta& m) {
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%s,%s,%s,%d,%d,%s,%zu,%zu,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%ld,%.4f,", r.op.c_str(),
                r.impl.c_str(), r.mode.c_str(), r.world, r.nodes, r.dtype.c_str(), r.bytes_per_rank, r.count, r.blocks,
                r.time_us, r.time_min_us, r.time_max_us, r.algbw_gbs, r.busbw_gbs, r.wrong, r.vs_best_nccl);
  return buf + csv_field(m.gpu) + "," + csv_field(m.commit) + "," + csv_field(m.date) + "," + csv_field(m.command);
}

static std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string to_json(const std::vector<Row>& rows, const Meta& m) {
  std::ostringstream o;
  o << "{\n  \"meta\": {\"gpu\": " << json_string(m.gpu) << ", \"commit\": " << json_string(m.commit)
    << ", \"date\": " << json_string(m.date) << ", \"command\": " << json_string(m.command)
    << ", \"world\": " << m.world << "},\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    char buf[512];
    std::snprintf(
        buf, sizeof(buf),
        "{\"op\": \"%s\", \"impl\": \"%s\", \"mode\": \"%s\", \"world\": %d, \"nodes\": %d, \"dtype\": \"%s\", "
        "\"bytes_per_rank\": %zu, \"count\": %zu, \"blocks\": %d, \"time_us\": %.3f, \"time_min_us\": %.3f, "
        "\"time_max_us\": %.3f, \"algbw_gbs\": %.3f, \"busbw_gbs\": %.3f, \"wrong\": %ld, "
        "\"vs_best_nccl\": %.4f}",
        r.op.c_str(), r.impl.c_str(), r.mode.c_str(), r.world, r.nodes, r.dtype.c_str(), r.bytes_per_rank, r.count,
        r.blocks, r.time_us, r.time_min_us, r.time_max_us, r.algbw_gbs, r.busbw_gbs, r.wrong, r.vs_best_nccl);
    o << "    " << buf << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  o << "  ]\n}\n";
  return o.str();
}

void write_files(const std::vector<Row>& rows, const Meta& meta, const std::string& csv_path,
                 const std::string& json_path) {
  if (!csv_path.empty()) {
    std::ofstream csv(csv_path);
    if (!csv) throw std::runtime_error("cannot write " + csv_path);
    csv << csv_header() << "\n";
    for (const auto& r : rows) csv << csv_row(r, meta) << "\n";
  }
  if (!json_path.empty()) {
    std::ofstream json(json_path);
    if (!json) throw std::runtime_error("cannot write " + json_path);
    json << to_json(rows, meta);
  }
}

}  // namespace symmem::bench
