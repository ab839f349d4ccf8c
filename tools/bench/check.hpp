// Error checks of the benchmarks: a failed CUDA call throws std::runtime_error naming the call.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#define BENCH_CUDA_CHECK(expr)                                                                         \
  do {                                                                                                 \
    cudaError_t e_ = (expr);                                                                           \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#expr) + ": " + cudaGetErrorName(e_)); \
  } while (0)
