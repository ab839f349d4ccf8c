// Vectorised grid-wide copies. Every thread keeps several vectors in flight before storing, so
// NVLink reads overlap (memory-level parallelism).
#pragma once

#include <cstddef>
#include <cstdint>

#include "device/device_types.hpp"

// Vectors in flight per thread in scatter (a build switch for A/B runs: -DSYMMEM_SCATTER_UNROLL=1
// is the loop before unrolling).
#ifndef SYMMEM_SCATTER_UNROLL
#define SYMMEM_SCATTER_UNROLL 4
#endif

namespace symmem::device {

__device__ __forceinline__ size_t global_thread() { return size_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t global_threads() { return size_t(gridDim.x) * blockDim.x; }

// The threads that share a loop: thread `index` of `count` (the grid, or one block that works on
// its own range).
struct Threads {
  size_t index;
  size_t count;
};
__device__ __forceinline__ Threads grid_threads() { return {global_thread(), global_threads()}; }
__device__ __forceinline__ Threads block_threads() { return {threadIdx.x, blockDim.x}; }

// Element ownership in the reduction kernels: element i belongs to its 16-byte group
// g = i / (16 / sizeof(T)), and group g to thread g % threads.count, on the vector path and the
// scalar path alike. Kernels whose blocks consume, after a barrier, what the same-index blocks of
// their peers produced (two-shot push, one-shot push, two-shot gather) rely on it: ranks may
// differ in vector width (a local operand's alignment), never in who handles an element.
// The first group >= `from` that this thread owns.
__device__ __forceinline__ size_t first_owned_group(size_t from, Threads t) {
  return from + (t.index + t.count - from % t.count) % t.count;
}
__device__ __forceinline__ size_t first_owned_group(size_t from) { return first_owned_group(from, grid_threads()); }

// One piece of a grid-wide copy: n vectors from src to dst.
template <typename V>
struct CopyTask {
  const V* src;
  V* dst;
  size_t n;
};

// tasks[k].dst[i] = tasks[k].src[i] for every task k < ntasks and i < tasks[k].n <= longest, by
// the threads first, first + stride, ... The index space is flattened element-major
// (i * ntasks + k): neighbouring threads work on different tasks at the same offset, so all tasks
// (peers) advance together, and each thread keeps kUnroll loads in flight however many tasks there
// are. Bytes in flight per block (kUnroll * sizeof(V) * threads) are what lets a few blocks cover
// NVLink's latency. `tasks` lives in shared memory: it is indexed at run time.
template <typename V, int kUnroll>
__device__ __forceinline__ void copy_tasks(const CopyTask<V>* tasks, int ntasks, size_t longest, size_t first,
                                           size_t stride) {
  // One grid-stride step moves (i, k) by (q, r) with a carry; the store loop replays the steps
  // instead of keeping every index in registers, which leaves the registers to the data.
  if (ntasks == 0) return;
  const size_t q = stride / ntasks;
  const int r = static_cast<int>(stride % ntasks);
  auto step = [&](size_t& i, int& k) {
    i += q;
    k += r;
    if (k >= ntasks) {
      k -= ntasks;
      ++i;
    }
  };
  size_t i = first / ntasks;
  int k = static_cast<int>(first % ntasks);
  while (i < longest) {
    V v[kUnroll];
    size_t li = i;
    int lk = k;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (li < tasks[lk].n) v[u] = tasks[lk].src[li];  // n <= longest: in range
      step(li, lk);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i < tasks[k].n) tasks[k].dst[i] = v[u];
      step(i, k);
    }
  }
}

// v[u] = src[base + u * stride] for the indices below n: one batch of a grid-stride copy.
template <typename V, int kUnroll>
__device__ __forceinline__ void load_batch(const V* src, size_t base, size_t stride, size_t n, V (&v)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const size_t i = base + u * stride;
    if (i < n) v[u] = src[i];
  }
}

// dst[d][base + u * stride] = v[u] for d < ndst: one read, many (peer) writes.
template <typename V, int kUnroll>
__device__ __forceinline__ void store_batch(V* const (&dst)[kMaxWorld], int ndst, size_t base, size_t stride, size_t n,
                                            const V (&v)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const size_t i = base + u * stride;
#pragma unroll
    for (int d = 0; d < kMaxWorld; ++d)
      if (d < ndst && i < n) dst[d][i] = v[u];
  }
}

// dst[k][i] = src[k][i] for i < n[k], k < count: slices of different lengths; 16-byte vectors when
// kVector (every pointer aligned), then a tail. Each thread keeps kUnroll vectors of a slice in
// flight before storing them: the loads are local and the stores go over NVLink, so the loop waits
// for a load once per kUnroll vectors, not once per vector. Slices are taken in turn, so registers hold kUnroll
// vectors whatever the world size. Thread t handles vectors t, t + threads, ... as without unrolling.
template <typename T, bool kVector>
__device__ __forceinline__ void scatter(Threads threads, const T* const (&src)[kMaxWorld], T* const (&dst)[kMaxWorld],
                                        const size_t (&n)[kMaxWorld], int count) {
  constexpr size_t kElems = 16 / sizeof(T);
  constexpr int kUnroll = SYMMEM_SCATTER_UNROLL;
  size_t longest = 0;
#pragma unroll
  for (int k = 0; k < kMaxWorld; ++k)
    if (k < count && n[k] > longest) longest = n[k];
  if constexpr (kVector) {
    const size_t stride = threads.count;
    for (size_t base = threads.index; base < longest / kElems; base += stride * kUnroll) {
#pragma unroll
      for (int k = 0; k < kMaxWorld; ++k) {
        if (k >= count) break;
        const size_t vectors = n[k] / kElems;
        uint4 x[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (base + u * stride < vectors) x[u] = reinterpret_cast<const uint4*>(src[k])[base + u * stride];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (base + u * stride < vectors) reinterpret_cast<uint4*>(dst[k])[base + u * stride] = x[u];
      }
    }
  }
  // What the vectors left: each slice's tail (a shorter slice has more of it), element by element
  // by the owner of its group (first_owned_group).
#pragma unroll
  for (int k = 0; k < kMaxWorld; ++k) {
    if (k >= count) break;
    const size_t groups = (n[k] + kElems - 1) / kElems;
    for (size_t g = first_owned_group(kVector ? n[k] / kElems : 0, threads); g < groups; g += threads.count)
      for (size_t i = g * kElems; i < (g + 1) * kElems && i < n[k]; ++i) dst[k][i] = src[k][i];
  }
}

template <typename T, bool kVector>
__device__ __forceinline__ void scatter(const T* const (&src)[kMaxWorld], T* const (&dst)[kMaxWorld],
                                        const size_t (&n)[kMaxWorld], int count) {
  scatter<T, kVector>(grid_threads(), src, dst, n, count);
}

// dst[i] = src[i] for begin <= i < end, by the threads of one block: thread t takes begin + t,
// begin + t + blockDim.x, ..., kUnroll vectors loaded before any is stored, so each thread has
// kUnroll loads in flight (kUnroll x blockDim.x vectors per block and turn).
template <typename V, int kUnroll>
__device__ __forceinline__ void block_copy(const V* src, V* dst, uint64_t begin, uint64_t end) {
  for (uint64_t base = begin; base < end; base += uint64_t(kUnroll) * blockDim.x) {
    V v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const uint64_t i = base + uint64_t(k) * blockDim.x + threadIdx.x;
      if (i < end) v[k] = src[i];
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const uint64_t i = base + uint64_t(k) * blockDim.x + threadIdx.x;
      if (i < end) dst[i] = v[k];
    }
  }
}

}  // namespace symmem::device
