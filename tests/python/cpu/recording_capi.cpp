// Stands in for libsymmem_capi.so's per-call collectives in test_fastcall.py: each records the
// arguments it was given, widened to 64 bits, and returns its own code, so that the test can
// compare what symmem._fastcall passes with what ctypes passes for the same Python values.
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#define EXPORT extern "C" __attribute__((visibility("default")))

extern "C" {
__attribute__((visibility("default"))) uint64_t recorded_args[16];
__attribute__((visibility("default"))) int recorded_count;
}

namespace {

int record(int code, std::initializer_list<uint64_t> args) {
  recorded_count = 0;
  for (uint64_t a : args) recorded_args[recorded_count++] = a;
  return code;
}

uint64_t as_word(const void* p) { return reinterpret_cast<uintptr_t>(p); }
uint64_t as_word(size_t v) { return v; }
uint64_t as_word(int v) { return static_cast<uint64_t>(static_cast<int64_t>(v)); }
uint64_t as_word(int64_t v) { return static_cast<uint64_t>(v); }

}  // namespace

EXPORT int symmem_all_reduce(void* comm, void* out, const void* in, size_t count, int dtype, int op, void* stream,
                             int algo, int blocks, int max_blocks) {
  return record(11, {as_word(comm), as_word(out), as_word(in), as_word(count), as_word(dtype), as_word(op),
                     as_word(stream), as_word(algo), as_word(blocks), as_word(max_blocks)});
}

EXPORT int symmem_reduce_scatter(void* comm, void* out, const void* in, size_t count, int dtype, int op, void* stream,
                                 int algo, int blocks, int max_blocks) {
  return record(12, {as_word(comm), as_word(out), as_word(in), as_word(count), as_word(dtype), as_word(op),
                     as_word(stream), as_word(algo), as_word(blocks), as_word(max_blocks)});
}

EXPORT int symmem_all_gather(void* comm, void* out, const void* in, size_t count, int dtype, void* stream, int algo,
                             int blocks, int max_blocks) {
  return record(13, {as_word(comm), as_word(out), as_word(in), as_word(count), as_word(dtype), as_word(stream),
                     as_word(algo), as_word(blocks), as_word(max_blocks)});
}

EXPORT int symmem_all_to_all(void* comm, void* out, const void* in, size_t bytes, void* stream, int algo, int blocks,
                             int max_blocks) {
  return record(14, {as_word(comm), as_word(out), as_word(in), as_word(bytes), as_word(stream), as_word(algo),
                     as_word(blocks), as_word(max_blocks)});
}

EXPORT int symmem_ep_dispatch(void* ep, const void* x, const void* x_scales, const void* topk_idx, int topk_idx_int64,
                              const void* topk_weights, int num_tokens, const void* num_tokens_device, void* stream) {
  return record(15, {as_word(ep), as_word(x), as_word(x_scales), as_word(topk_idx), as_word(topk_idx_int64),
                     as_word(topk_weights), as_word(num_tokens), as_word(num_tokens_device), as_word(stream)});
}

EXPORT int symmem_ep_combine(void* ep, const void* expert_out, void* out, int weights_applied, const void* topk_weights,
                             void* stream) {
  return record(16, {as_word(ep), as_word(expert_out), as_word(out), as_word(weights_applied), as_word(topk_weights),
                     as_word(stream)});
}

EXPORT int symmem_all_to_all_v(void* comm, void* out, size_t out_rows, const void* in, size_t in_rows,
                               const int64_t* in_splits, const int64_t* out_splits, size_t row_bytes, void* stream,
                               int algo, int blocks, int max_blocks) {
  return record(18, {as_word(comm), as_word(out), as_word(out_rows), as_word(in), as_word(in_rows), as_word(in_splits),
                     as_word(out_splits), as_word(row_bytes), as_word(stream), as_word(algo), as_word(blocks),
                     as_word(max_blocks)});
}

EXPORT int symmem_all_to_all_vdev(void* comm, void* out, size_t out_rows, const void* in, size_t in_rows,
                                  const int64_t* in_splits, int64_t* out_splits_offsets, size_t row_bytes, int experts,
                                  int64_t major_align, void* stream, int algo, int blocks, int max_blocks) {
  return record(17, {as_word(comm), as_word(out), as_word(out_rows), as_word(in), as_word(in_rows), as_word(in_splits),
                     as_word(out_splits_offsets), as_word(row_bytes), as_word(experts), as_word(major_align),
                     as_word(stream), as_word(algo), as_word(blocks), as_word(max_blocks)});
}
