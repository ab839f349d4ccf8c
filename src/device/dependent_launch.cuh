// Programmatic dependent launch (PDL, sm_90). symmem launches its kernels with programmatic stream
// serialization (kernels/launch.cuh), so the next kernel on the stream may be launched, and its
// blocks made resident, while the previous one still runs: in CUDA graph replays and back-to-back
// eager calls the launch latency then overlaps the previous kernel instead of following it.
//
// The price is one rule: every kernel calls enter_kernel() before it touches global memory. Its
// wait returns once every kernel this grid depends on has completed and its writes are visible
// (a complete wait, not a trigger), so epochs, call counters and data are read as before. The
// trigger right after it lets the next kernel's blocks launch now; they wait in their own
// enter_kernel() for this grid to complete, so triggering early costs nothing in correctness.
// Launched without the attribute, both instructions do nothing.
#pragma once

#include "device/ptx.cuh"

namespace symmem::device {

__device__ __forceinline__ void enter_kernel() {
  wait_for_prerequisite_grids();
  allow_dependent_grids();
}

}  // namespace symmem::device
