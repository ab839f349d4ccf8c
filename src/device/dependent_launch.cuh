// Programmatic dependent launch (PDL, sm_90). symmem launches its kernels with programmatic stream
// serialization (kernels/launch.cuh), so a symmem kernel may be launched, and its blocks made
// resident, while the kernel before it on the stream still runs: its launch latency overlaps that
// kernel instead of following it (back-to-back collectives, in CUDA graph replays above all).
// Kernels of other libraries are launched as they always are. Because every symmem kernel
// triggers on entry, a symmem successor holds its SM slots while it waits (at most for the
// collective's own duration, bounded by the timeout).
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
