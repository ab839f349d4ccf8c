"""FSDP2 on symmem: the all-gather and reduce-scatter that FSDP2 calls, through torch's
``FSDPModule.set_custom_all_gather`` / ``set_custom_reduce_scatter`` (torch >= 2.11).

    from torch.distributed.fsdp import fully_shard
    import symmem.torch.fsdp
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    symmem.torch.fsdp.enable(model)      # every FSDP module of the model

``SymmemAllGather`` runs the copy-engine all-gather by default: the copies take no SM from the
GEMMs it overlaps. ``SymmemReduceScatter`` runs symmem's SM reduce-scatter (sum, or avg: the
kernel scales the float32 sum by 1 / group size before its one rounding), and falls back to torch.distributed for reduce ops symmem does not have (a
pre-multiplied sum, which FSDP asks for only under ``set_gradient_divide_factor``), saying so once.

Buffers. FSDP asks the comm for its buffers (``allocate``) and frees them only after its streams
have waited for every use (the contract it keeps with the caching allocator). The comms lend whole
symmetric heap buffers for what peers read (the all-gather's output, whose slot is the input: in
place and zero-copy; the reduce-scatter's input), and take a buffer back once the last view of it
has died. The reduce-scatter's output, which becomes the sharded gradients, comes from the caching
allocator.
Steady-state steps allocate nothing; the first step's allocations are collective, like every heap
allocation: every rank's FSDP makes the same requests in the same order (same model, same
wrapping, and no rank keeps a comm buffer alive longer than the others), and a rank that differs
fails with an error (kMismatch, or an allocation timeout), never a hang.

Streams. FSDP runs the all-gathers and the reduce-scatters on two streams with no order between
them; the all-gathers run on a communicator of their own, so any pair of algorithms is safe.
``max_blocks`` caps the SMs an SM collective takes from the GEMMs it overlaps.

Failures: a dead or stalled peer makes the next symmem call raise (SymmemError naming it), but the
step in flight may already have consumed a gradient or parameter the failed collective did not
write. Call ``symmem.torch.fsdp.check(group)`` after the step's synchronisation, before a
checkpoint.
"""
import collections
import math

import torch
import torch.distributed as dist

from .. import _native
from . import _route, functional, memory
from .groups import capturing, state_of

try:  # the comm interfaces exist from torch 2.11 on
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGatherBase
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatterBase
except ImportError:  # pragma: no cover (older torch: enable() raises)
    _AllGatherBase = _ReduceScatterBase = object


def _say_once(reason):
    functional.say_once("fsdp", reason)  # "symmem.torch.fsdp falls back to torch.distributed: ..."


class _Lender:
    """Whole heap buffers of one communicator, lent as views of a tensor over each. A buffer is
    lent again once no view of it is alive: its storage's use count is back to what the lender's
    own tensor holds (a C++ counter read, 0.2 us; making a tensor per loan costs far more).

    As the caching allocator does, a buffer is lent again only for a request on the stream that
    asked for it first. FSDP drops a buffer once the stream it allocated on is ordered after every
    use (the reduce-scatter input: the compute stream waited for the reduce-scatter), not every
    stream: lent to a request on another stream (the all-gather copy-in), it could be overwritten
    while a collective still reads it."""

    def __init__(self, comm):
        self._comm = comm
        self._buffers = collections.defaultdict(list)  # (bytes, stream) -> [(tensor, storage, use count when idle)]
        self.buffers = 0  # heap buffers made so far (each one collective)

    def lend(self, size, dtype):
        element = torch.empty((), dtype=dtype).element_size()
        size = tuple(int(s) for s in size)
        numel = math.prod(size)
        nbytes = max(numel * element, element)  # an empty request takes the smallest buffer (one element)
        for whole, storage, idle in self._buffers[nbytes, self._stream()]:
            if torch._C._storage_Use_Count(storage) == idle:
                break
        else:
            # No idle buffer of this size: every rank misses alike, so this is collective.
            ptr = self._comm.core.allocate(nbytes)
            self.buffers += 1
            whole = self._tensor_over(ptr, nbytes)
            storage = whole.untyped_storage()._cdata
            idle = torch._C._storage_Use_Count(storage)
            self._buffers[nbytes, self._stream()].append((whole, storage, idle))
        flat = whole.view(dtype)
        return (flat if numel else flat[:0]).view(size)

    def _stream(self):
        return torch.cuda.current_stream(self._comm.device).cuda_stream

    def _tensor_over(self, ptr, nbytes):
        return memory.heap_tensor(self._comm, ptr, nbytes)


