"""A symmem communicator for Python, with no torch dependency: device addresses and CUDA streams
are integers here (symmem.torch turns tensors and torch streams into them).

Collective calls (create, allocate, close and every collective) must be made by every rank in the
same order, as in C++. Errors raise SymmemError; after a device failure (a dead, stalled or
mismatched rank) every later call raises, naming the rank that failed first.
"""
import array
import ctypes

from . import _native, errors
from ._native import lib

# The per-call collectives: symmem._fastcall's where it loaded, else ctypes'. The same C calls for
# addresses and streams given as ints (or None) and sizes that fit; ctypes would also take its own
# pointer objects and wrap a negative size, where _fastcall raises TypeError or OverflowError.
_all_gather = _native.per_call("all_gather")
_all_reduce = _native.per_call("all_reduce")
_reduce_scatter = _native.per_call("reduce_scatter")
_all_to_all = _native.per_call("all_to_all")
_all_to_all_v = _native.per_call("all_to_all_v")
_all_to_all_vdev = _native.per_call("all_to_all_vdev")


class Exchange:
    """How the ranks exchange small blobs while a communicator is built and when it allocates:
    ``all_gather(mine: bytes) -> list[bytes]`` (one per rank, in rank order) and ``barrier()``.
    Every rank calls them in the same order; both should raise on timeout."""

    def all_gather(self, mine):
        raise NotImplementedError

    def barrier(self):
        self.all_gather(b"\0")


