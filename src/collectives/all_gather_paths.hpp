// The all-gather paths behind symmem::all_gather, for the dispatcher in all_gather.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "symmem/communicator.hpp"

namespace symmem::detail {

// Copy-engine all-gather: out (local) receives every peer's input. Pull reads in_peers[r] (every
// rank's input, mapped here); push writes `in` into out_peers[r] + rank * bytes (every rank's
// output, mapped here; nullptr when the output is outside the heap). This rank's own slot is
// copied from `in` when copy_own.
void all_gather_copy_engine(Communicator::Impl& impl, void* out, const void* in, size_t bytes,
                            const void* const* in_peers, void* const* out_peers, bool copy_own, cudaStream_t stream);

}  // namespace symmem::detail
