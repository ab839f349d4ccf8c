"""symmem communicators of torch process groups: one per group, created on first use (a
collective call of the group's ranks), cached by group name as torch.ops.symm_mem caches its
group info, and built over the group's c10d Store."""
import os
import socket

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .. import communicator as core
from ..errors import SymmemError
from ._store_exchange import StoreExchange

_by_name = {}        # group name -> Communicator
_unavailable = {}    # group name -> why symmem cannot serve the group (the same on every rank)
_generations = {}    # ranks of a group -> communicators built for them so far (fresh store keys)


def _timeout_ms():
    return int(os.environ.get("SYMMEM_TIMEOUT_MS", "30000"))


def _node_identity():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


class Communicator:
    """The symmem communicator of a process group (default: the world group).

    ``Communicator(group)`` is collective the first time it is called for a group, then returns
    the cached instance. The ranks must be one process per GPU of one node, each on its
    ``torch.cuda.current_device()``; a group that spans nodes raises SymmemError(kUnsupported)
    (the torch.distributed-style functions fall back to torch.distributed for it).
    """

    def __new__(cls, group=None):
        if group is None:
            group = c10d._get_default_group()
        name = group.group_name
        comm = _by_name.get(name)
        if comm is not None:
            return comm
        if name in _unavailable:
            raise SymmemError("kUnsupported", _unavailable[name])
        comm = super().__new__(cls)
        comm._build(group)
        _by_name[name] = comm
        return comm

    def _build(self, group):
        self.group = group
        self.group_name = group.group_name
        self.rank = group.rank()
        self.world = group.size()
        self.device = torch.cuda.current_device()
        self.torch_device = torch.device("cuda", self.device)
        ranks = "_".join(str(r) for r in sorted(dist.get_process_group_ranks(group)))
        generation = _generations.get(ranks, 0)
        _generations[ranks] = generation + 1
        store = c10d.PrefixStore(f"symmem-{ranks}-{generation}", c10d._get_process_group_store(group))
        exchange = StoreExchange(store, self.rank, self.world, "x", _timeout_ms())
        nodes = exchange.all_gather(_node_identity().encode())
        if len(set(nodes)) != 1:
            reason = (f"process group {self.group_name!r} spans {len(set(nodes))} nodes; symmem serves the ranks of "
                      "one node (NVLink) only")
            _unavailable[self.group_name] = reason
            raise SymmemError("kUnsupported", reason)
        self.core = core.Communicator(self.rank, self.world, self.device, exchange)

    def close(self):
        """Collective: closes the communicator; its symmetric tensors and pool become invalid."""
        _by_name.pop(self.group_name, None)
        from . import memory
        memory._forget(self)
        self.core.close()

    def check(self):
        self.core.check()

    def describe(self, collective, out, inp, reduce_op="sum"):
        """The plan symmem would run for these tensors (nothing runs), e.g. 'all_reduce low_latency ...'."""
        from .ops import _dtype_code
        gather = collective == "all_gather"
        count = inp.numel() * inp.element_size() if gather else (out.numel() if collective == "reduce_scatter"
                                                               else inp.numel())
        dtype = _dtype_code(inp.dtype, collective, gather)
        return self.core.describe(collective, out.data_ptr(), inp.data_ptr(), count, dtype)


def communicator_of(group_name):
    """The Communicator of a group name (creating it, collectively, on first use)."""
    comm = _by_name.get(group_name)
    if comm is None:
        comm = Communicator(c10d._resolve_process_group(group_name))
    return comm


def unavailable_reason(group):
    """Why symmem cannot serve `group` (None when it can). Builds the communicator on first use."""
    if group is None:
        group = c10d._get_default_group()
    name = group.group_name
    if name in _by_name:
        return None
    if name in _unavailable:
        return _unavailable[name]
    try:
        Communicator(group)
        return None
    except SymmemError as e:
        _unavailable[name] = str(e)
        return str(e)


def close_all():
    """Collective over every group's ranks, in creation order: closes every symmem communicator."""
    for comm in list(_by_name.values()):
        comm.close()
