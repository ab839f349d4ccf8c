#include "moe_test_kernels.hpp"

#include "device_memory.hpp"
#include "plan/all_to_all_layout.hpp"

namespace symmem::test {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxDestinations = 256;  // world * experts of a routed test call

__device__ uint64_t grid_thread() { return uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ uint64_t grid_threads() { return uint64_t(gridDim.x) * blockDim.x; }

__global__ void fill_rows_kernel(uint8_t* in, uint64_t rows, uint64_t row_bytes, uint64_t seed, int rank) {
  for (uint64_t i = grid_thread(); i < rows * row_bytes; i += grid_threads())
    in[i] = row_byte(seed, rank, i / row_bytes, i % row_bytes);
}

__device__ uint64_t replay_seed(const RoutedCall& c, uint64_t replay) { return mix64(c.seed ^ (replay << 20)); }

__global__ void fill_routed_kernel(RoutedCall c, int64_t* in_splits, uint8_t* in) {
  const uint64_t replay = *c.replay;
  const int n = c.world * c.experts;
  __shared__ uint64_t rows;
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    for (int j = 0; j < n; ++j) in_splits[j] = routed_split(c.seed, replay, c.rank, j, n, c.max_entry);
  }
  if (threadIdx.x == 0) {
    uint64_t sum = 0;
    for (int j = 0; j < n; ++j) sum += routed_split(c.seed, replay, c.rank, j, n, c.max_entry);
    rows = sum;
  }
  __syncthreads();
  const uint64_t seed = replay_seed(c, replay);
  for (uint64_t i = grid_thread(); i < rows * c.row_bytes; i += grid_threads())
    in[i] = row_byte(seed, c.rank, i / c.row_bytes, i % c.row_bytes);
}

__global__ void check_routed_kernel(RoutedCall c, const uint8_t* out, uint64_t out_rows,
                                    const int64_t* out_splits_offsets, uint8_t poison, unsigned long long* wrong) {
  const uint64_t replay = *c.replay;
  const int n = c.world * c.experts;
  __shared__ uint32_t splits[kMaxWorld * kMaxDestinations];
  __shared__ uint32_t input_rows[kMaxWorld], output_rows[kMaxWorld];
  for (int i = threadIdx.x; i < c.world * n; i += blockDim.x)
    splits[i] = routed_split(c.seed, replay, i / n, i % n, n, c.max_entry);
  if (threadIdx.x < c.world) {
    input_rows[threadIdx.x] = 0xFFFFFFFEu;
    output_rows[threadIdx.x] = 0xFFFFFFFEu;
  }
  __syncthreads();
  const detail::SplitMatrix m{splits, input_rows, output_rows, c.world, c.experts, c.align};
  __shared__ detail::AllToAllPiece pieces[kMaxDestinations];  // rows, not bytes
  for (int k = threadIdx.x; k < n; k += blockDim.x) pieces[k] = detail::receive_piece(m, c.rank, k, 1);
  __syncthreads();
  unsigned long long bad = 0;
  // out_splits_offsets, one entry per thread of block 0.
  if (blockIdx.x == 0)
    for (int k = threadIdx.x; k < n; k += blockDim.x)
      for (int row = 0; row < 2; ++row)
        bad += out_splits_offsets[row * n + k] != detail::out_splits_offsets(m, c.rank, row, k);
  // Every output byte: the row it should hold, or the poison past the needed rows.
  const uint64_t needed = detail::needed_output_rows(m, c.rank);
  const uint64_t seed = replay_seed(c, replay);
  for (uint64_t i = grid_thread(); i < out_rows * c.row_bytes; i += grid_threads()) {
    const uint64_t row = i / c.row_bytes, b = i % c.row_bytes;
    uint8_t expected = poison;
    bool padding = row >= needed;
    if (!padding) {
      padding = true;
      for (int k = 0; k < n && padding; ++k) {
        const detail::AllToAllPiece& p = pieces[k];
        if (row >= p.dst_byte && row < p.dst_byte + p.bytes) {
          expected = row_byte(seed, p.peer, p.src_byte + (row - p.dst_byte), b);
          padding = false;
        }
      }
    }
    // Padding inside the needed rows (2-D alignment) is not written by anyone: left as poisoned.
    bad += out[i] != expected;
  }
  if (bad) atomicAdd(wrong, bad);
}

__global__ void advance_kernel(uint64_t* replay) { *replay += 1; }

// --- MoE ---

__device__ float bf16_to_float(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
__device__ uint16_t float_to_bf16(float f) {  // round to nearest even (no NaN here)
  const uint32_t u = __float_as_uint(f);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
// The fake expert e (local id) on one value.
__device__ float expert_value(uint16_t x, int local_expert) {
  return bf16_to_float(float_to_bf16(bf16_to_float(x) * float(1 + local_expert)));
}

__device__ uint64_t moe_seed(const MoeRoutedCall& c, uint64_t replay) { return mix64(c.seed ^ replay * 0x1234567ull); }

__global__ void fill_moe_kernel(MoeRoutedCall c, int64_t* ids, float* weights, int32_t* num_tokens, uint16_t* x) {
  const uint64_t replay = *c.replay;
  const uint64_t seed = mix64(moe_seed(c, replay) ^ uint64_t(c.rank + 1) * 0x9E37ull);
  const int tokens = replay % 7 == 3 ? c.max_tokens : replay % 7 == 5 ? 0 : int(seed % uint64_t(c.max_tokens + 1));
  if (blockIdx.x == 0 && threadIdx.x == 0) *num_tokens = tokens;
  for (uint64_t t = grid_thread(); t < uint64_t(c.max_tokens); t += grid_threads()) {
    for (int k = 0; k < c.topk; ++k) {
      int64_t e = int64_t(mix64(seed ^ (t * 64 + k)) % uint64_t(c.experts));
      if (replay % 11 == 7) e = k == 0 ? 0 : -1;  // a hot expert now and then
      for (int k2 = 0; k2 < k; ++k2)
        if (ids[t * c.topk + k2] == e) e = -1;  // distinct ids per token
      if (mix64(seed ^ (t * 64 + k) ^ 0xABC) % 5 == 0) e = -1;
      ids[t * c.topk + k] = e;
      weights[t * c.topk + k] = float(1 + mix64(seed ^ (t * 64 + k) ^ 0xDEF) % 1000) / 1024.f;
    }
  }
  for (uint64_t i = grid_thread(); i < uint64_t(c.max_tokens) * c.hidden; i += grid_threads()) {
    const float v = float(int(mix64(seed ^ i ^ 0x77) % 33) - 16) / 8.f;
    x[i] = float_to_bf16(v);
  }
}

__global__ void fake_experts_kernel(MoeRoutedCall c, MoeReceivedView r, uint16_t* out) {
  const int local = c.experts / c.world;
  const int64_t groups = c.expert_major ? local : 1;
  const uint16_t* x = static_cast<const uint16_t*>(r.x);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t valid = c.expert_major ? r.expert_num_tokens[g] : *r.num_rows;
    for (int64_t i = grid_thread(); i < valid * c.hidden; i += grid_threads()) {
      const int64_t row = g * r.rows + i / c.hidden;
      const uint16_t v = x[row * c.hidden + i % c.hidden];
      if (c.expert_major) {
        out[row * c.hidden + i % c.hidden] = float_to_bf16(expert_value(v, int(g)));
      } else {
        float acc = 0.f;
        for (int k = 0; k < c.topk; ++k) {
          const int32_t e = r.topk_idx[row * c.topk + k];
          if (e >= 0) acc = fmaf(r.topk_weights[row * c.topk + k], expert_value(v, e), acc);
        }
        out[row * c.hidden + i % c.hidden] = float_to_bf16(acc);
      }
    }
  }
}

__global__ void check_moe_kernel(MoeRoutedCall c, const uint16_t* out, const int64_t* ids, const float* weights,
                                 const int32_t* num_tokens, const uint16_t* x, uint16_t poison,
                                 unsigned long long* wrong) {
  const int local = c.experts / c.world;
  const int tokens = *num_tokens;
  unsigned long long bad = 0;
  for (int64_t i = grid_thread(); i < int64_t(c.max_tokens) * c.hidden; i += grid_threads()) {
    const int64_t t = i / c.hidden;
    if (t >= tokens) {
      bad += out[i] != poison;
      continue;
    }
    const uint16_t v = x[i];
    float acc = 0.f;
    if (c.expert_major && !c.combine_reduced) {
      for (int k = 0; k < c.topk; ++k) {
        const int64_t e = ids[t * c.topk + k];
        if (e >= 0) acc = fmaf(weights[t * c.topk + k], expert_value(v, int(e % local)), acc);
      }
    } else {
      for (int q = 0; q < c.world; ++q) {  // each rank's partial row, rounded once, in rank order
        float partial = 0.f;
        bool any = false;
        for (int k = 0; k < c.topk; ++k) {
          const int64_t e = ids[t * c.topk + k];
          if (e < 0 || e / local != q) continue;
          any = true;
          partial = fmaf(weights[t * c.topk + k], expert_value(v, int(e % local)), partial);
        }
        if (any) acc = fmaf(1.f, bf16_to_float(float_to_bf16(partial)), acc);
      }
    }
    bad += out[i] != float_to_bf16(acc);
  }
  if (bad) atomicAdd(wrong, bad);
}

int blocks_for(uint64_t n) { return static_cast<int>(n / kThreads + 1 < 512 ? n / kThreads + 1 : 512); }

}  // namespace

void fill_rows(void* in, uint64_t rows, uint64_t row_bytes, uint64_t seed, int rank, cudaStream_t stream) {
  if (rows * row_bytes == 0) return;
  fill_rows_kernel<<<blocks_for(rows * row_bytes), kThreads, 0, stream>>>(static_cast<uint8_t*>(in), rows, row_bytes,
                                                                          seed, rank);
  TEST_CUDA(cudaGetLastError());
}

void fill_routed_input(const RoutedCall& call, int64_t* in_splits, void* in, cudaStream_t stream) {
  if (call.world * call.experts > kMaxDestinations) fail(__FILE__, __LINE__, "too many destinations for the test");
  fill_routed_kernel<<<64, kThreads, 0, stream>>>(call, in_splits, static_cast<uint8_t*>(in));
  TEST_CUDA(cudaGetLastError());
}

void check_routed_output(const RoutedCall& call, const void* out, uint64_t out_rows, const int64_t* out_splits_offsets,
                         uint8_t poison, unsigned long long* wrong, cudaStream_t stream) {
  check_routed_kernel<<<64, kThreads, 0, stream>>>(call, static_cast<const uint8_t*>(out), out_rows, out_splits_offsets,
                                                   poison, wrong);
  TEST_CUDA(cudaGetLastError());
}

void advance_replay(uint64_t* replay, cudaStream_t stream) {
  advance_kernel<<<1, 1, 0, stream>>>(replay);
  TEST_CUDA(cudaGetLastError());
}

void fill_moe_routed_input(const MoeRoutedCall& call, int64_t* ids, float* weights, int32_t* num_tokens, void* x,
                           cudaStream_t stream) {
  fill_moe_kernel<<<32, kThreads, 0, stream>>>(call, ids, weights, num_tokens, static_cast<uint16_t*>(x));
  TEST_CUDA(cudaGetLastError());
}

void run_fake_experts(const MoeRoutedCall& call, const MoeReceivedView& received, void* combine_input,
                      cudaStream_t stream) {
  fake_experts_kernel<<<32, kThreads, 0, stream>>>(call, received, static_cast<uint16_t*>(combine_input));
  TEST_CUDA(cudaGetLastError());
}

void check_moe_combine(const MoeRoutedCall& call, const void* out, const int64_t* ids, const float* weights,
                       const int32_t* num_tokens, const void* x, uint16_t poison, unsigned long long* wrong,
                       cudaStream_t stream) {
  check_moe_kernel<<<32, kThreads, 0, stream>>>(call, static_cast<const uint16_t*>(out), ids, weights, num_tokens,
                                                static_cast<const uint16_t*>(x), poison, wrong);
  TEST_CUDA(cudaGetLastError());
}

}  // namespace symmem::test
