"""Ranks as processes running symmem.triton's helpers under Triton's interpreter (TRITON_INTERPRET=1,
which runs no assembly and is not thread-safe, hence processes), over shared memory laid out as
symmem's heap and host board:

  heap:  one file, REGION bytes per rank; every process maps rank r's region at its own base +
         r * STRIDE (MAP_FIXED), so peers differ by the same stride in every process while the bases
         differ between processes, as the real heap's do. A region is [user flags | epochs | claim |
         data], the user-call area's layout (src/workspace/user_call_area.hpp) plus a data area.
  board: one file: rank r's failure record at r * 64, the abort word after them.

The parent (pytest) imports this module without triton; each child sets TRITON_INTERPRET before
importing it. run_ranks(world, scenario, ...) returns each rank's result, or raises naming the rank
that failed or did not finish.
"""
import ctypes
import mmap
import multiprocessing
import os
import struct
import tempfile
import time
import traceback

REGION = 1 << 20
STRIDE = 4 << 20
FLAGS_BYTES = 4 * 160 * 8 * 8
EPOCHS_OFFSET = FLAGS_BYTES
CLAIM_OFFSET = EPOCHS_OFFSET + 160 * 4
DATA_OFFSET = 64 << 10
RECORD_BYTES = 64
USER_OP = 16
RECORD_FIELDS = ("code", "op", "rank", "peer", "block", "phase", "signature", "peer_signature")

_PROT_NONE, _PROT_RW = 0, 3
_MAP_SHARED, _MAP_PRIVATE, _MAP_FIXED, _MAP_ANONYMOUS, _MAP_NORESERVE = 0x1, 0x2, 0x10, 0x20, 0x4000


class Rank:
    """One rank's view of the emulated heap and board (in a child process)."""

    def __init__(self, rank, world, heap_path, board_path, timeout_ms):
        self.rank, self.world = rank, world
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        base = libc.mmap(None, world * STRIDE, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
        if base in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "reserving the emulated heap")
        fd = os.open(heap_path, os.O_RDWR)
        for r in range(world):
            got = libc.mmap(base + r * STRIDE, REGION, _PROT_RW, _MAP_SHARED | _MAP_FIXED, fd, r * REGION)
            if got != base + r * STRIDE:
                raise OSError(ctypes.get_errno(), f"mapping rank {r}'s region")
        os.close(fd)
        self.base = base
        with open(board_path, "r+b") as f:
            self.board = mmap.mmap(f.fileno(), 0)
        self.board_address = ctypes.addressof(ctypes.c_char.from_buffer(self.board))
        self.timeout_ns = timeout_ms * 1000000

    def region(self, r):
        return self.base + r * STRIDE

    def data(self, r=None):
        """Address of rank r's data area (this rank's by default), as mapped here."""
        return self.region(self.rank if r is None else r) + DATA_OFFSET

    def tensor(self, address, numel, dtype):
        import torch
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        return torch.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=dtype)

    def sync(self):
        """The sync-context tensor symmem.triton.launch would pass (symmem.device.sync_words)."""
        import torch
        from symmem import device
        words = [0] * device.SYNC_WORDS
        words[0] = device.SYNC_MAGIC
        words[device.SYNC_ABORT] = self.board_address + self.world * RECORD_BYTES
        words[device.SYNC_FAILURE] = self.board_address + self.rank * RECORD_BYTES
        words[device.SYNC_CLAIM] = self.region(self.rank) + CLAIM_OFFSET
        words[device.SYNC_FLAGS] = self.region(self.rank)
        words[device.SYNC_EPOCHS] = self.region(self.rank) + EPOCHS_OFFSET
        words[device.SYNC_TIMEOUT_NS] = self.timeout_ns
        words[device.SYNC_HEAP_STRIDE] = STRIDE
        words[device.SYNC_RANK] = self.rank
        words[device.SYNC_WORLD] = self.world
        words[device.SYNC_USER_OP] = USER_OP
        return torch.tensor(words, dtype=torch.int64)

    def record(self, r=None):
        r = self.rank if r is None else r
        values = struct.unpack_from("<IIiiiiII", self.board, r * RECORD_BYTES)
        return dict(zip(RECORD_FIELDS, values))

    def aborted(self):
        return struct.unpack_from("<I", self.board, self.world * RECORD_BYTES)[0] != 0

    def flag(self, r, phase, block, peer):
        """Slot [phase][block][peer] of rank r's barrier flags (as 64-bit value)."""
        address = self.region(r) + ((phase * 160 + block) * 8 + peer) * 8
        return ctypes.c_uint64.from_address(address)


def _index_scalars_with_numpy_2():
    """Triton 3.6's interpreter holds a scalar as a one-element array and turns it into an index with
    int(array), which numpy 2.3+ refuses ("only 0-dimensional arrays"): a loop over range() with a
    runtime bound fails. Its patch of tl.tensor.__index__ is wrapped to take the element instead."""
    from triton.runtime import interpreter
    patch = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


def _child(rank, world, heap_path, board_path, timeout_ms, scenario, args, results, start):
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        _index_scalars_with_numpy_2()
        import triton_interpreter_scenarios as scenarios
        me = Rank(rank, world, heap_path, board_path, timeout_ms)
        start.wait(timeout=60)  # every started rank imported and set up: the deadlines count from here
        results.put((rank, "ok", getattr(scenarios, scenario)(me, *args)))
    except BaseException:  # noqa: B036 (reported to the parent, which fails the test)
        results.put((rank, "error", traceback.format_exc()))


# The device deadline of a scenario that expects none to pass: interpreted ranks spin in Python,
# several to a core on a small CI machine, so a peer can be seconds late. Scenarios that test a
# deadline pass their own.
UNHURRIED_TIMEOUT_MS = 20000


def run_ranks(world, scenario, *args, timeout_ms=UNHURRIED_TIMEOUT_MS, wall_s=120, skip=()):
    """Runs scenario(rank, *args) in `world` processes, which start it together; ranks in `skip`
    never start (a rank that never comes). Returns {rank: result}."""
    context = multiprocessing.get_context("spawn")
    directory = tempfile.mkdtemp(prefix="symmem-interp-")
    heap_path, board_path = os.path.join(directory, "heap"), os.path.join(directory, "board")
    with open(heap_path, "wb") as f:
        f.truncate(world * REGION)
    with open(board_path, "wb") as f:
        f.truncate(4096)
    results = context.Queue()
    start = context.Barrier(world - len(set(skip)))
    procs = [context.Process(target=_child, args=(r, world, heap_path, board_path, timeout_ms, scenario, args,
                                                  results, start))
             for r in range(world) if r not in skip]
    for p in procs:
        p.start()
    out, deadline = {}, time.monotonic() + wall_s
    try:
        while len(out) < len(procs):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(world)) - set(skip) - set(out))
                raise TimeoutError(f"{scenario}: ranks {missing} did not finish in {wall_s} s")
            try:
                rank, status, value = results.get(timeout=min(remaining, 5))
            except Exception:  # queue.Empty: check that nobody died
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"{scenario}: a rank process died with exit code {dead[0].exitcode}")
                continue
            if status != "ok":
                raise RuntimeError(f"{scenario}: rank {rank} failed:\n{value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        for path in (heap_path, board_path):
            os.unlink(path)
        os.rmdir(directory)
    return out
