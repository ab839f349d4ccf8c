// The shim's settings, read once per communicator from the environment and the GPU, and compared
// among the ranks of a host when the communicator is made: routing depends on them, and ranks that
// route differently deadlock. Ranks that disagree forward everything (all of them, alike).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "nccl/serve_plan.hpp"

namespace symmem::nccl {

// Plain bytes: it travels in the rendezvous hello and is compared with memcmp.
struct ShimSettings {
  uint32_t layout_version = 2;  // of this struct, so that two builds of the shim never agree by accident
  uint8_t mode = 0;             // Mode
  uint8_t eager = 0;            // SYMMEM_NCCL_INIT=eager
  uint8_t serve_one_rank = 0;   // SYMMEM_TEST_NCCL_ONE_RANK (tests only)
  uint8_t reserved = 0;
  uint64_t workspace_bytes = 0;
  int64_t timeout_ms = 0;
  uint64_t cutover_hash = 0;  // the cutover table in force (SYMMEM_NCCL_CUTOVER_FILE or the GPU's)

  Mode shim_mode() const { return static_cast<Mode>(mode); }
  // The fewest ranks a communicator the shim serves has.
  int min_world() const { return serve_one_rank ? 1 : 2; }  // the agreed fewest_ranks_served
};
static_assert(sizeof(ShimSettings) == 32, "ShimSettings is compared as bytes: no implicit padding");

// The fewest ranks of a communicator the shim makes a symmem side for: 2, or 1 under
// SYMMEM_TEST_NCCL_ONE_RANK (tests only).
int fewest_ranks_served();

// The cutover table of `device`'s GPU model (cutover_table_for its name).
const CutoverTable& cutover_table_of_device(int device);
// From the environment, for a communicator on `device` (whose name picks the cutover table).
// Throws kInvalidArgument naming a variable with a value it does not know.
ShimSettings read_shim_settings(int device);
// The first difference, "SYMMEM_NCCL: rank 1 has all, rank 0 has auto", or "" when equal.
std::string describe_difference(const ShimSettings& a, int rank_a, const ShimSettings& b, int rank_b);

}  // namespace symmem::nccl
