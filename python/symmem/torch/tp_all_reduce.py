"""A vLLM-style all-reduce communicator for tensor parallelism, shaped like vLLM's CustomAllreduce
and SymmMemCommunicator: ``should_use(t)`` says whether symmem takes a tensor, ``all_reduce(t)``
returns the sum in a new tensor (or in ``out``).

It needs no CUDA-graph capture hook and no registration of graph buffers: symmem's workspaces
exist from creation on, so a call captured in a graph and replayed any number of times reads the
input's current contents (staged into the workspace inside the graph) and writes a fresh output.
docs/torch.md shows how to plug it into vLLM's device communicator.
"""
import contextlib

import torch

from ..errors import SymmemError
from . import ops
from ._groups import Communicator


class TPAllReduce:
    def __init__(self, group, max_size=64 << 20, device=None):
        """Collective over `group`. Tensors up to `max_size` bytes are served. `device` (optional)
        must be the current CUDA device, as in vLLM. If symmem cannot serve the group (e.g. it spans
        nodes), ``disabled`` is True and ``should_use`` always False."""
        self.max_size = int(max_size)
        self.disabled = False
        self.reason = None
        if device is not None and torch.device(device) != torch.device("cuda", torch.cuda.current_device()):
            raise ValueError(f"TPAllReduce: device {device} is not the current device cuda:{torch.cuda.current_device()}")
        try:
            self._comm = Communicator(group)
        except SymmemError as e:
            self._comm, self.disabled, self.reason = None, True, str(e)
            return
        self.group_name = self._comm.group_name
        self.world_size = self._comm.world

    def should_use(self, inp):
        """True when all_reduce(inp) runs on symmem: a contiguous CUDA tensor of the communicator's
        device, float32/float16/bfloat16/int32, at most max_size bytes."""
        return (not self.disabled and inp.is_cuda and inp.dtype in ops._REDUCIBLE and inp.is_contiguous()
                and inp.numel() * inp.element_size() <= self.max_size and inp.get_device() == self._comm.device)

    def all_reduce(self, inp, out=None):
        """Sum over the group, out of place; capturable in CUDA graphs."""
        if out is None:
            out = torch.empty_like(inp)
        if torch.compiler.is_compiling():
            torch.ops.symmem.all_reduce_out(inp, "sum", self.group_name, out=out)  # returns nothing
            return out
        return ops._all_reduce_out_cuda(inp, "sum", self.group_name, out=out)

    def check(self):
        """Raises SymmemError if a call failed on any rank (a dead, stalled or mismatched peer).
        Call it after CUDA graph replays, which do not pass through the host (e.g. once a step)."""
        if self._comm is not None:
            self._comm.check()

    # vLLM's names for the same calls.
    should_custom_ar = should_use
    custom_all_reduce = all_reduce
    should_use_symm_mem = should_use

    @contextlib.contextmanager
    def capture(self):
        """No-op: symmem needs no capture hook (kept for vLLM's CustomAllreduce interface)."""
        yield

    def close(self):
        """Releases nothing by itself: the communicator belongs to the group (symmem.torch.close_all)."""
        self.disabled = True
