#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "test_kernels.hpp"

namespace symmem::test {
namespace {

__host__ __device__ inline uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

__device__ inline uint8_t pattern(uint64_t seed, size_t i) {
  return static_cast<uint8_t>(mix(seed + i * 0x9E3779B97F4A7C15ull) >> 24);
}
__device__ inline int small_integer(uint64_t seed, size_t i) {
  return static_cast<int>(mix(seed ^ (i * 0x9E3779B97F4A7C15ull)) % 17) - 8;
}

void check(cudaError_t e) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("test kernel: ") + cudaGetErrorName(e));
}

__global__ void fill_pattern_kernel(uint8_t* p, size_t bytes, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < bytes; i += size_t(gridDim.x) * blockDim.x)
    p[i] = pattern(seed, i);
}

__global__ void gather_check_kernel(const uint8_t* out, size_t bytes, int world, uint64_t iteration,
                                    unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (int r = 0; r < world; ++r) {
    const uint64_t seed = mix(uint64_t(r + 1) * 0x100000001b3ull ^ iteration);
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < bytes; i += size_t(gridDim.x) * blockDim.x)
      bad += out[r * bytes + i] != pattern(seed, i);
  }
  if (bad) atomicAdd(mismatches, bad);
}

template <typename T>
__device__ T from_int(int v);
template <>
__device__ float from_int<float>(int v) {
  return static_cast<float>(v);
}
template <>
__device__ __half from_int<__half>(int v) {
  return __int2half_rn(v);
}
template <>
__device__ __nv_bfloat16 from_int<__nv_bfloat16>(int v) {
  return __int2bfloat16_rn(v);
}
template <>
__device__ int32_t from_int<int32_t>(int v) {
  return v;
}

template <typename T>
__device__ T from_float(float v);
template <>
__device__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ inline double to_double(float v) { return v; }
__device__ inline double to_double(__half v) { return __half2float(v); }
__device__ inline double to_double(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline double to_double(int32_t v) { return v; }

template <typename T>
__device__ bool same_bits(T a, T b) {
  return *reinterpret_cast<const unsigned short*>(&a) == *reinterpret_cast<const unsigned short*>(&b);
}
template <>
__device__ bool same_bits<float>(float a, float b) {
  return a == b;
}
template <>
__device__ bool same_bits<int32_t>(int32_t a, int32_t b) {
  return a == b;
}

template <typename T>
__global__ void fill_small_kernel(T* p, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    p[i] = from_int<T>(small_integer(seed, i));
}

// Storage index s holds element (s % rows, s / rows) of the row-major small-integer matrix.
template <typename T>
__global__ void fill_small_column_major_kernel(T* p, int rows, int cols, uint64_t seed) {
  const size_t count = size_t(rows) * cols;
  for (size_t s = blockIdx.x * size_t(blockDim.x) + threadIdx.x; s < count; s += size_t(gridDim.x) * blockDim.x)
    p[s] = from_int<T>(small_integer(seed, (s % rows) * cols + s / rows));
}

template <typename T>
__global__ void sum_check_kernel(const T* out, size_t count, size_t first, int world, uint64_t iteration,
                                 unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    int expected = 0;
    for (int r = 0; r < world; ++r)
      expected += small_integer(mix(uint64_t(r + 1) * 0x100000001b3ull ^ iteration), first + i);
    bad += !same_bits(out[i], from_int<T>(expected));
  }
  if (bad) atomicAdd(mismatches, bad);
}

// One thread per output element (grid-stride): the exact float32 sum of products, rounded once.
template <typename T>
__global__ void gathered_product_check_kernel(const T* c, int m, int n, int k, int shard_rows, uint64_t iteration,
                                              uint64_t b_seed, unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < size_t(m) * n; e += size_t(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(e / n), j = static_cast<int>(e % n);
    const int shard = i / shard_rows;
    const uint64_t a_seed = mix(uint64_t(shard + 1) * 0x100000001b3ull ^ iteration);
    const size_t a_row = size_t(i % shard_rows) * k;
    float sum = 0.0f;
    for (int kk = 0; kk < k; ++kk)
      sum += float(small_integer(a_seed, a_row + kk)) * float(small_integer(b_seed, size_t(kk) * n + j));
    bad += !same_bits(c[e], from_int<T>(static_cast<int>(sum)));  // (sum is an exact integer)
  }
  if (bad) atomicAdd(mismatches, bad);
}

