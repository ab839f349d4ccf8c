"""symmem communicators of torch process groups: one per group, created on first use (a
collective call of the group's ranks), cached by group name as torch.ops.symm_mem caches its
group info, and built over the group's c10d Store."""
import datetime
import os

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from .. import communicator as core
from ..errors import SymmemError
from ._store_exchange import StoreExchange

_by_name = {}        # group name -> Communicator
_by_argument = {}    # a group argument of the drop-ins (None: the world) -> Communicator, a cache of
                     # _by_name that saves the name lookup (0.5 us per call); cleared with it
_unavailable = {}    # group name -> why symmem cannot serve the group (the same on every rank)
_generations = {}    # ranks of a group -> communicators built for them so far (fresh store keys)


def _creation_timeout_ms():
    """Ranks reach a group's first symmem call at different times (compilation, checkpoint
    loading), so building the communicator waits longer than a collective: at least 5 minutes."""
    return max(int(os.environ.get("SYMMEM_TIMEOUT_MS", "30000")), 300_000)


def _agree_on_outcome(store, rank, world, mine, timeout_ms):
    """Every rank's creation outcome ('ok' or why not), under keys of their own, so that all ranks
    raise together or none does; a rank that never reports counts as a failure."""
    store.set(f"outcome/{rank}", mine)
    keys = [f"outcome/{r}" for r in range(world)]
    try:
        store.wait(keys, datetime.timedelta(milliseconds=timeout_ms))
    except Exception:  # noqa: BLE001 (a store timeout; which ranks is what matters)
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        return f"ranks {missing} never finished building the communicator"
    for r, key in enumerate(keys):
        theirs = store.get(key).decode(errors="replace")
        if theirs != "ok":
            return theirs if r != rank else mine
    return None


def group_name_of(group):
    """The name of `group`, or of the default (world) group for None."""
    return (group if group is not None else c10d._get_default_group()).group_name


def existing(group):
    """The communicator already made for `group`, or None (never collective)."""
    return _by_name.get(group_name_of(group))


class Communicator:
    """The symmem communicator of a process group (default: the world group).

    ``Communicator(group)`` is collective the first time it is called for a group, then returns
    the cached instance. The ranks are one process per GPU, each on its
    ``torch.cuda.current_device()``. ``purpose`` names a second communicator of the same group,
    with state of its own, for calls that run on a stream unordered with the group's other symmem
    calls (FSDP2's all-gathers beside its reduce-scatters): one communicator takes one call at a
    time. A group that spans nodes gets a communicator of several nodes
    (``nodes > 1``): all_gather runs hierarchically (NCCL between nodes, copy engines inside each);
    the torch.distributed-style reductions fall back to torch.distributed for it.
    """

    def __new__(cls, group=None, purpose=None):
        if group is None:
            group = c10d._get_default_group()
        name = group.group_name
        key = name if purpose is None else f"{name}#{purpose}"
        comm = _by_name.get(key)
        if comm is not None and comm.group is group:
            return comm
        if comm is not None:
            # torch reused the name of a destroyed group (destroy_process_group, then new groups):
            # the cached communicator is another group's. It cannot be closed (close is collective
            # over a group that no longer exists); it is forgotten and a new one is built.
            _by_name.pop(key)
            _by_argument.clear()
        if name in _unavailable:
            raise SymmemError("kUnsupported", _unavailable[name])
        comm = super().__new__(cls)
        comm._build(group)
        comm.key = key
        _by_name[key] = comm
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
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"symmem: the communicator of group {self.group_name!r} is built on its first call, "
                               "which cannot be inside CUDA graph capture; make one call (or symmem.torch."
                               "Communicator(group)) before capturing")
        store = c10d.PrefixStore(f"symmem-{ranks}-{generation}", c10d._get_process_group_store(group))
        timeout_ms = _creation_timeout_ms()
        exchange = StoreExchange(store, self.rank, self.world, "x", timeout_ms,
                                 what=f"building the symmem communicator of group {self.group_name!r}")
        # Which ranks share a node is the core's decision (LOCAL_WORLD_SIZE for the world group,
        # host names for others, SYMMEM_NODE_SIZE to simulate nodes), taken alike on every rank.
        failure, built = None, None
        try:
            built = core.Communicator(self.rank, self.world, self.device, exchange)
        except SymmemError as e:
            failure = e
        why = _agree_on_outcome(store, self.rank, self.world,
                                "ok" if failure is None else f"rank {self.rank}: {failure}", timeout_ms)
        if why is not None:
            if built is not None:
                built.destroy()
            # Every rank raises the same reason, so every rank falls back (or fails) alike.
            raise SymmemError(failure.code if failure is not None else "kBootstrap",
                              f"symmem communicator of group {self.group_name!r} not built: {why}") from failure
        self.core = built
        self.nodes = built.nodes

    def close(self):
        """Collective: closes the communicator; its symmetric tensors and pool become invalid."""
        _by_name.pop(self.key, None)
        _by_argument.clear()
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
    name = group_name_of(group)
    comm = _by_name.get(name)
    if comm is not None and comm.group is (group if group is not None else c10d._get_default_group()):
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