def _communicator(group, purpose):
    """The communicator of `group` for `purpose`, or None when symmem cannot serve the group (after
    saying why)."""
    state = state_of(group)
    reason = state.unavailable_reason(purpose)
    if reason:
        _say_once(reason)
        return None
    return state.communicator(purpose)


def _served(group, purpose, tensors):
    """The communicator of `group` for `purpose` when symmem serves these tensors, else None
    (after saying why)."""
    for t in tensors:
        if not t.is_cuda or not t.is_contiguous():
            _say_once("CPU or non-contiguous tensors")
            return None
    return _communicator(group, purpose)


class _Comm:
    # FSDP runs its all-gathers and its reduce-scatters on two streams with no order between them,
    # while the calls of one communicator run in host order (the core joins their streams): the
    # all-gathers get a communicator of their own (the reduce-scatters keep the group's), so that
    # neither waits for the other nor shares epochs, flags or workspace with it. Tests turn this
    # off to see the failure it prevents.
    _purpose = None

    def __init__(self, group, algo, max_blocks):
        self._group = group
        self._algo = _native.algo_code(algo)
        self._max_blocks = -1 if max_blocks is None else int(max_blocks)  # -1: no SM budget
        self.calls = 0  # collectives symmem ran (the rest fell back to torch.distributed)

    def _lends(self, size, comm):
        """Whether this request gets a lent heap buffer (else the caching allocator's memory)."""
        return True

    def allocate(self, size, *, dtype, device):
        device = torch.device(device)
        if device.type != "cuda" or capturing():
            return torch.empty(*size, dtype=dtype, device=device)
        comm = _communicator(self._group, self._purpose)
        if comm is None or not self._lends(size, comm):
            return torch.empty(*size, dtype=dtype, device=device)  # staged or fallback buffers
        if device.index is None:  # "cuda": the current device, as torch.empty reads it
            device = torch.device("cuda", torch.cuda.current_device())
        if device != comm.torch_device:
            raise ValueError(f"symmem.torch.fsdp: buffers asked for on {device}, the communicator is on "
                             f"{comm.torch_device}")
        # The lender belongs to the communicator (groups.py): a closed or destroyed group's buffers
        # are never lent again, and the next request takes the group's current communicator.
        lender = comm.lenders.get("fsdp")
        if lender is None:
            lender = comm.lenders["fsdp"] = _Lender(comm)
        return lender.lend(size, dtype)

    @property
    def buffers(self):
        """Heap buffers lent so far by the communicator this comm uses (constant after the first step)."""
        state = state_of(self._group)
        comm = state.communicators.get(self._purpose)
        lender = comm.lenders.get("fsdp") if comm is not None else None
        return 0 if lender is None else lender.buffers


class SymmemAllGather(_Comm, _AllGatherBase):
    """FSDP2's all-gather on symmem. ``algo``: "copy_engine" (default, no SMs), "auto", "push",
    "pull" (SM kernels). ``group``: FSDP's shard group (enable() passes it). Across nodes the same
    object runs the hierarchical all-gather (NCCL between nodes, copy engines inside each) for
    "copy_engine" and "auto"."""

    _purpose = "fsdp_all_gather"

    def __init__(self, group=None, algo="copy_engine", max_blocks=None):
        super().__init__(group, algo, max_blocks)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        comm = _served(group, self._purpose, (output_tensor, input_tensor))
        if comm is None or output_tensor.dtype != input_tensor.dtype:
            return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
        _route.all_gather(comm, output_tensor, input_tensor, self._algo, self._max_blocks)
        self.calls += 1
        return functional._done(async_op, comm, [output_tensor])