template <typename T>
__global__ void summed_product_check_kernel(const T* c, int first_row, int rows, int n, int k, int world,
                                            uint64_t iteration, unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (size_t e = blockIdx.x * size_t(blockDim.x) + threadIdx.x; e < size_t(rows) * n;
       e += size_t(gridDim.x) * blockDim.x) {
    const int i = first_row + static_cast<int>(e / n), j = static_cast<int>(e % n);
    float sum = 0.0f;
    for (int r = 0; r < world; ++r) {
      const uint64_t a_seed = mix(uint64_t(r + 1) * 0x100000001b3ull ^ iteration);
      const uint64_t b_seed = mix(uint64_t(r + 1) * 0x100000001b3ull ^ (iteration + kSecondOperand));
      for (int kk = 0; kk < k; ++kk)
        sum += float(small_integer(a_seed, size_t(i) * k + kk)) * float(small_integer(b_seed, size_t(kk) * n + j));
    }
    bad += !same_bits(c[e], from_int<T>(static_cast<int>(sum)));  // (sum is an exact integer)
  }
  if (bad) atomicAdd(mismatches, bad);
}

template <typename T>
__global__ void small_integer_check_kernel(const T* p, size_t count, uint64_t seed, unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    bad += !same_bits(p[i], from_int<T>(small_integer(seed, i)));
  if (bad) atomicAdd(mismatches, bad);
}

// Spins `ns` nanoseconds of the global timer, or until *release != 0 (no release: the full time).
__device__ void spin_for(uint64_t ns, const volatile int* release) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while ((release == nullptr || *release == 0) && now - start < ns);
}

__global__ void hog_kernel(const volatile int* release, uint64_t ns) { spin_for(ns, release); }

__global__ void delay_kernel(uint64_t ns) { spin_for(ns, nullptr); }

__global__ void differences_kernel(const uint8_t* a, const uint8_t* b, size_t bytes, unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < bytes; i += size_t(gridDim.x) * blockDim.x)
    bad += a[i] != b[i];
  if (bad) atomicAdd(mismatches, bad);
}

__global__ void pattern_check_kernel(const uint8_t* p, size_t bytes, uint64_t seed, unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < bytes; i += size_t(gridDim.x) * blockDim.x)
    bad += p[i] != pattern(seed, i);
  if (bad) atomicAdd(mismatches, bad);
}

// A nonzero multiple of 1/4 in [-8, 8] (int32: a nonzero integer in [-1000, 1000]).
template <typename T>
__device__ T exact_value(uint64_t seed, size_t i) {
  const uint64_t h = mix(seed ^ (i * 0xD1B54A32D192ED03ull));
  const int k = static_cast<int>(h % 32) + 1;  // 1 .. 32
  const float v = (h & (1ull << 40)) ? -0.25f * k : 0.25f * k;
  if constexpr (std::is_same_v<T, int32_t>) {
    const int n = static_cast<int>(h % 1000) + 1;
    return static_cast<T>((h & (1ull << 40)) ? -n : n);
  } else {
    return from_float<T>(v);
  }
}

// Uniform in [-1, 1) with 24 random bits, then rounded to T (int32: integer in [-1000, 1000]).
template <typename T>
__device__ T uniform_value(uint64_t seed, size_t i) {
  const uint64_t h = mix(seed + i * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
  if constexpr (std::is_same_v<T, int32_t>) {
    return static_cast<T>(static_cast<int>(h % 2001) - 1000);
  } else {
    const float u = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1), exact
    return from_float<T>(2.0f * u - 1.0f);
  }
}

template <typename T>
__global__ void fill_exact_kernel(T* p, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    p[i] = exact_value<T>(seed, i);
}

template <typename T>
__global__ void fill_uniform_kernel(T* p, size_t count, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uniform_value<T>(seed, i);
}

