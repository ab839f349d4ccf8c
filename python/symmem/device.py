"""Users' kernels on the symmetric heap, host side, without torch: a heap buffer as a kernel sees it
(DeviceHandle), the communicator's synchronisation state for user kernels (SyncContext), and the
signing of a user call (begin_user_call), all through the C ABI (symmem_c.h, "Programming the
heap"). Addresses are integers here; symmem.torch.device turns them into tensors and
symmem.triton launches kernels with them. docs/kernels.md has the rules.
"""
import ctypes
from dataclasses import dataclass

from ._native import lib

MAX_WORLD = 8


class _DeviceHandle(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint64), ("local", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("signal_pad", ctypes.c_uint64), ("signal_pad_words", ctypes.c_uint64),
                ("peer_table", ctypes.c_uint64), ("heap_stride", ctypes.c_uint64),
                ("peers", ctypes.c_uint64 * MAX_WORLD), ("peer_signal_pads", ctypes.c_uint64 * MAX_WORLD),
                ("rank", ctypes.c_int32), ("world", ctypes.c_int32)]


class _SyncContext(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint64), ("flags", ctypes.c_uint64),
                ("peer_flags", ctypes.c_uint64 * MAX_WORLD), ("epochs", ctypes.c_uint64),
                ("failure_claim", ctypes.c_uint64), ("failure", ctypes.c_uint64), ("abort_word", ctypes.c_uint64),
                ("timeout_ns", ctypes.c_uint64), ("heap_stride", ctypes.c_uint64), ("rank", ctypes.c_int32),
                ("world", ctypes.c_int32), ("phases", ctypes.c_int32), ("max_blocks", ctypes.c_int32),
                ("user_op", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


@dataclass(frozen=True)
class DeviceHandle:
    """A heap buffer on this rank. ``peers[p] == local + (p - rank) * heap_stride``."""
    local: int
    nbytes: int
    signal_pad: int          # this rank's uint32 words, zeroed at allocation: the user's
    signal_pad_words: int
    peer_table: int          # device array of `world` pointers (every rank's copy)
    heap_stride: int
    peers: tuple
    peer_signal_pads: tuple
    rank: int                # in the node
    world: int               # ranks of the node


@dataclass(frozen=True)
class SyncContext:
    """The communicator's state for user kernels (fixed for its life): barrier flags and epochs of
    their own, and the failure record, claim word, abort word and deadline the library's waits use."""
    flags: int               # uint64 [phases][max_blocks][8], this rank's
    peer_flags: tuple
    epochs: int              # uint32 [max_blocks]
    failure_claim: int
    failure: int             # the failure record: uint32 code, op; int32 rank, peer, block, phase; uint32 sig x2
    abort_word: int
    timeout_ns: int
    heap_stride: int
    rank: int
    world: int
    phases: int
    max_blocks: int
    user_op: int


def buffer_device_handle(comm, buffer):
    """The DeviceHandle of the heap buffer starting at device address `buffer` (local, no collective)."""
    out = _DeviceHandle(struct_size=ctypes.sizeof(_DeviceHandle))
    comm._call(lib.symmem_buffer_device_handle(comm.handle, buffer, ctypes.byref(out)))
    world = out.world
    return DeviceHandle(local=out.local, nbytes=out.bytes, signal_pad=out.signal_pad,
                        signal_pad_words=out.signal_pad_words, peer_table=out.peer_table,
                        heap_stride=out.heap_stride, peers=tuple(out.peers[:world]),
                        peer_signal_pads=tuple(out.peer_signal_pads[:world]), rank=out.rank, world=world)


def sync_context(comm):
    out = _SyncContext(struct_size=ctypes.sizeof(_SyncContext))
    comm._call(lib.symmem_comm_sync_context(comm.handle, ctypes.byref(out)))
    return SyncContext(flags=out.flags, peer_flags=tuple(out.peer_flags[:out.world]), epochs=out.epochs,
                       failure_claim=out.failure_claim, failure=out.failure, abort_word=out.abort_word,
                       timeout_ns=out.timeout_ns, heap_stride=out.heap_stride, rank=out.rank, world=out.world,
                       phases=out.phases, max_blocks=out.max_blocks, user_op=out.user_op)


def begin_user_call(comm, description, blocks, stream):
    """The host half of a user kernel call, right before launching it on `stream` (an integer
    cudaStream_t) with `blocks` blocks: raises if the communicator failed, orders the call after
    the communicator's previous one, logs `description`, and returns the call's signature."""
    signature = ctypes.c_uint32()
    rc = lib.symmem_comm_begin_user_call(comm.handle, description.encode(), int(blocks), stream,
                                         ctypes.byref(signature))
    if rc:
        comm._call(rc)
    return signature.value


def end_user_call(comm, stream):
    """Optional, right after launching the kernel of the last begin_user_call on `stream`: records
    the call's end, so that the communicator's next call on another stream waits for this kernel
    only (without it, for everything `stream` holds by then: still ordered, less precisely)."""
    comm._call(lib.symmem_comm_end_user_call(comm.handle, stream))


class _GatheredPieces(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint64), ("flags", ctypes.c_uint64), ("pieces", ctypes.c_int32),
                ("piece_rows", ctypes.c_int32), ("shard_rows", ctypes.c_int32), ("rank", ctypes.c_int32),
                ("world", ctypes.c_int32), ("reserved", ctypes.c_int32)]


