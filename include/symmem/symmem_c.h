/* The C ABI of symmem, for language bindings (the Python package loads it with ctypes, so one
 * build serves every Python and torch version). Everything crosses as integers and pointers:
 * device addresses, CUDA streams (cudaStream_t), enum values in the order of symmem/types.hpp.
 *
 * Every function returns 0 on success or 1 + symmem::ErrorCode on failure; symmem_last_error()
 * then holds the message (per thread). No function prints, exits or throws across the boundary.
 *
 * Operands. An address and byte count that are exactly a heap buffer of the communicator (its
 * start and its whole size, as symmem_comm_allocate returned it) form a symmetric operand (zero
 * copy); anything else, views into a heap buffer included, is a local operand (staged). A whole
 * buffer is the same on every rank, so ranks never disagree on an operand's kind or offset. */
#ifndef SYMMEM_SYMMEM_C_H_
#define SYMMEM_SYMMEM_C_H_

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct symmem_comm symmem_comm;

/* A bootstrap written by the binding (e.g. over a torch c10d Store). Both return 0 on success;
 * nonzero fails the collective call that used them with kBootstrap. */
typedef int (*symmem_all_gather_fn)(void* context, const void* mine, void* all, size_t bytes);
typedef int (*symmem_barrier_fn)(void* context);

const char* symmem_version(void);
const char* symmem_last_error(void);
const char* symmem_error_code_name(int code); /* of a return value; "ok" for 0 */
/* The ErrorCode enumerator of a return value ("kTimeout" for 1 + kTimeout); NULL for 0 and past the
 * last. Bindings read the enum from here instead of copying it. */
const char* symmem_error_code_id(int code);
/* The names of symmem::DataType and symmem::ReduceOp values, in the order of symmem/types.hpp
 * ("float32", ..., "sum", ...); NULL past the last. Bindings read them instead of copying them. */
const char* symmem_dtype_name(int dtype);
const char* symmem_reduce_op_name(int op);
/* The collectives' names by number ("all_gather", "all_reduce", "reduce_scatter", "all_to_all");
 * NULL past the last. symmem_describe takes this numbering. */
const char* symmem_collective_name(int collective);

/* Collective. timeout_ms <= 0 and workspace_bytes == 0 take the environment's defaults. The
 * callbacks and their context must outlive the communicator. */
int symmem_comm_create(int rank, int world, int device, symmem_all_gather_fn all_gather, symmem_barrier_fn barrier,
                       void* context, int64_t timeout_ms, size_t workspace_bytes, symmem_comm** out);
/* Collective from the environment (RANK, WORLD_SIZE, MASTER_ADDR, ...), over symmem's TCP store. */
int symmem_comm_create_from_env(int device, symmem_comm** out);
/* Local release (the communicator's destructor); safe after close. */
void symmem_comm_destroy(symmem_comm* comm);
int symmem_comm_close(symmem_comm* comm); /* collective teardown */
int symmem_comm_rank(const symmem_comm* comm);
int symmem_comm_world(const symmem_comm* comm);
int symmem_comm_nodes(const symmem_comm* comm); /* nodes the ranks span (1: one NVLink domain) */
int symmem_comm_device(const symmem_comm* comm);
int symmem_comm_check(symmem_comm* comm);
int symmem_comm_aborted(const symmem_comm* comm);
int symmem_comm_barrier(symmem_comm* comm, void* stream);
/* CUDA graphs that captured a call of this communicator and still exist (or still run): its
 * memory must stay mapped while any does. */
int symmem_comm_live_graphs(const symmem_comm* comm);

/* Collective: a heap buffer of `bytes`, the same offset on every rank. Lives until close. */
int symmem_comm_allocate(symmem_comm* comm, size_t bytes, void** ptr);
/* The heap buffer holding [ptr, ptr + bytes): its base and size, or *base = NULL. The range is
 * a symmetric operand only when it is the whole buffer (*base == ptr, *size == bytes). */
int symmem_comm_buffer_of(symmem_comm* comm, const void* ptr, size_t bytes, void** base, size_t* size);

/* Collectives, asynchronous on `stream`. dtype: symmem::DataType; op: symmem::ReduceOp; algo:
 * symmem::Algo; blocks / max_blocks as in symmem::CollectiveOptions. */
int symmem_all_gather(symmem_comm* comm, void* out, const void* in, size_t count, int dtype, void* stream, int algo,
                      int blocks, int max_blocks);
