// Fused all-gather + GEMM (the column-parallel half of tensor parallelism).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "symmem/collectives.hpp"

namespace symmem {

// How b [k x n] of the fused ops lies in memory, packed either way:
//   kRowMajor:    element (i, j) at b[i * n + j] (a contiguous torch tensor);
//   kColumnMajor: element (i, j) at b[i + j * k]: the transpose of a row-major [n x k] matrix, as
//                 torch's W.t() for a weight W [n x k] (every x @ W.t() of tensor parallelism).
// The GEMM reads either layout where it lies (a kernel instantiated per layout): no copy.
enum class MatrixLayout : int { kRowMajor = 0, kColumnMajor = 1 };

// c [m x n] = A [m x k] * b [k x n], where A is the ranks' shards of m / world rows each stacked in
// rank order (the all-gather of a_shard). a_shard, A and c row-major and contiguous, as torch lays
// them out; b in `b_layout`. float16 or bfloat16 in and out, float32 accumulation; k and n
// multiples of 8, m a multiple of world. One node (kUnsupported across nodes).
//
// `gathered_a` is a symmetric operand of m * k elements (a heap Buffer and an offset equal on
// every rank): each rank copies its shard into its own slot, then pulls the peers' slots from
// their gathered_a with the copy engines (zero SMs); after the call it holds A. `a_shard` is any
// device memory of this rank; when it is this rank's slot of gathered_a it is not copied. `b` and
// `c` are local; c may overlap none of A, a_shard and b, and b may not overlap A.
// While the shards arrive, one persistent GEMM computes the own shard's rows first and every
// other tile as soon as the rows it needs have landed (docs/fused.md).
//
// Asynchronous on `stream`, capturable in CUDA graphs. Every rank must make the same call (m, n,
// k, type and gathered_a's offset are in the call's signature: a mismatch raises kMismatch on
// every rank); a dead or stalled peer raises kTimeout, never a hang. Such errors surface at the
// next call, check() or synchronize(): the call itself returns, and c is then undefined (as any
// output of a failed collective). kUnsupported when this build
// has no fused GEMM (CUTLASS headers missing at build time) or the GPU is not sm_90.
void all_gather_matmul(void* c, Operand gathered_a, const void* a_shard, const void* b, int64_t m, int64_t n,
                       int64_t k, DataType type, Communicator& comm, cudaStream_t stream,
                       MatrixLayout b_layout = MatrixLayout::kRowMajor);

// Empty when all_gather_matmul can run this shape, type and gathered_a on this build and GPU, else
// the reason (what the call would throw); the pointers and the GEMM's own limits are checked by
// the call. Nothing is launched or exchanged.
std::string all_gather_matmul_unsupported(Operand gathered_a, int64_t m, int64_t n, int64_t k, DataType type,
                                          Communicator& comm);

// c_shard [m / world x n] = this rank's rows of the sum over ranks of a [m x k] * b [k x n]: the
// row-parallel half of tensor parallelism (each rank holds a k-slice of the layer: its a and b).
// a and c_shard row-major and contiguous, b in `b_layout` (MatrixLayout above); float16 or
// bfloat16 in and out; the products accumulate in float32, the ranks' float32 partial sums are
// added in rank order and rounded once, so a shard does not depend on which rank computes it. k
// and n multiples of 8, m a multiple of world. One node.
//
// `workspace` is a symmetric operand of matmul_reduce_scatter_workspace_bytes(m, n) bytes: this
// rank's partial products (m x n float32), then the peers' partial products of its rows (world
// slots of m / world x n float32). One persistent GEMM computes the rows of rank r+1 first, then
// r+2, ..., its own last; each piece of rows, once its tiles are written, is signalled to its
// owner, which pulls it into its workspace with the copy engines (zero SMs) while the GEMMs go on;
// then one kernel adds the partial sums (docs/fused.md). a, b and c_shard are local and overlap neither each other
// (c_shard and a, b) nor the workspace.
//
// Asynchronous on `stream`, capturable in CUDA graphs (a captured call overlaps nothing: its copies
// wait for the whole GEMM). Consecutive fused calls on one communicator must be ordered (stream
// order or events), as for every collective. Every rank must make the same call (m, n, k, type and the workspace's
// offset are signed: a mismatch is kMismatch on every rank); a dead peer is kTimeout, never a hang;
// errors surface at the next call, check() or synchronize(), and c_shard is then undefined.
void matmul_reduce_scatter(void* c_shard, Operand workspace, const void* a, const void* b, int64_t m, int64_t n,
                           int64_t k, DataType type, Communicator& comm, cudaStream_t stream,
                           MatrixLayout b_layout = MatrixLayout::kRowMajor);

// The workspace matmul_reduce_scatter needs: 2 * m * n * 4 bytes.
size_t matmul_reduce_scatter_workspace_bytes(int64_t m, int64_t n);

// As all_gather_matmul_unsupported, for matmul_reduce_scatter and its workspace.
std::string matmul_reduce_scatter_unsupported(Operand workspace, int64_t m, int64_t n, int64_t k, DataType type,
                                              Communicator& comm);

}  // namespace symmem
