// Argument checks at the API boundary. Messages carry the actual values; nothing is launched
// when a check fails.
#pragma once

#include <cstddef>
#include <cstdint>

#include "symmem/communicator.hpp"
#include "symmem/types.hpp"

namespace symmem::detail {

// The pointer must be device memory of the communicator's GPU (heap buffers always are).
void require_device_pointer(const void* p, size_t bytes, const char* what, const char* op, Communicator& comm);
// The same for a pointer known to lie outside the communicator's heap buffers (no lookup).
void require_device_memory(const void* p, size_t bytes, const char* what, const char* op, Communicator& comm);

// Overlapping input and output that are not the supported in-place layout corrupt data.
void require_no_partial_overlap(const void* out, size_t out_bytes, const void* in, size_t in_bytes, bool in_place,
                                const char* op);

}  // namespace symmem::detail
