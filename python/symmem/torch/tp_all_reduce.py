"""A vLLM-style all-reduce communicator for tensor parallelism, in the shape of vLLM's
``CustomAllreduce`` and ``SymmMemCommunicator`` (and SGLang's): ``TPAllReduce(group, device,
max_size)``; ``should_custom_ar(t)`` / ``should_use_symm_mem(t)`` say whether symmem takes a
tensor; ``custom_all_reduce(t)`` and ``all_reduce(t, out=None)`` return the sum in a new tensor (or
in ``out``), or None when symmem does not take it; ``disabled`` is True (and every call returns
None) where symmem cannot serve the group: a group spanning nodes, or a communicator that could not
be built, with ``reason`` saying why.

It needs no CUDA-graph capture hook and no registration of graph buffers: symmem's workspaces
exist from creation on, so a call captured in a graph and replayed any number of times reads the
input's current contents (read where it is, or staged into the workspace inside the graph, as the
plan needs) and writes a fresh output.
docs/vllm.md shows how to plug it into vLLM and SGLang.
"""
import contextlib
import logging
from typing import Optional

import torch
import torch.distributed.distributed_c10d as c10d

from .. import errors
from . import _route
from .groups import state_of

log = logging.getLogger("symmem")


class TPAllReduce:
    def __init__(self, group=None, device=None, max_size: int = 64 << 20) -> None:
        """Collective over `group` (a ProcessGroup, e.g. vLLM's CPU group, or its name; None: the
        world group). `device` (optional) must be the current CUDA device, as in vLLM. Tensors up
        to `max_size` bytes are served."""
        self.max_size = int(max_size)
        self.disabled = True
        self.reason = None
        self._comm = None
        if device is not None:
            device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
            if device != torch.device("cuda", torch.cuda.current_device()):
                raise ValueError(f"TPAllReduce: device {device} is not the current device "
                                 f"cuda:{torch.cuda.current_device()}; call torch.cuda.set_device first")
        state = state_of(group)
        self._group = state.group_ref  # (not kept alive by this object)
        self.rank, self.world_size = state.rank, state.world
        self.device = device
        try:
            comm = state.communicator()
        except errors.SymmemError as e:
            self.reason = str(e)
        else:
            if comm.nodes > 1:
                self.reason = (f"group {comm.group_name!r} spans {comm.nodes} nodes; symmem's all-reduce runs inside "
                               "one node")
            else:
                self._comm, self.disabled = comm, False
                self.group_name = comm.group_name
                self.device = comm.torch_device
        if self.disabled:
            log.warning("symmem: TPAllReduce disabled: %s", self.reason)

    def _stop(self):
        """The group was destroyed (torch.distributed no longer knows it) or its communicator was
        closed (close_all): serve no more, and say why. A new TPAllReduce of the group's current
        communicator serves again."""
        self.disabled = True
        self.reason = (f"group {self._comm.group_name!r} was destroyed or its communicator closed; make a new "
                       "TPAllReduce")
        log.warning("symmem: TPAllReduce disabled: %s", self.reason)

    def should_use(self, inp: torch.Tensor) -> bool:
        """True when symmem takes inp: a contiguous CUDA tensor of the communicator's device,
        float32/float16/bfloat16/int32, at most max_size bytes."""
        if self.disabled:
            return False
        if self._comm.closed or self._group() not in c10d._pg_names:  # (c10d's registry of live groups)
            self._stop()
            return False
        return (inp.is_cuda and inp.dtype in _route.REDUCIBLE and inp.is_contiguous()
                and inp.numel() * inp.element_size() <= self.max_size and inp.get_device() == self._comm.device)

    def all_reduce(self, inp: torch.Tensor, *, out: Optional[torch.Tensor] = None,
                   registered: bool = False) -> Optional[torch.Tensor]:
        """Sum over the group, out of place (None when symmem does not take inp); capturable in CUDA
        graphs. `registered` is accepted for vLLM's CustomAllreduce and changes nothing."""
        if not self.should_use(inp):
            return None
        if out is None:
            out = torch.empty_like(inp)
        comm = self._comm
        if torch.compiler.is_compiling():
            torch.ops.symmem.all_reduce_out(inp, "sum", comm.group_name, out=out)  # returns nothing
            return out
        _route.all_reduce(comm, out, inp, "sum")
        return out

    def check(self) -> None:
        """Raises SymmemError if a call failed on any rank (a dead, stalled or mismatched peer).
        Call it after CUDA graph replays, which do not pass through the host (e.g. once a step)."""
        if self._comm is not None:
            self._comm.check()

    # vLLM's and SGLang's names for the same calls.
    should_custom_ar = should_use
    should_use_symm_mem = should_use
    custom_all_reduce = all_reduce

    @contextlib.contextmanager
    def capture(self):
        """No-op: symmem needs no capture hook (kept for vLLM's CustomAllreduce interface)."""
        yield

    def register_graph_buffers(self):
        """No-op: nothing to register (kept for vLLM's CustomAllreduce interface)."""

    def close(self):
        """Stops serving (later calls return None); the communicator belongs to the group
        (symmem.torch.close_all, or the group's destruction, releases it)."""
        self.disabled = True