int symmem_all_reduce(symmem_comm* comm, void* out, const void* in, size_t count, int dtype, int op, void* stream,
                      int algo, int blocks, int max_blocks);
int symmem_reduce_scatter(symmem_comm* comm, void* out, const void* in, size_t count, int dtype, int op,
                          void* stream, int algo, int blocks, int max_blocks);
/* symmem::all_gather_matmul (symmem/fused.hpp): c [m x n] = all_gather(a_shard) [m x k] * b [k x n].
 * gathered_a: m * k elements inside one heap buffer (symmetric: the same offset on every rank).
 * b_layout: symmem::MatrixLayout, 0 row-major b, 1 column-major b (torch's W.t()). */
int symmem_all_gather_matmul(symmem_comm* comm, void* c, void* gathered_a, const void* a_shard, const void* b,
                             int64_t m, int64_t n, int64_t k, int dtype, void* stream, int b_layout);
/* symmem::matmul_reduce_scatter (symmem/fused.hpp): c_shard [m / world x n] = this rank's rows of
 * the sum over ranks of a [m x k] * b [k x n]. workspace: symmem_matmul_reduce_scatter_workspace_bytes(m, n)
 * bytes inside one heap buffer (symmetric: the same offset on every rank). b_layout as above. */
int symmem_matmul_reduce_scatter(symmem_comm* comm, void* c_shard, void* workspace, const void* a, const void* b,
                                 int64_t m, int64_t n, int64_t k, int dtype, void* stream, int b_layout);
size_t symmem_matmul_reduce_scatter_workspace_bytes(int64_t m, int64_t n);
/* The plan a call would run (collective, as symmem_collective_name numbers it: all_gather,
 * all_reduce or reduce_scatter), or the error it would raise; nothing is launched. */
int symmem_describe(symmem_comm* comm, int collective, void* out, const void* in, size_t count, int dtype, int algo,
                    int blocks, int max_blocks, char* text, size_t text_bytes);
int symmem_parse_algo(const char* name, int* algo);
/* Refuses this rank's part of the collective call `op` (e.g. "all_to_all_single"), whose arguments
 * failed a check made by the binding (symmem::Communicator::refuse_call): the peers' waits in that
 * call end at once and every rank raises error_code (a symmem::ErrorCode value, as
 * symmem_error_code_id(error_code + 1) names it) with the same message, "<op>: rank R refused the
 * call: <message>; ...", at its next call, check or synchronize; the communicator is unusable after.
 * `stream`: the stream the call would have used. Returns 1 + error_code with that message (the
 * error this rank raises), or another error if the arguments themselves are wrong. The library's
 * own calls refuse their bad arguments the same way. */
int symmem_refuse_call(symmem_comm* comm, const char* op, int error_code, const char* message, void* stream);
/* The message symmem_refuse_call makes every rank raise (at most text_bytes - 1 bytes, NUL-ended),
 * for a binding that agrees on a refusal over a transport of its own (a reference path). */
int symmem_refusal_message(const char* op, int rank, int error_code, const char* cause, char* text,
                           size_t text_bytes);

/* All-to-all (symmem/all_to_all.hpp); rows are bytes, so every dtype serves. in and out are
 * operands as above (a whole heap buffer is symmetric). Splits are int64: host arrays for
 * symmem_all_to_all_v (world values each), device memory for symmem_all_to_all_vdev (world *
 * experts values in, 2 x world * experts out). major_align 0 is the plain all_to_all_vdev
 * (experts must be 1); >= 1 the 2-D, expert-major form. A receiver whose output would overflow
 * makes every rank fail with kCapacity (code 1 + 9) at its next call or check. */
int symmem_all_to_all(symmem_comm* comm, void* out, const void* in, size_t bytes_per_pair, void* stream, int algo,
                      int blocks, int max_blocks);
int symmem_all_to_all_v(symmem_comm* comm, void* out, size_t out_rows, const void* in, size_t in_rows,
                        const int64_t* in_splits, const int64_t* out_splits, size_t row_bytes, void* stream, int algo,
                        int blocks, int max_blocks);
int symmem_all_to_all_vdev(symmem_comm* comm, void* out, size_t out_rows, const void* in, size_t in_rows,
                           const int64_t* in_splits, int64_t* out_splits_offsets, size_t row_bytes, int experts,
                           int64_t major_align, void* stream, int algo, int blocks, int max_blocks);
/* The plan of an all-to-all (form: 0 uniform, 1 host splits, 2 device splits), or the error it
 * would raise; nothing is launched. Uniform: out_rows = in_rows = bytes_per_pair, row_bytes 1. */
