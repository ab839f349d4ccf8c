#include "nccl/shim_settings.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

#include "common/check.hpp"
#include "common/env.hpp"
#include "nccl/cutover_table.hpp"

namespace symmem::nccl {

int fewest_ranks_served() {
  ShimSettings s;
  s.serve_one_rank = env::nccl_serves_one_rank();
  return s.min_world();
}

const CutoverTable& cutover_table_of_device(int device) {
  cudaDeviceProp prop{};
  SYMMEM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return cutover_table_for(prop.name);
}

ShimSettings read_shim_settings(int device) {
  ShimSettings s;
  Mode mode = Mode::kAuto;
  const std::string mode_text = env::nccl_mode();
  if (!parse_mode(mode_text, &mode))
    throw Error(ErrorCode::kInvalidArgument, "SYMMEM_NCCL='" + mode_text + "' is none of auto, all, off");
  s.mode = static_cast<uint8_t>(mode);
  const std::string init = env::nccl_init();
  if (init != "lazy" && init != "eager")
    throw Error(ErrorCode::kInvalidArgument, "SYMMEM_NCCL_INIT='" + init + "' is neither lazy nor eager");
  s.eager = init == "eager";
  s.serve_one_rank = env::nccl_serves_one_rank();
  s.workspace_bytes = env::nccl_workspace_bytes();
  s.timeout_ms = env::nccl_timeout_ms();
  if (s.timeout_ms <= 0)
    throw Error(ErrorCode::kInvalidArgument, "SYMMEM_NCCL_TIMEOUT_MS=" + std::to_string(s.timeout_ms) + " is not positive");
  s.cutover_hash = cutover_table_hash(cutover_table_of_device(device));
  return s;
}

std::string describe_difference(const ShimSettings& a, int rank_a, const ShimSettings& b, int rank_b) {
  if (std::memcmp(&a, &b, sizeof(a)) == 0) return "";
  auto differ = [&](const char* name, const std::string& va, const std::string& vb) {
    return std::string(name) + ": rank " + std::to_string(rank_a) + " has " + va + ", rank " + std::to_string(rank_b) +
           " has " + vb;
  };
  if (a.layout_version != b.layout_version)
    return differ("the shim's build", std::to_string(a.layout_version), std::to_string(b.layout_version));
  if (a.mode != b.mode) return differ("SYMMEM_NCCL", mode_name(a.shim_mode()), mode_name(b.shim_mode()));
  if (a.eager != b.eager) return differ("SYMMEM_NCCL_INIT", a.eager ? "eager" : "lazy", b.eager ? "eager" : "lazy");
  if (a.serve_one_rank != b.serve_one_rank)
    return differ("SYMMEM_TEST_NCCL_ONE_RANK", std::to_string(a.serve_one_rank), std::to_string(b.serve_one_rank));
  if (a.workspace_bytes != b.workspace_bytes)
    return differ("SYMMEM_NCCL_WORKSPACE_MB", std::to_string(a.workspace_bytes >> 20),
                  std::to_string(b.workspace_bytes >> 20));
  if (a.timeout_ms != b.timeout_ms)
    return differ("SYMMEM_NCCL_TIMEOUT_MS", std::to_string(a.timeout_ms), std::to_string(b.timeout_ms));
  return differ("the cutover table (SYMMEM_NCCL_CUTOVER_FILE or the GPU model)", "hash " + std::to_string(a.cutover_hash),
                "hash " + std::to_string(b.cutover_hash));
}

}  // namespace symmem::nccl
