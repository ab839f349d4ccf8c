"""The symmem ops, registered with torch.library (schema + CUDA kernel + CPU kernel + fake), tagged
``pt2_compliant_tag``:

  symmem::all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor
  symmem::all_reduce_(Tensor(a!) input, str reduce_op, str group_name) -> ()
  symmem::all_reduce_out(Tensor input, str reduce_op, str group_name, *, Tensor(a!) out) -> ()
  symmem::all_gather_into_tensor(Tensor input, str group_name) -> Tensor
  symmem::all_gather_into_tensor_out(Tensor input, str group_name, *, Tensor(a!) out) -> ()
  symmem::all_gather(Tensor input, str group_name, Tensor(a!)[] outputs) -> ()
  symmem::reduce_scatter_tensor(Tensor input, str reduce_op, str group_name) -> Tensor
  symmem::reduce_scatter_tensor_out(Tensor input, str reduce_op, str group_name, *, Tensor(a!) out) -> ()

reduce_op: "sum", "avg" (floating types), "max", "min". Reductions take float32, float16,
bfloat16 and int32; gathers move bytes and take every dtype. Gathers stack along dim 0 and the
reduce-scatter splits along dim 0 (as torch.distributed's tensor forms do). The CUDA kernels run on
torch.cuda.current_stream() and are capturable in CUDA graphs; tensors in symmetric heap memory
(symmem.torch.empty / mem_pool) run zero-copy, others are staged. The all-gather is in place when
the input is this rank's slot of the output. The CPU kernels call torch.distributed on the group
(e.g. gloo), so that the ops are usable, and checkable with opcheck, on any machine. Every kernel
refuses a group name torch.distributed no longer knows (SymmemError, a DistBackendError).

The CUDA kernels are thin: the arguments are checked and the core called by ``_route``, the one
route every entry point takes. They are registered with Library.impl rather than
torch.library.custom_op: the dispatcher then calls them directly.
"""
import torch
import torch.distributed as dist

from . import _route
from .groups import GroupCommunicator, state_of

_lib = torch.library.Library("symmem", "DEF")
_TAGS = (torch.Tag.pt2_compliant_tag,)
for _schema in (
        "all_reduce(Tensor input, str reduce_op, str group_name) -> Tensor",
        "all_reduce_(Tensor(a!) input, str reduce_op, str group_name) -> ()",
        "all_reduce_out(Tensor input, str reduce_op, str group_name, *, Tensor(a!) out) -> ()",
        "all_gather_into_tensor(Tensor input, str group_name) -> Tensor",
        "all_gather_into_tensor_out(Tensor input, str group_name, *, Tensor(a!) out) -> ()",
        "all_gather(Tensor input, str group_name, Tensor(a!)[] outputs) -> ()",
        "reduce_scatter_tensor(Tensor input, str reduce_op, str group_name) -> Tensor",
        "reduce_scatter_tensor_out(Tensor input, str reduce_op, str group_name, *, Tensor(a!) out) -> ()"):
    _lib.define(_schema, tags=_TAGS)


def gathered_shape(inp, world):
    return (world,) if inp.dim() == 0 else (inp.shape[0] * world, *inp.shape[1:])


