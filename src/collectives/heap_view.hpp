// Where a local pointer into a heap buffer lies on every rank.
#pragma once

#include "device/device_types.hpp"
#include "symmem/communicator.hpp"

namespace symmem::detail {

// views[r] = rank r's copy of the bytes at `local` (which must lie in `buffer`).
template <typename P>
void peer_views(const Buffer& buffer, const void* local, int world, P (&views)[kMaxWorld]) {
  const size_t offset = static_cast<const char*>(local) - static_cast<const char*>(buffer.ptr());
  for (int r = 0; r < kMaxWorld; ++r)
    views[r] = r < world ? reinterpret_cast<P>(static_cast<char*>(buffer.peer_ptr(r)) + offset) : nullptr;
}

}  // namespace symmem::detail
