// Tests only (SYMMEM_TEST_SHARED_GPU=1): several ranks of one process on one GPU. Each rank plans
// with a share of the GPU's SMs, so that no caller of that mode has to know a safe block budget.
//
// Why this share. A rank's SM kernel spins at barriers until the same-index block of every peer
// arrives, so the ranks' kernels only progress when all their blocks are resident together. A rank
// may hold two grids at once: its collective, and the next symmem kernel of its stream, which
// programmatic dependent launch makes resident early, where it waits (device/dependent_launch.cuh;
// a third cannot come early: a kernel triggers its successor only after its own wait). With every
// grid at most `share` blocks, the ranks' spinning blocks number at most 2 x ranks x share <= SMs.
// A block never needs more than one SM, so while any block waits to be placed, some SM is empty
// (the pigeonhole principle) and the block is placed: no rank waits for a peer that cannot start.
// The fused GEMMs hold one grid of `share` SMs each, which leaves at least half the GPU to the
// copies they wait for (copies within one GPU are kernels). The share of sm / (ranks + 1) that this
// replaces let four ranks' 26-block two-shot all-reduces and their early successors ask for 208
// SMs of 132: a rank's blocks never started and its peers waited for it until the deadline.
#pragma once

#include <algorithm>

namespace symmem::detail {

// The SMs each of `ranks_on_gpu` ranks sharing a GPU of `sm_count` SMs plans with (sm_count for a
// rank alone on its GPU).
inline int shared_gpu_sm_share(int sm_count, int ranks_on_gpu) {
  if (ranks_on_gpu <= 1) return sm_count;
  return std::max(1, sm_count / (2 * ranks_on_gpu));
}

}  // namespace symmem::detail
