"""Launching a Triton kernel as a call of a symmem communicator (include/symmem/user_call.hpp).

launch() does what a library collective does around its kernel: refuses a communicator that
failed, orders the call after the communicator's previous one whatever its stream, holds the
communicator for a CUDA graph that captures the call, and signs and logs it
(symmem_comm_begin_user_call); then it launches the kernel on the current stream with the
parameters it knows filled in by name: `sync` (the communicator's sync context), `signature` (this
call's), `rank` and `WORLD` (the node's), `heap_stride`; then it records the call's end
(symmem_comm_end_user_call), as a library call does after its last enqueue. Graph-capturable:
replays run only the kernel, which advances its epochs on the device.
"""
import threading

from .. import device as _device

_FILLED = ("sync", "signature", "rank", "WORLD", "heap_stride")
# Triton's JIT cache is not documented as thread-safe; ranks may be threads of one process.
_launch_lock = threading.Lock()


def description_of(name, shape):
    """What the ranks must agree on, as logged: 'triton:name(4096, bfloat16)'."""
    return f"triton:{name}({', '.join(str(s) for s in shape)})"


def _arg_names(kernel):
    names = getattr(kernel, "arg_names", None)
    return names if names is not None else kernel.fn.arg_names


def launch(kernel, grid, *args, comm=None, name=None, shape=(), **kwargs):
    """Launches `kernel` on `grid` programs (an int or a 1-D tuple, at most MAX_BLOCKS) as a call of
    `comm`'s communicator (a symmem.communicator.Communicator, a symmem.torch.GroupCommunicator, a
    process group, or None for the world group). `name` and `shape` describe the call: every rank
    must pass the same, and ranks that differ fail with kMismatch naming both. Returns what the
    launch returns."""
    import torch
    from ..torch.device import _ensure_open, _owner_of, _sync_of, core_of

    owner = _owner_of(comm)
    _ensure_open(owner)  # a closed group's communicator takes no more calls
    core = core_of(owner)
    grid = tuple(grid) if isinstance(grid, (tuple, list)) else (int(grid),)
    if len(grid) > 1 and any(int(g) != 1 for g in grid[1:]):
        raise ValueError(f"symmem.triton.launch: user kernels take a 1-D grid, not {grid}")
    blocks = int(grid[0])
    description = description_of(name or getattr(kernel, "__name__", "kernel"), shape)
    names = _arg_names(kernel)
    with torch.cuda.device(core.device):
        stream = torch.cuda.current_stream()
        sync, context = _sync_of(core)
        signature = _device.begin_user_call(core, description, blocks, stream.cuda_stream)
        # As a signed 32-bit value, so that Triton types it i32 whatever its top bit (a value of
        # 2**31 or more would be i64, and compile a second kernel); the helpers read it as uint32.
        signature = signature - (1 << 32) if signature >= 1 << 31 else signature
        known = {"sync": sync, "signature": signature, "rank": context.rank, "WORLD": context.world,
                 "heap_stride": context.heap_stride}
        for key in _FILLED:
            if key in names and key not in kwargs:
                kwargs[key] = known[key]
        with _launch_lock:
            launched = kernel[(blocks,)](*args, **kwargs)
        # The call's end, after its kernel (begin_user_call left it open).
        _device.end_user_call(core, stream.cuda_stream)
        return launched
