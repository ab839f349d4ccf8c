// All-to-all: each rank sends a part of its input to every rank (itself included). Asynchronous on
// `stream`, capturable in CUDA graphs, for any element type (rows are bytes), and to be called by
// every rank with the same form, row width, options and operand kinds (the rules of
// symmem/collectives.hpp: a mismatch is detected on the device and raises kMismatch everywhere).
//
// Three forms:
//   all_to_all       uniform: every rank sends `bytes_per_pair` bytes to every rank;
//   all_to_all_v     row counts per destination from each rank's host (torch's all_to_all_single
//                    with split sizes), exchanged on the device: no host synchronisation;
//   all_to_all_vdev  row counts in device memory, the received counts and offsets written to
//                    device memory (torch.ops.symm_mem.all_to_all_vdev's contract, and its 2-D,
//                    expert-major form all_to_all_vdev_2d), so routing never visits the host.
//
// Capacity. The variable forms exchange every rank's counts and capacities first (one low-latency
// round trip), so every rank holds the whole split matrix and reaches the same verdict: a rank
// whose output would overflow (or whose counts exceed its input) makes every rank raise kCapacity
// naming it, at the next call, check() or synchronize(), and no row of that call moves on any
// rank (nothing is written out of bounds). The communicator is unusable afterwards, as after a
// mismatch. docs/moe.md describes the algorithms.
//
// Operands follow symmem/collectives.hpp: symmetric operands (heap Buffers) move zero-copy; a
// local input is staged into the workspace when the algorithm reads it from the peers (the
// variable forms need it to fit: an error names the budget otherwise); a local output takes the
// pull algorithm. In place (in and out the same memory) stages the input. A rank with no rows
// passes null local operands with 0 rows (and zero splits).
//
// Arguments that fail a check on one rank (null or host pointers, a staged input larger than the
// staging area, ...) refuse the call: every rank raises kInvalidArgument naming that rank and the
// cause, and the communicator is unusable afterwards (Communicator::refuse_call).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "symmem/collectives.hpp"

namespace symmem {

// out[r * bytes_per_pair ...] on rank q = in[q * bytes_per_pair ...] of rank r: the input and the
// output hold world * bytes_per_pair bytes. Algorithms: kLowLatency (small), kPush (symmetric
// output), kPull, kCopyEngine (zero SMs; also what max_blocks = 0 asks for).
void all_to_all(Operand out, Operand in, size_t bytes_per_pair, Communicator& comm, cudaStream_t stream,
                const CollectiveOptions& options = {});

// Rows of `row_bytes` bytes. in_splits[q] rows (host array of world values) go to rank q, taken
// from the input in rank order; out_splits[r] rows are expected from rank r (host array), placed
// in rank order. The input holds in_rows rows, the output out_rows. Every rank checks on the device
// that every out_splits matches what its sender sends (kCapacity naming both otherwise).
// Algorithms: kLowLatency (used when every pair fits it, else the SM path), kPush, kPull.
void all_to_all_v(Operand out, size_t out_rows, Operand in, size_t in_rows, const int64_t* in_splits,
                  const int64_t* out_splits, size_t row_bytes, Communicator& comm, cudaStream_t stream,
                  const CollectiveOptions& options = {});

// As all_to_all_v with the splits in device memory: in_splits (int64, world values) is read on the
// device; out_splits_offsets (int64, 2 x world, device) receives the rows from each rank (row 0)
// and where they start in the output (row 1), as torch's all_to_all_vdev writes them.
void all_to_all_vdev(Operand out, size_t out_rows, Operand in, size_t in_rows, const int64_t* in_splits,
                     int64_t* out_splits_offsets, size_t row_bytes, Communicator& comm, cudaStream_t stream,
                     const CollectiveOptions& options = {});

// The 2-D form (torch's all_to_all_vdev_2d): in_splits has world * experts values, rank-major
// (rows for rank q's local expert e at q * experts + e); the output is expert-major: for each local
// expert e, the rows of sender 0, 1, ..., each expert's extent rounded up to major_align rows and
// at least major_align (torch's rule; pass 1 for no padding beyond that); padding rows are not
// written (in place they keep the input's bytes). out_splits_offsets is
// 2 x (experts * world), expert-major (k = e * world + r). world * experts <= 1024.
void all_to_all_vdev_2d(Operand out, size_t out_rows, Operand in, size_t in_rows, const int64_t* in_splits,
                        int64_t* out_splits_offsets, size_t row_bytes, int experts, int64_t major_align,
                        Communicator& comm, cudaStream_t stream, const CollectiveOptions& options = {});

// The plans these calls would run ("all_to_all push blocks=32 vector=16 split-exchange ..."), or
// the error they would raise; nothing is launched.
std::string describe_all_to_all(Operand out, Operand in, size_t bytes_per_pair, Communicator& comm,
                                const CollectiveOptions& options = {});
// For the variable forms: experts 1 and major_align 0 for all_to_all_v / all_to_all_vdev;
// device_splits false for all_to_all_v.
std::string describe_all_to_all_v(Operand out, size_t out_rows, Operand in, size_t in_rows, size_t row_bytes,
                                  bool device_splits, int experts, int64_t major_align, Communicator& comm,
                                  const CollectiveOptions& options = {});

}  // namespace symmem