_PIECES_CONSUMER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_GatheredPieces))


@dataclass(frozen=True)
class GatheredPieces:
    """symmem::GatheredPieces: flags[s * pieces + j] (uint32, this rank's device memory) becomes 1
    once piece j of shard s is in the gathered matrix (never for this rank's own shard)."""
    flags: int
    pieces: int
    piece_rows: int
    shard_rows: int
    rank: int
    world: int


def all_gather_pieces(comm, gathered, shard, m, row_bytes, tile_rows, stream, consume):
    """symmem::all_gather_pieces: gathered (device address of m rows of row_bytes inside one heap
    buffer, the same offset on every rank) receives every rank's shard of m / world rows, piece by
    piece on the copy engines; consume(GatheredPieces) enqueues the consumer on `stream` (an integer
    cudaStream_t) meanwhile. Collective. An exception of `consume` is raised after the C call."""
    failure = []

    def consumer(_context, pieces):
        try:
            p = pieces.contents
            consume(GatheredPieces(p.flags, p.pieces, p.piece_rows, p.shard_rows, p.rank, p.world))
            return 0
        except BaseException as e:  # noqa: B036 (nothing may unwind into C)
            failure.append(e)
            return 1

    callback = _PIECES_CONSUMER(consumer)
    rc = lib.symmem_all_gather_pieces(comm.handle, gathered, shard, int(m), int(row_bytes), int(tile_rows), stream,
                                      ctypes.cast(callback, ctypes.c_void_p), None)
    if failure:
        raise failure[0]
    if rc:
        comm._call(rc)


def user_call_signature(description, blocks):
    """The signature begin_user_call gives `description` launched with `blocks` blocks."""
    return lib.symmem_user_call_signature(description.encode(), int(blocks))


# The sync-context words a Triton kernel receives (an int64 tensor, symmem.triton reads it by
# these indices). Word 0 tells a kernel it was given a sync context of this layout.
SYNC_MAGIC = 0x53594E4353594D01  # "SYMMSYNC", version 1
SYNC_ABORT, SYNC_FAILURE, SYNC_CLAIM, SYNC_FLAGS, SYNC_EPOCHS = 1, 2, 3, 4, 5
SYNC_TIMEOUT_NS, SYNC_HEAP_STRIDE, SYNC_RANK, SYNC_WORLD, SYNC_USER_OP = 6, 7, 8, 9, 10
SYNC_WORDS = 16


def sync_words(ctx):
    """The int64 words of `ctx` in symmem.triton's layout. Peers' flags are reached through the heap
    stride (the heap maps rank p's memory at base + p * stride in every process): checked here."""
    for p, address in enumerate(ctx.peer_flags):
        if address != ctx.flags + (p - ctx.rank) * ctx.heap_stride:
            raise AssertionError(f"rank {p}'s user flags at {address:#x} are not at the heap stride from this rank's")
    words = [0] * SYNC_WORDS
    words[0] = SYNC_MAGIC
    words[SYNC_ABORT] = ctx.abort_word
    words[SYNC_FAILURE] = ctx.failure
    words[SYNC_CLAIM] = ctx.failure_claim
    words[SYNC_FLAGS] = ctx.flags
    words[SYNC_EPOCHS] = ctx.epochs
    words[SYNC_TIMEOUT_NS] = ctx.timeout_ns
    words[SYNC_HEAP_STRIDE] = ctx.heap_stride
    words[SYNC_RANK] = ctx.rank
    words[SYNC_WORLD] = ctx.world
    words[SYNC_USER_OP] = ctx.user_op
    return [w - (1 << 64) if w >= 1 << 63 else w for w in words]  # as int64
