#include "common/env.hpp"

#include <cstdlib>
#include <string>

#include "common/check.hpp"

namespace symmem::env {

std::string get_string(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return (value && *value) ? std::string(value) : fallback;
}

int64_t get_int(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  if (!value || !*value) return fallback;
  char* end = nullptr;
  long long parsed = std::strtoll(value, &end, 10);
  if (*end != '\0') SYMMEM_THROW(ErrorCode::kInvalidArgument, std::string(name) + "='" + value + "' is not an integer");
  return parsed;
}

int64_t timeout_ms() { return get_int("SYMMEM_TIMEOUT_MS", 30000); }
bool debug() {
  const char* value = std::getenv("SYMMEM_DEBUG");
  return value && *value && std::string(value) != "0";
}
size_t heap_reserve_bytes() { return static_cast<size_t>(get_int("SYMMEM_HEAP_RESERVE_GB", 64)) << 30; }
std::string tuning_file() { return get_string("SYMMEM_TUNING_FILE", ""); }
bool programmatic_launch() { return get_int("SYMMEM_PDL", 1) != 0; }
int node_size() { return static_cast<int>(get_int("SYMMEM_NODE_SIZE", 0)); }
std::string nccl_library() { return get_string("SYMMEM_NCCL_LIBRARY", kDefaultNcclLibrary); }
std::string nccl_mode() { return get_string("SYMMEM_NCCL", "auto"); }
std::string nccl_init() { return get_string("SYMMEM_NCCL_INIT", "lazy"); }
size_t nccl_workspace_bytes() { return static_cast<size_t>(get_int("SYMMEM_NCCL_WORKSPACE_MB", 64)) << 20; }
int64_t nccl_timeout_ms() { return get_int("SYMMEM_NCCL_TIMEOUT_MS", 600000); }
std::string nccl_cutover_file() { return get_string("SYMMEM_NCCL_CUTOVER_FILE", ""); }
std::string nccl_route_log() { return get_string("SYMMEM_NCCL_ROUTE_LOG", ""); }
bool ranks_may_share_gpu() { return get_int("SYMMEM_TEST_SHARED_GPU", 0) != 0; }
bool nccl_serves_one_rank() { return get_int("SYMMEM_TEST_NCCL_ONE_RANK", 0) != 0; }

}  // namespace symmem::env
