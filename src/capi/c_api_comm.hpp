// The object behind the C ABI's symmem_comm handle.
#pragma once

#include <memory>

#include "symmem/communicator.hpp"
#include "symmem/symmem_c.h"

struct symmem_comm {
  std::unique_ptr<symmem::Communicator> comm;
};

namespace symmem::detail {
// Unbinds every pool slot bound to `comm` (before it is destroyed).
void release_pool_slots_of(const symmem_comm* comm) noexcept;
}  // namespace symmem::detail
