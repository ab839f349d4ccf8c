// The overlap benchmark's figures that rest on no separately measured GEMM: CUDA events around
// each phase of every iteration (the GEMM on its stream, the all-gather on its stream, the
// iteration as a whole) put both on one device timeline, so each iteration yields its own GEMM
// time (slowed by whatever runs beside it), its own all-gather time, and how much of the
// all-gather ran while the GEMM ran (the fraction hidden). docs/benchmarking.md explains the use.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <string>
#include <vector>

#include "bench_context.hpp"
#include "report.hpp"

namespace symmem::bench {

// How one row's iteration is laid out: the GEMM alone, the all-gather after the GEMM on the same
// stream, or the all-gather on a side stream forked before the GEMM and joined after it.
enum class Layout { kGemmOnly, kSequential, kOverlapped };

struct PhaseRow {
  std::string impl;  // as the main table's row
  Layout layout;
  std::function<void(cudaStream_t)> gather;  // empty for kGemmOnly
};

// Medians over the repetitions (each repetition: the median of its iterations), with the spread
// (the fastest and slowest repetition); times are the slowest rank's, the hidden fraction the
// lowest rank's. Microseconds; hidden in [0, 1] (NaN without an all-gather).
struct PhaseFigures {
  std::string impl;
  Spread iteration{}, gemm{}, gather{};  // us
  Spread hidden{};                        // fraction
};

// Runs `reps` repetitions of `iters` iterations of every row in turn (ABAB...), ranks lined up
// before each batch. `gemm` enqueues one GEMM on the stream it is given. Collective.
std::vector<PhaseFigures> measure_phases(BenchContext& ctx, const std::function<void(cudaStream_t)>& gemm,
                                         const std::vector<PhaseRow>& rows, int iters, int reps);

// CSV with impl, the figures above, world, gpu, commit, date (rank 0 writes it).
void write_phases_csv(const std::vector<PhaseFigures>& figures, const Meta& meta, const std::string& path);

}  // namespace symmem::bench
