// Vectorised grid-wide copies. Every thread keeps kUnroll vectors from each source in flight
// before storing, so the NVLink reads of all peers overlap (memory-level parallelism).
#pragma once

#include <cstddef>
#include <cstdint>

#include "device/device_types.hpp"

namespace symmem::device {

__device__ __forceinline__ size_t global_thread() { return size_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ size_t global_threads() { return size_t(gridDim.x) * blockDim.x; }

// dst[s][i] = src[s][i] for s < nsrc, i < n (n counts vectors of type V).
template <typename V, int kUnroll>
__device__ __forceinline__ void copy_many(const V* const (&src)[detail::kMaxWorld], V* const (&dst)[detail::kMaxWorld],
                                          int nsrc, size_t n) {
  const size_t stride = global_threads();
  for (size_t base = global_thread(); base < n; base += stride * kUnroll) {
    V v[kUnroll][detail::kMaxWorld];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + u * stride;
#pragma unroll
      for (int s = 0; s < detail::kMaxWorld; ++s)
        if (s < nsrc && i < n) v[u][s] = src[s][i];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const size_t i = base + u * stride;
#pragma unroll
      for (int s = 0; s < detail::kMaxWorld; ++s)
        if (s < nsrc && i < n) dst[s][i] = v[u][s];
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
__device__ __forceinline__ void store_batch(V* const (&dst)[detail::kMaxWorld], int ndst, size_t base, size_t stride,
                                            size_t n, const V (&v)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const size_t i = base + u * stride;
#pragma unroll
    for (int d = 0; d < detail::kMaxWorld; ++d)
      if (d < ndst && i < n) dst[d][i] = v[u];
  }
}

// dst[k][i] = src[k][i] for i < n[k], k < count: slices of different lengths, every source's
// loads in flight together; 16-byte vectors when kVector (every pointer aligned), then a tail.
template <typename T, bool kVector>
__device__ __forceinline__ void scatter(const T* const (&src)[detail::kMaxWorld], T* const (&dst)[detail::kMaxWorld],
                                        const size_t (&n)[detail::kMaxWorld], int count) {
  constexpr size_t kElems = 16 / sizeof(T);
  size_t longest = 0;
#pragma unroll
  for (int k = 0; k < detail::kMaxWorld; ++k)
    if (k < count && n[k] > longest) longest = n[k];
  size_t done = 0;
  if constexpr (kVector) {
    const size_t vectors = longest / kElems;
    for (size_t v = global_thread(); v < vectors; v += global_threads()) {
      uint4 x[detail::kMaxWorld];
#pragma unroll
      for (int k = 0; k < detail::kMaxWorld; ++k)
        if (k < count && (v + 1) * kElems <= n[k]) x[k] = reinterpret_cast<const uint4*>(src[k])[v];
#pragma unroll
      for (int k = 0; k < detail::kMaxWorld; ++k)
        if (k < count && (v + 1) * kElems <= n[k]) reinterpret_cast<uint4*>(dst[k])[v] = x[k];
    }
    done = vectors * kElems;
  }
  // What the vectors left: each slice's tail (a shorter slice has more of it).
#pragma unroll
  for (int k = 0; k < detail::kMaxWorld; ++k) {
    if (k >= count) break;
    const size_t first = kVector ? (n[k] / kElems) * kElems : 0;
    for (size_t i = first + global_thread(); i < n[k]; i += global_threads()) dst[k][i] = src[k][i];
  }
  (void)done;
}

}  // namespace symmem::device