class Communicator:
    """One rank of a symmem communicator (one process per GPU of one node)."""

    def __init__(self, rank, world, device, exchange, timeout_ms=0, workspace_bytes=0):
        """Collective. ``exchange`` is an Exchange whose ranks are this communicator's ranks."""
        self._handle = None
        self._exchange = exchange
        self._exchange_error = None
        # The C side calls these during create, allocate and close; they must outlive the handle.
        self._all_gather_fn = _native.ALL_GATHER_FN(self._all_gather_callback)
        self._barrier_fn = _native.BARRIER_FN(self._barrier_callback)
        handle = ctypes.c_void_p()
        self._call(lib.symmem_comm_create(rank, world, device, self._all_gather_fn, self._barrier_fn, None,
                                          int(timeout_ms), int(workspace_bytes), ctypes.byref(handle)))
        self._handle = handle.value

    @classmethod
    def from_env(cls, device):
        """Collective over symmem's own TCP store (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...)."""
        self = cls.__new__(cls)
        self._exchange = None
        self._exchange_error = None
        handle = ctypes.c_void_p()
        _native.check(lib.symmem_comm_create_from_env(device, ctypes.byref(handle)))
        self._handle = handle.value
        return self

    # The exchange callbacks: a Python exception cannot cross C, so it is kept and re-raised by
    # _call as the cause of the SymmemError the failed C call returns.
    def _all_gather_callback(self, _context, mine, all_out, nbytes):
        try:
            blobs = self._exchange.all_gather(ctypes.string_at(mine, nbytes))
            for r, blob in enumerate(blobs):
                if len(blob) != nbytes:
                    raise errors.SymmemError(_native.ErrorCode.kBootstrap, f"rank {r} sent {len(blob)} bytes where {nbytes} were expected")
                ctypes.memmove(all_out + r * nbytes, blob, nbytes)
            return 0
        except BaseException as e:  # noqa: B036 (nothing may unwind into C)
            self._exchange_error = e
            return 1

    def _barrier_callback(self, _context):
        try:
            self._exchange.barrier()
            return 0
        except BaseException as e:  # noqa: B036
            self._exchange_error = e
            return 1

    def _call(self, rc):
        if rc:
            err = _native.error(rc)
            cause, self._exchange_error = self._exchange_error, None
            if cause is not None and not isinstance(cause, Exception):
                raise cause  # KeyboardInterrupt, SystemExit: not symmem's to turn into an error
            raise err from cause

    @property
    def handle(self):
        if self._handle is None:
            raise errors.SymmemError(_native.ErrorCode.kInvalidArgument, "the communicator was destroyed")
        return self._handle

    @property
    def rank(self):
        return lib.symmem_comm_rank(self.handle)

    @property
    def world(self):
        return lib.symmem_comm_world(self.handle)

    @property
    def local_rank(self):
        """Rank in this node: the index of a heap buffer's peers."""
        return lib.symmem_comm_local_rank(self.handle)

    @property
    def local_world(self):
        """Ranks of this node (that share the heap)."""
        return lib.symmem_comm_local_world(self.handle)

    @property
    def nodes(self):
        """Nodes the ranks span: 1 for one NVLink domain; more, and only all_gather is served."""
        return lib.symmem_comm_nodes(self.handle)

    @property
    def device(self):
        return lib.symmem_comm_device(self.handle)

    def allocate(self, nbytes):
        """Collective: the device address of a new heap buffer (symmetric; lives until close)."""
        ptr = ctypes.c_void_p()
        self._call(lib.symmem_comm_allocate(self.handle, int(nbytes), ctypes.byref(ptr)))
        return ptr.value

    def buffer_of(self, ptr, nbytes):
        """(base, size) of the heap buffer holding [ptr, ptr + nbytes), or None."""
        base, size = ctypes.c_void_p(), ctypes.c_size_t()
        self._call(lib.symmem_comm_buffer_of(self.handle, ptr, nbytes, ctypes.byref(base), ctypes.byref(size)))
        return (base.value, size.value) if base.value else None

    def refuse(self, op, code, message, stream):
        """Refuses this rank's part of the collective call `op`, whose arguments failed a check of
        the caller's (symmem_refuse_call): every rank raises `code` (an ErrorCode) with the same
        message naming this rank and `message`, the peers at their next call, check or synchronize,
        and the communicator is unusable after. `stream`: the one the call would have used. Returns
        the SymmemError this rank raises."""
        rc = lib.symmem_refuse_call(self.handle, op.encode(), _native.ERROR_CODES.index(_native.ErrorCode(code)),
                                    str(message).encode(errors="replace"), stream)
        return _native.error(rc)

    # Collectives: addresses and the stream are integers; dtype, op and algo are C enum values
    # (_native.DTYPES, _native.REDUCE_OPS, _native.algo_code).
    def all_gather(self, out, inp, count, dtype, stream, algo=0, blocks=0, max_blocks=-1):
        rc = _all_gather(self._handle, out, inp, count, dtype, stream, algo, blocks, max_blocks)
        if rc:
            self._call(rc)

    def all_reduce(self, out, inp, count, dtype, op, stream, algo=0, blocks=0, max_blocks=-1):
        rc = _all_reduce(self._handle, out, inp, count, dtype, op, stream, algo, blocks, max_blocks)
        if rc:
            self._call(rc)

    def reduce_scatter(self, out, inp, count, dtype, op, stream, algo=0, blocks=0, max_blocks=-1):
        rc = _reduce_scatter(self._handle, out, inp, count, dtype, op, stream, algo, blocks, max_blocks)
        if rc:
            self._call(rc)

    def all_gather_matmul(self, c, gathered_a, a_shard, b, m, n, k, dtype, stream, b_layout=0):
        """c [m x n] = all_gather(a_shard) [m x k] @ b [k x n] (symmem/fused.hpp); gathered_a: m * k
        elements inside one heap buffer, at the same offset on every rank; b_layout: a value of
        _native.MATRIX_LAYOUTS (column_major: b stored as the transpose of a row-major [n x k])."""
        rc = lib.symmem_all_gather_matmul(self._handle, c, gathered_a, a_shard, b, m, n, k, dtype, stream, b_layout)
        if rc:
            self._call(rc)

    def matmul_reduce_scatter(self, c_shard, workspace, a, b, m, n, k, dtype, stream, b_layout=0):
        """c_shard [m / world x n] = this rank's rows of the sum over ranks of a [m x k] @ b [k x n]
        (symmem/fused.hpp); workspace: matmul_reduce_scatter_workspace_bytes(m, n) bytes inside one
        heap buffer, at the same offset on every rank; b_layout as all_gather_matmul's."""
        rc = lib.symmem_matmul_reduce_scatter(self._handle, c_shard, workspace, a, b, m, n, k, dtype, stream,
                                              b_layout)
        if rc:
            self._call(rc)

    @staticmethod
    def matmul_reduce_scatter_workspace_bytes(m, n):
        return lib.symmem_matmul_reduce_scatter_workspace_bytes(m, n)

    # All-to-all (symmem/all_to_all.hpp): rows are bytes. Splits: host sequences of ints for
    # all_to_all_v; device addresses of int64 arrays for all_to_all_vdev (major_align 0: the plain
    # form; >= 1: the 2-D, expert-major form with `experts` local experts).
    def all_to_all(self, out, inp, bytes_per_pair, stream, algo=0, blocks=0, max_blocks=-1):
        rc = _all_to_all(self._handle, out, inp, bytes_per_pair, stream, algo, blocks, max_blocks)
        if rc:
            self._call(rc)

    def all_to_all_v(self, out, out_rows, inp, in_rows, in_splits, out_splits, row_bytes, stream, algo=0, blocks=0,
                     max_blocks=-1):
        world = self.world
        if len(in_splits) != world or len(out_splits) != world:
            raise self.refuse("all_to_all_v", _native.ErrorCode.kInvalidArgument,
                              f"{len(in_splits)} input and {len(out_splits)} output splits for a world of {world}",
                              stream)
        # The splits as int64 arrays the call reads by address (kept alive by these names until it
        # returns); array.array builds them faster than ctypes arrays.
        try:
            ins = array.array("q", [int(v) for v in in_splits])
            outs = array.array("q", [int(v) for v in out_splits])
        except OverflowError as e:  # a split outside int64: refused on every rank, not only here
            raise self.refuse("all_to_all_v", _native.ErrorCode.kInvalidArgument, f"a split outside int64 ({e})",
                              stream)
        rc = _all_to_all_v(self._handle, out, out_rows, inp, in_rows, ins.buffer_info()[0], outs.buffer_info()[0],
                           row_bytes, stream, algo, blocks, max_blocks)
        if rc:
            self._call(rc)

    def all_to_all_vdev(self, out, out_rows, inp, in_rows, in_splits, out_splits_offsets, row_bytes, stream,
                        experts=1, major_align=0, algo=0, blocks=0, max_blocks=-1):
        rc = _all_to_all_vdev(self._handle, out, out_rows, inp, in_rows, in_splits, out_splits_offsets, row_bytes,
                              experts, major_align, stream, algo, blocks, max_blocks)
        if rc:
            self._call(rc)

    def describe_all_to_all(self, form, out, out_rows, inp, in_rows, row_bytes=1, experts=1, major_align=0, algo=0,
                            blocks=0, max_blocks=-1):
        """The plan of an all-to-all (form 'uniform', 'host_splits' or 'device_splits'); uniform:
        out_rows = in_rows = bytes per pair."""
        text = ctypes.create_string_buffer(512)
        code = {"uniform": 0, "host_splits": 1, "device_splits": 2}[form]
        self._call(lib.symmem_describe_all_to_all(self.handle, code, out, out_rows, inp, in_rows, row_bytes, experts,
                                                  major_align, algo, blocks, max_blocks, text, len(text)))
        return text.value.decode()

    def describe(self, collective, out, inp, count, dtype, algo=0, blocks=0, max_blocks=-1):
        """The plan the call would run, e.g. 'all_reduce low_latency blocks=8 ...' (nothing runs)."""
        text = ctypes.create_string_buffer(512)
        self._call(lib.symmem_describe(self.handle, _native.COLLECTIVES[collective], out, inp, count, dtype, algo,
                                       blocks, max_blocks, text, len(text)))
        return text.value.decode()

    def barrier(self, stream):
        self._call(lib.symmem_comm_barrier(self.handle, stream))

    def check(self):
        """Raises SymmemError if a device wait of an earlier call failed on any rank."""
        self._call(lib.symmem_comm_check(self.handle))

    @property
    def aborted(self):
        return bool(lib.symmem_comm_aborted(self.handle))

    @property
    def live_graphs(self):
        """CUDA graphs that captured a call of this communicator and still exist (or still run):
        its memory must stay mapped while any does."""
        return lib.symmem_comm_live_graphs(self.handle)

    def close(self):
        """Collective teardown: every buffer and tensor of this communicator becomes invalid."""
        if self._handle is not None:
            try:
                self._call(lib.symmem_comm_close(self._handle))
            finally:
                self.destroy()

    def destroy(self):
        """Local release (no peer involved); what close() does after its collective part."""
        handle, self._handle = self._handle, None
        if handle is not None:
            lib.symmem_comm_destroy(handle)
