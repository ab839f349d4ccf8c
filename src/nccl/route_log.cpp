#include "nccl/route_log.hpp"

#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include "common/env.hpp"
#include "common/exit_safe_thread_local.hpp"

namespace symmem::nccl {
namespace {

using RouteKey = std::tuple<int, int, int, size_t, int, int, int>;

struct RouteLog {
  std::mutex mutex;
  FILE* file = nullptr;
  std::set<RouteKey> seen;
};

RouteLog* open_log() {
  try {
    const std::string prefix = env::nccl_route_log();
    if (prefix.empty()) return nullptr;
    auto* log = new RouteLog();  // kept for the process
    const std::string path = prefix + "." + std::to_string(::getpid()) + ".csv";
    log->file = std::fopen(path.c_str(), "w");
    if (!log->file) return nullptr;
    std::fprintf(log->file, "collective,type,redop,bytes,world,buffers,route,why\n");
    std::fflush(log->file);
    return log;
  } catch (...) {
    return nullptr;
  }
}

}  // namespace

void log_route(const NcclCall& call, Route route, const char* why) noexcept {
  static RouteLog* log = open_log();
  if (!log) return;
  try {
    const size_t bytes = nccl_size_bytes(call);
    const RouteKey key{int(call.op), int(call.type), int(call.redop), bytes, call.world, int(call.buffers), int(route)};
    // Each thread's own record first: the shared one's lock is taken once per shape and thread,
    // not on every call (threads driving one GPU each would contend for it).
    if (!detail::exit_safe_thread_local<std::set<RouteKey>>().insert(key).second) return;
    std::lock_guard<std::mutex> lock(log->mutex);
    if (!log->seen.insert(key).second) return;
    std::fprintf(log->file, "%s,%d,%d,%zu,%d,%s,%s,\"%s\"\n", collective_name(call.op), int(call.type), int(call.redop),
                 bytes, call.world, buffer_kind_name(call.buffers), route_name(route), why);
    std::fflush(log->file);
  } catch (...) {
  }
}

}  // namespace symmem::nccl
