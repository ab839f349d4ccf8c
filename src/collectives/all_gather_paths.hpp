// The all-gather paths behind symmem::all_gather, for the dispatcher in all_gather.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "device/device_types.hpp"

namespace symmem::detail {

struct CommunicatorState;

// One copy-engine all-gather (or one chunk of a staged one).
struct CopyEngineCall {
  void* out;                        // this rank's output base; rank r's slot at out + r * slot_stride
  size_t slot_stride;               // bytes between slots (== bytes unless chunked)
  const void* in;                   // this rank's input (bytes)
  size_t bytes;                     // per rank
  const void* in_peers[kMaxWorld];  // pull: every rank's input, as mapped here
  void* out_peers[kMaxWorld];       // push: every rank's output base, as mapped here
  bool push;                        // write into the peers' outputs (else read their inputs)
  bool copy_own;                    // copy `in` into this rank's own slot (out of place)
  uint32_t signature;               // the call's signature (nonzero): the handshake flags carry it
};

// One hierarchical all-gather (or one chunk of a staged one) on the communicator's node layout,
// described as a copy-engine call (push is not used: inside the node it always pulls, from the
// local peers' inputs and outputs, which both must be set when the node has several GPUs). The
// schedule is in src/plan/hierarchical_plan.hpp. Network steps on the between-nodes stream,
// copy-engine steps (zero SMs) on `stream`. Never blocks forever: the copy-engine watchdog
// (board/copy_engine_watchdog.hpp) and the network watchdog (src/net/between_nodes.hpp) bound
// every wait.
void all_gather_hierarchical(CommunicatorState& state, const CopyEngineCall& call, cudaStream_t stream);

// Zero SMs: handshake (stream memory operations on the host board), copies on the copy engines,
// handshake. Never blocks forever: see board/handshake.hpp and board/copy_engine_watchdog.hpp.
void all_gather_copy_engine(CommunicatorState& state, const CopyEngineCall& call, cudaStream_t stream);

}  // namespace symmem::detail
