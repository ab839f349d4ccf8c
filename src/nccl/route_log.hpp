// Where the shim sent each shape of call, for benchmarks (SYMMEM_NCCL_ROUTE_LOG=<prefix>): each
// process writes <prefix>.<pid>.csv, one line per distinct (collective, type, reduction, size,
// world, buffers, route), so that nccl-tests' rows can be told served or forwarded. Off (one load
// of a flag per call) unless the variable is set; never writes to stdout.
#pragma once

#include "nccl/serve_plan.hpp"

namespace symmem::nccl {

void log_route(const NcclCall& call, Route route, const char* why) noexcept;

}  // namespace symmem::nccl