class SymmemReduceScatter(_Comm, _ReduceScatterBase):
    """FSDP2's reduce-scatter on symmem (sum; avg, which the kernel scales before rounding).

    Only the input is lent (peers read it: zero copy). FSDP asks for the input, then for the
    output (1/world of it), which becomes the sharded gradients: that comes from the caching
    allocator, so gradients keep its semantics (record_stream, memory returned when freed)."""

    def __init__(self, group=None, algo="auto", max_blocks=None):
        super().__init__(group, algo, max_blocks)
        self._input_numel = None  # the last lent input, whose output request comes next

    def _lends(self, size, comm):
        numel = math.prod(int(s) for s in size)
        if self._input_numel is not None and numel * comm.world == self._input_numel:
            self._input_numel = None
            return False  # the output of the input just lent
        self._input_numel = numel
        return True

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        comm = _served(group, self._purpose, (output_tensor, input_tensor))
        name = "sum" if op is dist.ReduceOp.SUM else "avg" if op is dist.ReduceOp.AVG else None
        dtype = _route.REDUCIBLE.get(input_tensor.dtype) if output_tensor.dtype == input_tensor.dtype else None
        if comm is not None and (name is None or dtype is None):
            _say_once(f"reduce-scatter op {op} or dtype {input_tensor.dtype} (symmem: sum, avg of "
                      "float32/float16/bfloat16)")
            comm = None
        if comm is not None and comm.nodes > 1:
            _say_once(f"reduce-scatter across {comm.nodes} nodes (symmem's reductions run inside one node)")
            comm = None
        if comm is None:
            return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
        _route.reduce_scatter(comm, output_tensor, input_tensor, name, self._algo, self._max_blocks)
        self.calls += 1
        return functional._done(async_op, comm, [output_tensor])


# The SM budget of FSDP's symmem collectives: they overlap the GEMMs, and every block they take is
# one the GEMMs lose. 32 is about NCCL's share (its ring kernels run 24 blocks on 2 x H200).
FSDP_MAX_BLOCKS = 32


def enable(model, all_gather="copy_engine", reduce_scatter=True, max_blocks=FSDP_MAX_BLOCKS):
    """Installs symmem's all-gather (``all_gather``: its algorithm, or None to keep FSDP's) and
    reduce-scatter (``reduce_scatter=False`` keeps FSDP's) on every FSDP module of `model` (the
    setters are per module). Modules of one shard group share one comm, and so its buffers.
    ``max_blocks``: the SMs (thread blocks) a collective that needs SMs may take (the reduce-scatter,
    an SM all-gather) while it overlaps the GEMMs (FSDP_MAX_BLOCKS); None: the tuning table's.
    Returns the number of FSDP modules changed."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo
    if _AllGatherBase is object or not hasattr(FSDPModule, "set_custom_all_gather"):
        raise RuntimeError(f"symmem.torch.fsdp needs FSDPModule.set_custom_all_gather (torch >= 2.11); "
                           f"torch is {torch.__version__}")
    comms = {}
    changed = 0
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        param_group = module._get_fsdp_state()._fsdp_param_group
        if param_group is None or not isinstance(param_group.mesh_info, FSDPMeshInfo):
            continue  # no parameters of its own, or replicated (no all-gather, no reduce-scatter)
        group = param_group.mesh_info.shard_process_group
        ag, rs = comms.setdefault(group, (SymmemAllGather(group, all_gather, max_blocks) if all_gather else None,
                                          SymmemReduceScatter(group, max_blocks=max_blocks) if reduce_scatter else None))
        if ag is not None:
            module.set_custom_all_gather(ag)
        if rs is not None:
            module.set_custom_reduce_scatter(rs)
        changed += 1
    return changed


def check(group=None):
    """Raises the recorded failure (SymmemError naming the rank) of any symmem call FSDP made on
    `group` (default: the world group), on either of its communicators; never collective."""
    state = state_of(group)
    for purpose in (None, SymmemAllGather._purpose):
        comm = state.communicators.get(purpose)
        if comm is not None:
            comm.check()
