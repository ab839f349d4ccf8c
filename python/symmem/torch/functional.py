"""Drop-in replacements for torch.distributed's collectives, with the same signatures:
``symmem.torch.all_reduce(tensor, op, group, async_op)`` and so on; ``group`` is a ProcessGroup, its
name, or None for the default group.

symmem serves what it can (CUDA tensors of a supported dtype and op, on a group of one node); the
rest goes to torch.distributed, logged once per reason on ``logging.getLogger("symmem")``. The
decision depends only on values that are the same on every rank (device type, dtype, op, the
group), so every rank takes the same path. On a rank outside the group they return None and do
nothing, as torch.distributed does. A destroyed group is refused on every path (SymmemError, a
DistBackendError, as ProcessGroupNCCL raises), also where torch.distributed's gloo would run it.

Streams: a group's calls run in host order whatever streams they come from (the core joins a
stream change), as with torch.distributed. With ``async_op=True`` the call returns a ``Work``
(work.py) with NCCL's meaning; without it, the collective is queued on the current stream.
"""
import logging
from typing import List, Optional, Union

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from . import _route
from .groups import cached_state, state_of
from .work import Work

GroupLike = Union[dist.ProcessGroup, str, None]

log = logging.getLogger("symmem")
_said = set()
_OP_NAMES = ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.MAX, "max"),
             (dist.ReduceOp.MIN, "min"))
# The fast path's lookup by identity (the enum values are singletons that live as long as torch):
# 0.1 us, where == or a hash of the op costs 0.4-0.8 us and a scan 0.4. Anything else (a ReduceOp
# object, e.g. a premultiplied sum) takes the full checks.
_OP_CODE_BY_ID = {id(value): _route.REDUCE_OPS[name] for value, name in _OP_NAMES}


def say_once(function, reason):
    """Logs (warning, once per reason) that `function` falls back to torch.distributed."""
    if reason not in _said:
        _said.add(reason)
        log.warning("symmem.torch.%s falls back to torch.distributed: %s", function, reason)


def op_name(op):
    """"sum", "avg", "max", "min" for a torch.distributed ReduceOp symmem serves, else None."""
    for value, name in _OP_NAMES:
        if op == value:
            return name
    return None


def _state(function, group):
    """The GroupState of `group` for the drop-in `function` (state_of: a destroyed group is refused,
    whatever would serve the call), or None on a rank outside the group: torch.distributed's
    warning, and the call does nothing."""
    if group is not None and not isinstance(group, str) and c10d._rank_not_in_group(group):
        c10d._warn_not_in_group(function)
        return None
    return state_of(group)


def _why_not(tensors, state, reduce_op=None):
    """Why symmem cannot serve this call on the group of `state` (None: it can), and the
    communicator that can."""
    for t in tensors:
        if not t.is_cuda:
            return f"{t.device.type} tensors are not served (CUDA only)", None
    dtype = tensors[0].dtype
    if reduce_op is not None:
        if dtype not in _route.REDUCIBLE:
            return f"dtype {dtype} is not reducible by symmem", None
        name = op_name(reduce_op)
        if name is None:
            return f"reduce op {reduce_op} is not served (sum, avg, max, min)", None
        if name == "avg" and not dtype.is_floating_point:
            return f"avg of {dtype} is not served", None
    reason = state.unavailable_reason()
    if reason is not None:
        return reason, None
    comm = state.communicator()
    if reduce_op is not None and comm.nodes > 1:
        return (f"group {comm.group_name!r} spans {comm.nodes} nodes; symmem's reductions run inside one node "
                "(its all_gather runs across nodes)"), None
    return None, comm


def _eager_communicator(tensor, group):
    """The drop-ins' fast path, eager only: the group's communicator when it exists and `tensor` is
    a plain CUDA tensor outside any dispatch mode; else None, and the full checks decide. Plain
    tensors only: a FakeTensor, another tensor subclass, a TorchDispatchMode (CommDebugMode,
    FakeTensorMode, ...) and torch.compile must see the op."""
    if (type(tensor) is not torch.Tensor or not tensor.is_cuda or torch._C._len_torch_dispatch_stack()
            or torch.compiler.is_compiling()):
        return None
    state = cached_state(group)
    return state.communicators.get(None) if state is not None else None


def _done(async_op, comm, result):
    return Work(comm, result) if async_op else None


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM, group: GroupLike = None,
               async_op: bool = False) -> Optional[dist.Work]:
    # Eager calls go straight to the C call when nothing needs the full checks: the dispatcher
    # would add about 2 us per call, each Python layer 0.1-0.7 (the C call itself, its launch
    # included, about 4: docs/torch.md, "Host cost").
    comm = _eager_communicator(tensor, group)
    if comm is not None and _route.all_reduce_in_place(comm, tensor, _OP_CODE_BY_ID.get(id(op))):
        return Work(comm, [tensor]) if async_op else None
    state = _state("all_reduce", group)
    if state is None:
        return None
    reason, comm = _why_not([tensor], state, op)
    if reason:
        say_once("all_reduce", reason)
        return dist.all_reduce(tensor, op=op, group=state.group, async_op=async_op)
    torch.ops.symmem.all_reduce_(tensor, op_name(op), comm.group_name)
    return _done(async_op, comm, [tensor])


def all_gather_into_tensor(output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: GroupLike = None,
                           async_op: bool = False) -> Optional[dist.Work]:
    state = _state("all_gather_into_tensor", group)
    if state is None:
        return None
    reason, comm = _why_not([output_tensor, input_tensor], state)
    if reason:
        say_once("all_gather_into_tensor", reason)
        return dist.all_gather_into_tensor(output_tensor, input_tensor, group=state.group, async_op=async_op)
    torch.ops.symmem.all_gather_into_tensor_out(input_tensor, comm.group_name, out=output_tensor)
    return _done(async_op, comm, [output_tensor])


def all_gather(tensor_list: List[torch.Tensor], tensor: torch.Tensor, group: GroupLike = None,
               async_op: bool = False) -> Optional[dist.Work]:
    state = _state("all_gather", group)
    if state is None:
        return None
    reason, comm = _why_not([tensor, *tensor_list], state)
    if reason:
        say_once("all_gather", reason)
        return dist.all_gather(tensor_list, tensor, group=state.group, async_op=async_op)
    torch.ops.symmem.all_gather(tensor, comm.group_name, tensor_list)
    return _done(async_op, comm, tensor_list)


def reduce_scatter_tensor(output: torch.Tensor, input: torch.Tensor, op=dist.ReduceOp.SUM, group: GroupLike = None,
                          async_op: bool = False) -> Optional[dist.Work]:
    state = _state("reduce_scatter_tensor", group)
    if state is None:
        return None
    reason, comm = _why_not([output, input], state, op)
    if reason:
        say_once("reduce_scatter_tensor", reason)
        return dist.reduce_scatter_tensor(output, input, op=op, group=state.group, async_op=async_op)
    torch.ops.symmem.reduce_scatter_tensor_out(input, op_name(op), comm.group_name, out=output)
    return _done(async_op, comm, [output])


__all__ = ["all_gather", "all_gather_into_tensor", "all_reduce", "reduce_scatter_tensor"]