int symmem_describe_all_to_all(symmem_comm* comm, int form, void* out, size_t out_rows, const void* in,
                               size_t in_rows, size_t row_bytes, int experts, int64_t major_align, int algo,
                               int blocks, int max_blocks, char* text, size_t text_bytes);

/* MoE dispatch / combine (symmem/ep.hpp). payload: 0 bfloat16, 1 float8 e4m3; layout: 0 expert
 * major, 1 rank major (the enums' order). symmem_ep_memory states the memory before
 * symmem_ep_create (collective) allocates it. received: device pointers of the context's buffers
 * (scales, topk_idx, topk_weights NULL where the layout or payload has none). num_tokens_device
 * NULL: num_tokens counts the tokens. max_blocks -1: the library's choice (EpConfig::max_blocks). */
typedef struct symmem_ep symmem_ep;
int symmem_ep_memory(int num_experts, int topk, int hidden, int max_tokens_per_rank, int payload, int layout,
                     int max_tokens_per_expert, int max_received_rows, int max_blocks, int world, size_t* heap_bytes,
                     size_t* local_bytes);
/* the blocks a context of this config on comm would take (symmem::ep_blocks): local, allocates nothing */
int symmem_ep_blocks_for(symmem_comm* comm, int num_experts, int topk, int hidden, int max_tokens_per_rank, int payload,
                         int layout, int max_tokens_per_expert, int max_received_rows, int max_blocks, int* blocks);
int symmem_ep_create(symmem_comm* comm, int num_experts, int topk, int hidden, int max_tokens_per_rank, int payload,
                     int layout, int max_tokens_per_expert, int max_received_rows, int max_blocks, symmem_ep** out);
void symmem_ep_destroy(symmem_ep* ep); /* local; the heap buffers stay with the communicator */
int symmem_ep_close(symmem_ep* ep);    /* collective */
/* collective; memory_lent nonzero: this rank still holds objects over the context's memory, and
 * every rank keeps its heap buffers until the communicator closes (EpContext::close) */
int symmem_ep_close_lent(symmem_ep* ep, int memory_lent);
int symmem_ep_received(symmem_ep* ep, void** x, void** x_scales, void** topk_idx, void** topk_weights,
                       void** expert_num_tokens, void** num_rows, void** combine_input, size_t* rows);
int symmem_ep_dispatch(symmem_ep* ep, const void* x, const void* x_scales, const void* topk_idx, int topk_idx_int64,
                       const void* topk_weights, int num_tokens, const void* num_tokens_device, void* stream);
int symmem_ep_combine(symmem_ep* ep, const void* expert_out, void* out, int weights_applied, const void* topk_weights,
                      void* stream);
int symmem_ep_blocks(symmem_ep* ep, int* blocks); /* the blocks its kernels take (EpContext::blocks) */
int symmem_ep_describe(symmem_ep* ep, char* text, size_t text_bytes);
/* Programming the heap from user kernels (include/symmem/user_call.hpp, device.cuh; the Triton
 * helpers of python/symmem/triton). Structs begin with struct_size: the caller sets it to the
 * size it was built with, the library fills what both know (the struct only grows at its end). */
int symmem_comm_local_rank(const symmem_comm* comm);  /* rank in this node (the index of peers) */
int symmem_comm_local_world(const symmem_comm* comm); /* ranks of this node */

/* A heap buffer as a kernel sees it; every address is a device address in this process. */
typedef struct symmem_device_handle {
  uint64_t struct_size;
  uint64_t local;            /* this rank's copy */
  uint64_t bytes;
  uint64_t signal_pad;       /* this rank's signal pad: uint32 words, zeroed at allocation, the user's */
  uint64_t signal_pad_words;
  uint64_t peer_table;       /* device array of world pointers: every rank's copy */
  uint64_t heap_stride;      /* peers[p] == local + (p - rank) * heap_stride, for every heap address */
  uint64_t peers[8];
  uint64_t peer_signal_pads[8];
  int32_t rank;  /* local */
  int32_t world; /* local */
} symmem_device_handle;
/* `buffer` must be the start of a heap buffer (what symmem_comm_allocate returned). Local. */
int symmem_buffer_device_handle(symmem_comm* comm, const void* buffer, symmem_device_handle* out);

/* The communicator's synchronisation state for user kernels (user_call.hpp's UserSync without the
 * signature): fixed for the communicator's life. */