// The tolerances of tests/gpu/test_reductions.cpp: fp32 accumulation, one rounding to T.
template <typename T>
__device__ double tolerance_of(double reference, double magnitude) {
  if constexpr (std::is_same_v<T, float>) return 1e-6 * magnitude + 1e-7;
  if constexpr (std::is_same_v<T, __half>) return fabs(reference) * (1.0 / 1024) + 1e-4;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return fabs(reference) * (1.0 / 128) + 1e-3;
  return 0;
}

template <typename T>
__global__ void far_from_sum_kernel(const T* out, size_t count, size_t first, RankSeeds seeds,
                                    unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    double reference = 0, magnitude = 0;
    for (int r = 0; r < seeds.world; ++r) {
      const double v = to_double(uniform_value<T>(seeds.seed[r], first + i));
      reference += v;
      magnitude += fabs(v);
    }
    const double got = to_double(out[i]);
    bad += !(fabs(got - reference) <= tolerance_of<T>(reference, magnitude));  // NaN counts
  }
  if (bad) atomicAdd(mismatches, bad);
}

__global__ void digest_kernel(const uint8_t* p, size_t bytes, unsigned long long* digest) {
  unsigned long long sum = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < bytes; i += size_t(gridDim.x) * blockDim.x)
    sum += mix((uint64_t(p[i]) << 56) ^ (i * 0x9E3779B97F4A7C15ull) ^ 0x5851F42D4C957F2Dull);
  atomicAdd(digest, sum);  // addition commutes: the digest does not depend on the thread order
}

template <typename F>
void dispatch(DataType type, F&& f) {
  switch (type) {
    case DataType::kFloat32: return f(float{});
    case DataType::kFloat16: return f(__half{});
    case DataType::kBFloat16: return f(__nv_bfloat16{});
    case DataType::kInt32: return f(int32_t{});
    default: throw std::runtime_error("test kernels: no small integers of this type");
  }
}

constexpr int kBlocks = 264, kThreads = 256;

}  // namespace

uint64_t pattern_seed(int rank, uint64_t iteration) { return mix(uint64_t(rank + 1) * 0x100000001b3ull ^ iteration); }

void fill_pattern(void* p, size_t bytes, uint64_t seed, cudaStream_t stream) {
  fill_pattern_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<uint8_t*>(p), bytes, seed);
  check(cudaGetLastError());
}

void count_gather_mismatches(const void* out, size_t bytes, int world, uint64_t iteration,
                             unsigned long long* mismatches, cudaStream_t stream) {
  gather_check_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<const uint8_t*>(out), bytes, world, iteration,
                                                        mismatches);
  check(cudaGetLastError());
}

void fill_small_integers(void* p, size_t count, DataType type, uint64_t seed, cudaStream_t stream) {
  dispatch(type, [&](auto t) {
    using T = decltype(t);
    fill_small_kernel<T><<<kBlocks, kThreads, 0, stream>>>(static_cast<T*>(p), count, seed);
  });
  check(cudaGetLastError());
}

void fill_small_integers_column_major(void* p, int rows, int cols, DataType type, uint64_t seed,
                                      cudaStream_t stream) {
  dispatch(type, [&](auto t) {
    using T = decltype(t);
    fill_small_column_major_kernel<T><<<kBlocks, kThreads, 0, stream>>>(static_cast<T*>(p), rows, cols, seed);
  });
  check(cudaGetLastError());
}

void count_sum_mismatches(const void* out, size_t count, size_t first, DataType type, int world, uint64_t iteration,
                          unsigned long long* mismatches, cudaStream_t stream) {
  dispatch(type, [&](auto t) {
    using T = decltype(t);
    sum_check_kernel<T>
        <<<kBlocks, kThreads, 0, stream>>>(static_cast<const T*>(out), count, first, world, iteration, mismatches);
  });
  check(cudaGetLastError());
}

void count_gathered_product_mismatches(const void* c, int m, int n, int k, int shard_rows, DataType type,
                                       uint64_t iteration, uint64_t b_seed, unsigned long long* mismatches,
                                       cudaStream_t stream) {
  dispatch(type, [&](auto t) {
    using T = decltype(t);
    gathered_product_check_kernel<T><<<kBlocks, kThreads, 0, stream>>>(static_cast<const T*>(c), m, n, k, shard_rows,
                                                                        iteration, b_seed, mismatches);
  });
  check(cudaGetLastError());
}

