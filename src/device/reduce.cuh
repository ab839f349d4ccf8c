// Element reduction for all-reduce and reduce-scatter. 16-bit types accumulate in fp32; sources
// are always combined in rank order 0..world-1, so every rank computes bit-identical results
// whatever order the ranks arrived in. An average is the float32 sum times the correctly rounded
// float32 reciprocal of the world (exact for 2, 4 and 8 ranks but for float32 subnormal results;
// a multiply, where a correctly
// rounded division is a subroutine that spills registers in the vector loops), before the one
// rounding to the type: no second pass, and no overflow of float16's range by a sum whose average
// fits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "device/copy.cuh"
#include "device/device_types.hpp"

namespace symmem::device {

enum ReduceKind : int { kSum = 0, kMax = 1, kMin = 2, kAvg = 3 };

template <typename T>
struct Accum {
  using type = float;
};
template <>
struct Accum<int32_t> {
  using type = int32_t;
};

__device__ __forceinline__ float to_accum(float x) { return x; }
__device__ __forceinline__ float to_accum(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_accum(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ int32_t to_accum(int32_t x) { return x; }

template <typename T>
__device__ __forceinline__ T from_accum(typename Accum<T>::type x);
template <>
__device__ __forceinline__ float from_accum<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_accum<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_accum<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ int32_t from_accum<int32_t>(int32_t x) {
  return x;
}

// max and min of floating types ignore NaN, as NCCL's (fmaxf / __hmax): NaN only where every rank
// holds NaN. A comparison (a > b ? a : b) would return NaN or not depending on which rank holds it.
template <int kOp, typename A>
__device__ __forceinline__ A combine(A a, A b) {
  if constexpr (kOp == kSum || kOp == kAvg)
    return a + b;
  else if constexpr (kOp == kMax) {
    if constexpr (std::is_floating_point_v<A>) return fmaxf(a, b);
    return a > b ? a : b;
  } else {
    if constexpr (std::is_floating_point_v<A>) return fminf(a, b);
    return a < b ? a : b;
  }
}

// What finish() multiplies an average by: 1 / world, correctly rounded (1 for the other ops).
template <int kOp>
__device__ __forceinline__ float average_scale(int world) {
  if constexpr (kOp == kAvg) return __frcp_rn(static_cast<float>(world));
  return 1.0f;
}

// The accumulated value as the element type; an average is scaled first (`scale` from
// average_scale, ignored by the other ops).
template <typename T, int kOp, typename A>
__device__ __forceinline__ T finish(A acc, float scale) {
  if constexpr (kOp == kAvg) {
    static_assert(std::is_same_v<A, float>, "averages are of floating types");
    return from_accum<T>(__fmul_rn(acc, scale));
  } else {
    return from_accum<T>(acc);
  }
}

// Reduces n elements starting at vector-aligned offsets: out = op(src[0][i], ..., src[w-1][i]).
template <typename T, int kOp>
__device__ __forceinline__ T reduce_element(const T* const (&src)[kMaxWorld], int world, size_t i) {
  using A = typename Accum<T>::type;
  A acc = to_accum(src[0][i]);
#pragma unroll
  for (int r = 1; r < kMaxWorld; ++r)
    if (r < world) acc = combine<kOp>(acc, to_accum(src[r][i]));
  return finish<T, kOp>(acc, average_scale<kOp>(world));
}

// For count elements: dst[d][i] = reduce over ranks of src[r][i], for every destination d.
// The body moves 16-byte vectors (when kVector) with every source's load in flight at once;
// a scalar loop covers what is left.
template <typename T, int kOp, bool kVector>
__device__ __forceinline__ void reduce_range(Threads threads, const T* const (&src)[kMaxWorld], int world,
                                             T* const (&dst)[kMaxWorld], int ndst, size_t count) {
  using A = typename Accum<T>::type;
  constexpr int kElems = 16 / sizeof(T);
  const float scale = average_scale<kOp>(world);
  size_t done = 0;
  if constexpr (kVector) {
    constexpr int kUnroll = 2;  // two vectors per source in flight per thread
    const size_t nvec = count / kElems;
    const size_t stride = threads.count;
    for (size_t base = threads.index; base < nvec; base += stride * kUnroll) {
      uint4 in[kUnroll][kMaxWorld];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const size_t v = base + u * stride;
#pragma unroll
        for (int r = 0; r < kMaxWorld; ++r)
          if (r < world && v < nvec) in[u][r] = reinterpret_cast<const uint4*>(src[r])[v];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const size_t v = base + u * stride;
        if (v >= nvec) break;
        A acc[kElems];
        const T* first = reinterpret_cast<const T*>(&in[u][0]);
#pragma unroll
        for (int e = 0; e < kElems; ++e) acc[e] = to_accum(first[e]);
#pragma unroll
        for (int r = 1; r < kMaxWorld; ++r) {
          if (r < world) {
            const T* x = reinterpret_cast<const T*>(&in[u][r]);
#pragma unroll
            for (int e = 0; e < kElems; ++e) acc[e] = combine<kOp>(acc[e], to_accum(x[e]));
          }
        }
        uint4 out;
        T* o = reinterpret_cast<T*>(&out);
#pragma unroll
        for (int e = 0; e < kElems; ++e) o[e] = finish<T, kOp>(acc[e], scale);
#pragma unroll
        for (int d = 0; d < kMaxWorld; ++d)
          if (d < ndst) reinterpret_cast<uint4*>(dst[d])[v] = out;
      }
    }
    done = nvec * kElems;
  }
  // The rest element by element, each by the owner of its 16-byte group (first_owned_group).
  const size_t groups = (count + kElems - 1) / kElems;
  for (size_t g = first_owned_group(done / kElems, threads); g < groups; g += threads.count) {
    for (size_t i = g * kElems; i < (g + 1) * kElems && i < count; ++i) {
      const T value = reduce_element<T, kOp>(src, world, i);
#pragma unroll
      for (int d = 0; d < kMaxWorld; ++d)
        if (d < ndst) dst[d][i] = value;
    }
  }
}

template <typename T, int kOp, bool kVector>
__device__ __forceinline__ void reduce_range(const T* const (&src)[kMaxWorld], int world, T* const (&dst)[kMaxWorld],
                                             int ndst, size_t count) {
  reduce_range<T, kOp, kVector>(grid_threads(), src, world, dst, ndst, count);
}

}  // namespace symmem::device
