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
  __shared__ uint32_t splits[detail::kMaxWorld * kMaxDestinations];
  __shared__ uint32_t input_rows[detail::kMaxWorld], output_rows[detail::kMaxWorld];
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

}  // namespace symmem::test