void count_summed_product_mismatches(const void* c_shard, int first_row, int rows, int n, int k, int world,
                                     DataType type, uint64_t iteration, unsigned long long* mismatches,
                                     cudaStream_t stream) {
  dispatch(type, [&](auto t) {
    using T = decltype(t);
    summed_product_check_kernel<T><<<kBlocks, kThreads, 0, stream>>>(static_cast<const T*>(c_shard), first_row, rows,
                                                                      n, k, world, iteration, mismatches);
  });
  check(cudaGetLastError());
}

void count_small_integer_mismatches(const void* p, size_t count, DataType type, uint64_t seed,
                                    unsigned long long* mismatches, cudaStream_t stream) {
  dispatch(type, [&](auto t) {
    using T = decltype(t);
    small_integer_check_kernel<T><<<kBlocks, kThreads, 0, stream>>>(static_cast<const T*>(p), count, seed, mismatches);
  });
  check(cudaGetLastError());
}

void launch_sm_hog(int sm_count, const volatile int* release, int ms, cudaStream_t stream) {
  hog_kernel<<<sm_count * 2, 1024, 0, stream>>>(release, uint64_t(ms) * 1000000ull);
  check(cudaGetLastError());
}

void launch_delay(int us, cudaStream_t stream) {
  delay_kernel<<<1, 32, 0, stream>>>(uint64_t(us) * 1000ull);
  check(cudaGetLastError());
}

void count_differences(const void* a, const void* b, size_t bytes, unsigned long long* mismatches,
                       cudaStream_t stream) {
  differences_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b),
                                                       bytes, mismatches);
  check(cudaGetLastError());
}

void count_pattern_mismatches(const void* p, size_t bytes, uint64_t seed, unsigned long long* mismatches,
                              cudaStream_t stream) {
  pattern_check_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<const uint8_t*>(p), bytes, seed, mismatches);
  check(cudaGetLastError());
}

void fill_exact(void* p, size_t count, DataType type, uint64_t seed, cudaStream_t stream) {
  dispatch(type, [&](auto t) {
    using T = decltype(t);
    fill_exact_kernel<T><<<kBlocks, kThreads, 0, stream>>>(static_cast<T*>(p), count, seed);
  });
  check(cudaGetLastError());
}

void fill_uniform(void* p, size_t count, DataType type, uint64_t seed, cudaStream_t stream) {
  dispatch(type, [&](auto t) {
    using T = decltype(t);
    fill_uniform_kernel<T><<<kBlocks, kThreads, 0, stream>>>(static_cast<T*>(p), count, seed);
  });
  check(cudaGetLastError());
}

void count_far_from_uniform_sum(const void* out, size_t count, size_t first, DataType type, const RankSeeds& seeds,
                                unsigned long long* mismatches, cudaStream_t stream) {
  if (seeds.world < 1 || seeds.world > 8) throw std::runtime_error("count_far_from_uniform_sum: world out of range");
  dispatch(type, [&](auto t) {
    using T = decltype(t);
    far_from_sum_kernel<T>
        <<<kBlocks, kThreads, 0, stream>>>(static_cast<const T*>(out), count, first, seeds, mismatches);
  });
  check(cudaGetLastError());
}

uint64_t device_digest(const void* p, size_t bytes, cudaStream_t stream) {
  unsigned long long* digest = nullptr;
  check(cudaMallocAsync(&digest, sizeof(*digest), stream));
  check(cudaMemsetAsync(digest, 0, sizeof(*digest), stream));
  digest_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<const uint8_t*>(p), bytes, digest);
  check(cudaGetLastError());
  unsigned long long host = 0;
  check(cudaMemcpyAsync(&host, digest, sizeof(host), cudaMemcpyDeviceToHost, stream));
  check(cudaFreeAsync(digest, stream));
  check(cudaStreamSynchronize(stream));
  return host;
}

}  // namespace symmem::test