typedef struct symmem_sync_context {
  uint64_t struct_size;
  uint64_t flags;         /* this rank's barrier flags: uint64 [phases][max_blocks][8] */
  uint64_t peer_flags[8]; /* every rank's, mapped here */
  uint64_t epochs;        /* this rank's per-block call numbers: uint32 [max_blocks] */
  uint64_t failure_claim; /* uint32: elects the failed wait that writes the record */
  uint64_t failure;       /* this rank's failure record: uint32 code, op; int32 rank, peer, block, phase;
                             uint32 signature, peer_signature */
  uint64_t abort_word;    /* uint32, host memory mapped for the device */
  uint64_t timeout_ns;
  uint64_t heap_stride;
  int32_t rank;           /* local */
  int32_t world;          /* local */
  int32_t phases;         /* barriers per call */
  int32_t max_blocks;     /* blocks of a kernel that uses epochs or barriers */
  uint32_t user_op;       /* the failure record's op for a user kernel */
  uint32_t reserved;
} symmem_sync_context;
int symmem_comm_sync_context(symmem_comm* comm, symmem_sync_context* out);
/* The host half of a user kernel call, made right before launching it on `stream` with `blocks`
 * blocks: checks the communicator, orders the call, logs `description` (what the ranks must agree
 * on) and returns the call's signature, for the kernel's flags. */
int symmem_comm_begin_user_call(symmem_comm* comm, const char* description, int blocks, void* stream,
                                uint32_t* signature);
/* Optional, right after launching that kernel on `stream`: records the call's end (symmem::end_user_call),
 * so that the next call on another stream waits for the kernel only. */
int symmem_comm_end_user_call(symmem_comm* comm, void* stream);
/* The signature begin_user_call gives (description, blocks); no communicator involved. */
uint32_t symmem_user_call_signature(const char* description, int blocks);

/* symmem::all_gather_pieces (symmem/all_gather_pieces.hpp): gathered [m x row_bytes] inside one heap
 * buffer (the same offset on every rank); consume(context, pieces) enqueues the consumer on `stream`
 * and returns 0 (nonzero fails the call with kInternal after the side streams are joined). */
typedef struct symmem_gathered_pieces {
  uint64_t struct_size;
  uint64_t flags; /* uint32 [world * pieces]: flags[s * pieces + j] == 1 once piece j of shard s arrived */
  int32_t pieces;
  int32_t piece_rows;
  int32_t shard_rows;
  int32_t rank;
  int32_t world;
  int32_t reserved;
} symmem_gathered_pieces;
typedef int (*symmem_pieces_consumer_fn)(void* context, const symmem_gathered_pieces* pieces);
int symmem_all_gather_pieces(symmem_comm* comm, void* gathered, const void* shard, int64_t m, size_t row_bytes,
                             int tile_rows, void* stream, symmem_pieces_consumer_fn consume, void* context);

/* Allocator functions for torch.cuda.memory.CUDAPluggableAllocator, in kPoolSlots slots: slot k
 * serves the communicator bound to it. Allocation is collective (every rank's pool must ask for
 * the same sizes in the same order, as it does when the ranks run the same program); a freed
 * segment is retired, not unmapped, so nothing a CUDA graph or a peer may still use goes away
 * before the communicator closes. A failed allocation returns NULL (symmem_last_error says why). */
int symmem_pool_bind(int slot, symmem_comm* comm); /* comm NULL unbinds */
/* Segments slot k handed out that its pool has not freed yet (-1 for a slot out of range). */
long symmem_pool_live_segments(int slot);
#define SYMMEM_POOL_SLOTS 8
#define SYMMEM_DECLARE_POOL_SLOT(k)                                                        \
  void* symmem_pool_alloc_##k(ssize_t size, int device, void* stream);                    \
  void symmem_pool_free_##k(void* ptr, ssize_t size, int device, void* stream);
SYMMEM_DECLARE_POOL_SLOT(0)
SYMMEM_DECLARE_POOL_SLOT(1)
SYMMEM_DECLARE_POOL_SLOT(2)
SYMMEM_DECLARE_POOL_SLOT(3)
SYMMEM_DECLARE_POOL_SLOT(4)
SYMMEM_DECLARE_POOL_SLOT(5)
SYMMEM_DECLARE_POOL_SLOT(6)
SYMMEM_DECLARE_POOL_SLOT(7)
#undef SYMMEM_DECLARE_POOL_SLOT

#ifdef __cplusplus
}
#endif

#endif /* SYMMEM_SYMMEM_C_H_ */