def scattered_shape(inp, world, op="reduce_scatter_tensor"):
    if inp.dim() == 0 or inp.shape[0] % world:
        raise ValueError(f"symmem.{op}: dim 0 of the input ({tuple(inp.shape)}) must divide by the group size {world}")
    return (inp.shape[0] // world, *inp.shape[1:])


def _check_list(inp, outputs, world, op):
    if len(outputs) != world:
        raise ValueError(f"symmem.{op}: {len(outputs)} output tensors for a group of {world}")
    for r, t in enumerate(outputs):
        if t.dtype != inp.dtype or t.numel() != inp.numel():
            raise ValueError(f"symmem.{op}: outputs[{r}] is {t.dtype} with {t.numel()} elements, the input "
                             f"{inp.dtype} with {inp.numel()}")


def _adjacent(outputs):
    """One flat view over the outputs when they are contiguous and back to back in one storage."""
    first = outputs[0]
    n = first.numel()
    base = first.data_ptr()
    step = n * first.element_size()
    for r, t in enumerate(outputs):
        if not t.is_contiguous() or t.data_ptr() != base + r * step or t.untyped_storage().data_ptr() != \
                first.untyped_storage().data_ptr():
            return None
    return first.as_strided((n * len(outputs),), (1,), first.storage_offset())


def all_gather_list(comm, inp, outputs):
    """The list form: straight into the outputs when they are adjacent, else through one buffer."""
    _check_list(inp, outputs, comm.world, "all_gather")
    flat = _adjacent(outputs)
    if flat is not None and flat.get_device() == comm.device:
        _route.all_gather(comm, flat, inp, op="all_gather")
        return
    gathered = inp.new_empty((comm.world * inp.numel(),))
    _route.all_gather(comm, gathered, inp, op="all_gather")
    for r, t in enumerate(outputs):
        t.copy_(gathered[r * inp.numel():(r + 1) * inp.numel()].view(t.shape))


# CUDA kernels ----------------------------------------------------------------------------------

def _all_reduce_out_cuda(inp, reduce_op, group_name, *, out):
    _route.all_reduce(GroupCommunicator(group_name), out, inp, reduce_op)
    return out


def _all_reduce_cuda(inp, reduce_op, group_name):
    out = torch.empty_like(inp, memory_format=torch.contiguous_format)
    return _all_reduce_out_cuda(inp, reduce_op, group_name, out=out)


def _all_reduce_inplace_cuda(inp, reduce_op, group_name):
    _route.all_reduce(GroupCommunicator(group_name), inp, inp, reduce_op)


def _all_gather_out_cuda(inp, group_name, *, out):
    _route.all_gather(GroupCommunicator(group_name), out, inp)
    return out


def _all_gather_cuda(inp, group_name):
    comm = GroupCommunicator(group_name)
    out = inp.new_empty(gathered_shape(inp, comm.world))
    _route.all_gather(comm, out, inp)
    return out


def _all_gather_list_cuda(inp, group_name, outputs):
    all_gather_list(GroupCommunicator(group_name), inp, outputs)


def _reduce_scatter_out_cuda(inp, reduce_op, group_name, *, out):
    _route.reduce_scatter(GroupCommunicator(group_name), out, inp, reduce_op)
    return out


def _reduce_scatter_cuda(inp, reduce_op, group_name):
    comm = GroupCommunicator(group_name)
    out = inp.new_empty(scattered_shape(inp, comm.world))
    _route.reduce_scatter(comm, out, inp, reduce_op)
    return out


# CPU kernels: torch.distributed on the group ---------------------------------------------------

def _group_size(group_name):
    return state_of(group_name).world


_DIST_OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def _dist_all_reduce(t, reduce_op, group):
    if reduce_op == "avg":  # gloo has no AVG
        dist.all_reduce(t, dist.ReduceOp.SUM, group=group)
        t.div_(group.size())
    else:
        dist.all_reduce(t, _DIST_OPS[reduce_op], group=group)


def _check_cpu_reduction(inp, out, reduce_op, op):
    _route.dtype_code(inp.dtype, op)
    _route.reduce_code(reduce_op, inp.dtype, op)
    _route.check_contiguous(inp, "input", op)
    _route.check_contiguous(out, "out", op)
    _route.check_same_dtype(out, inp, op)


def _all_reduce_out_cpu(inp, reduce_op, group_name, *, out):
    group = state_of(group_name).group
    _check_cpu_reduction(inp, out, reduce_op, "all_reduce")
    if out.numel() != inp.numel():
        raise ValueError(f"symmem.all_reduce: output has {out.numel()} elements, {inp.numel()} expected")
    if out.data_ptr() != inp.data_ptr():
        out.copy_(inp.view(out.shape))
    _dist_all_reduce(out, reduce_op, group)
    return out


def _all_reduce_cpu(inp, reduce_op, group_name):
    return _all_reduce_out_cpu(inp, reduce_op, group_name, out=inp.clone(memory_format=torch.contiguous_format))


def _all_reduce_inplace_cpu(inp, reduce_op, group_name):
    _all_reduce_out_cpu(inp, reduce_op, group_name, out=inp)


def _all_gather_out_cpu(inp, group_name, *, out):
    group = state_of(group_name).group
    _route.check_contiguous(inp, "input", "all_gather_into_tensor")
    _route.check_contiguous(out, "out", "all_gather_into_tensor")
    _route.check_same_dtype(out, inp, "all_gather_into_tensor")
    if out.numel() != inp.numel() * group.size():
        raise ValueError(f"symmem.all_gather_into_tensor: output has {out.numel()} elements, "
                         f"{inp.numel() * group.size()} expected")
    parts = list(out.view(-1).chunk(group.size()))
    dist.all_gather(parts, inp.reshape(-1).clone(), group=group)
    return out


def _all_gather_cpu(inp, group_name):
    return _all_gather_out_cpu(inp, group_name, out=inp.new_empty(gathered_shape(inp, _group_size(group_name))))


def _all_gather_list_cpu(inp, group_name, outputs):
    group = state_of(group_name).group
    _route.check_contiguous(inp, "input", "all_gather")
    _check_list(inp, outputs, group.size(), "all_gather")
    dist.all_gather(list(outputs), inp, group=group)


def _reduce_scatter_out_cpu(inp, reduce_op, group_name, *, out):
    group = state_of(group_name).group
    _check_cpu_reduction(inp, out, reduce_op, "reduce_scatter_tensor")
    if inp.numel() != out.numel() * group.size():
        raise ValueError(f"symmem.reduce_scatter_tensor: input has {inp.numel()} elements, output {out.numel()}")
    total = inp.reshape(-1).clone()
    _dist_all_reduce(total, reduce_op, group)  # gloo has no reduce_scatter
    out.copy_(total.view(group.size(), -1)[group.rank()].view(out.shape))
    return out


def _reduce_scatter_cpu(inp, reduce_op, group_name):
    out = inp.new_empty(scattered_shape(inp, _group_size(group_name)))
    return _reduce_scatter_out_cpu(inp, reduce_op, group_name, out=out)


def _returning_none(kernel):
    """The kernel of a mutating op (its schema returns nothing, so torch.compile can functionalise it)."""
    def mutate(*args, **kwargs):
        kernel(*args, **kwargs)
    return mutate


for _name, _cuda, _cpu in (
        ("all_reduce", _all_reduce_cuda, _all_reduce_cpu),
        ("all_reduce_", _all_reduce_inplace_cuda, _all_reduce_inplace_cpu),
        ("all_reduce_out", _returning_none(_all_reduce_out_cuda), _returning_none(_all_reduce_out_cpu)),
        ("all_gather_into_tensor", _all_gather_cuda, _all_gather_cpu),
        ("all_gather_into_tensor_out", _returning_none(_all_gather_out_cuda), _returning_none(_all_gather_out_cpu)),
        ("all_gather", _all_gather_list_cuda, _all_gather_list_cpu),
        ("reduce_scatter_tensor", _reduce_scatter_cuda, _reduce_scatter_cpu),
        ("reduce_scatter_tensor_out", _returning_none(_reduce_scatter_out_cuda),
         _returning_none(_reduce_scatter_out_cpu))):
    _lib.impl(_name, _cuda, "CUDA")
    _lib.impl(_name, _cpu, "CPU")


# Fake kernels: shapes only (FakeTensor, meta, torch.compile) -----------------------------------

def _register_fake(name):
    return torch.library.register_fake(f"symmem::{name}", lib=_lib)


@_register_fake("all_reduce")
def _all_reduce_fake(inp, reduce_op, group_name):
    return torch.empty_like(inp, memory_format=torch.contiguous_format)


@_register_fake("all_reduce_")
def _all_reduce_inplace_fake(inp, reduce_op, group_name):
    return None


@_register_fake("all_reduce_out")
def _all_reduce_out_fake(inp, reduce_op, group_name, *, out):
    return None


@_register_fake("all_gather_into_tensor")
def _all_gather_fake(inp, group_name):
    return inp.new_empty(gathered_shape(inp, _group_size(group_name)))


@_register_fake("all_gather_into_tensor_out")
def _all_gather_out_fake(inp, group_name, *, out):
    return None


@_register_fake("all_gather")
def _all_gather_list_fake(inp, group_name, outputs):
    return None


@_register_fake("reduce_scatter_tensor")
def _reduce_scatter_fake(inp, reduce_op, group_name):
    return inp.new_empty(scattered_shape(inp, _group_size(group_name)))


@_register_fake("reduce_scatter_tensor_out")
def _reduce_scatter_out_fake(inp, reduce_op, group_name, *, out):
    return None
