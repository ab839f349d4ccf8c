"""symmem communicators of torch process groups, and the one owner of everything they lend.

One GroupState per live process group. On the group's first symmem call it builds the group's
communicator (collective over the group's ranks, through the group's c10d Store: no port or token
of its own); it owns everything the group's communicators lend in Python: symmetric tensors
(memory.empty), the MemPool, FSDP's buffers, the fused ops' workspaces. Every entry point reaches
a group's state through ``state_of``, the one walk from a group argument (a ProcessGroup, its name,
or None) to its state. The state lives and dies with the group:

- A group that is gone (its Python object died, or torch.distributed no longer knows it after
  ``destroy_process_group``), re-created under its name, or closed (``close``, ``close_all``) retires
  its state: nothing is lent from it again and every later call takes the new group's state.
- A call on a destroyed group (its object, or its name) is refused (``state_of``: SymmemError, a
  DistBackendError, as ProcessGroupNCCL refuses it), also where torch.distributed would serve it
  (gloo runs collectives on a destroyed group).
- A retired communicator releases its memory (locally: unmapping needs no peer, whose own mappings
  keep the memory alive for it) only once nothing may still use it: no tensor over its heap alive,
  no CUDA graph that captured one of its calls, no segment of its pool in use; the release
  synchronises the device first, so no call is in flight. Until then it stays mapped.
- Local memory of an object closed while tensors it lent still live (an ExpertParallel's counts)
  is held by its communicator (``hold``) and released at the same points, once those tensors are
  gone and no CUDA graph of the communicator lives; never at garbage collection (which may run
  inside a graph capture, where freeing is forbidden).
- Why a communicator could not be built is remembered with the group (every rank falls back
  alike), never with its name: a group made again under the name starts afresh.

Retired communicators are released at the next communicator built, at ``close``/``close_all``,
when a group object dies, and at ``release_unused()``; never during CUDA graph capture.
"""
import datetime
import logging
import os
import sys
import weakref

import torch
import torch.distributed.distributed_c10d as c10d

from .. import _native, errors
from .. import communicator as core
from . import _route, pools
from ._store_exchange import StoreExchange

log = logging.getLogger("symmem")

_states = {}        # group name -> GroupState of a live group
_by_id = {}         # id(group object) -> GroupState: state_of's cache (verified by identity)
_retired = []       # GroupCommunicators retired but not released: something may still use their memory
_generations = {}   # group name # purpose -> communicators built under it so far (fresh store keys)
_releasing = False  # release_unused is running (a garbage collection may call it again inside)


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


def capturing():
    """Whether the current stream is capturing a CUDA graph (False on a machine without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def state_of(group=None):
    """The GroupState of `group` (a ProcessGroup, its name, or None for the default group): the one
    way every entry point resolves a group, made on first use, never collective. First the cache
    (cached_state: dict reads and an identity check); else the walk: the ProcessGroup, refused
    where a call may not run on it (_resolve), then its state by name: a state of a group gone or
    replaced under its name is retired and a new one made."""
    state = cached_state(group)
    if state is not None:
        return state
    g = _resolve(group)
    state = _states.get(g.group_name)
    if state is None or not _alive(state, g):
        if state is not None:
            state.retire()
        state = GroupState(g)
        _states[g.group_name] = state
        release_unused()
    _by_id[id(g)] = state
    return state


def cached_state(group):
    """state_of's first step, and the whole of the drop-ins' fast path: the state of `group` (None:
    the default group) if one was made for this very group object (or, for a name, for the group
    that bears it), is not retired, and torch.distributed still knows the group (its registry, a
    dict, holds the object until destroy_process_group); else None, and state_of walks on. Dict
    reads and an identity check, never collective, never a refusal."""
    g = c10d.GroupMember.WORLD if group is None else group
    state = _by_id.get(id(g))
    if state is not None and not state.closed and state.group_ref() is g and g in c10d._pg_names:
        return state
    if isinstance(group, str):
        state = _states.get(group)
        if state is not None and not state.closed and state.group_ref() in c10d._pg_names:
            return state
    return None


def group_name_of(group=None):
    """The name of `group`, for the Python functions that call an op by it: state_of's (a group a
    call may not run on is refused). While torch.compile traces (it cannot trace state_of's cache),
    the name c10d gives, a constant of the graph: the op resolves it, and refuses, when it runs."""
    if torch.compiler.is_compiling():
        return group if isinstance(group, str) else (c10d._get_default_group() if group is None else group).group_name
    return state_of(group).name


def _resolve(group):
    """The ProcessGroup of `group`: a ProcessGroup, its name, or None for the default (world) group.
    A group torch.distributed no longer knows (destroy_process_group), or a name no live group has,
    is refused with a SymmemError (a DistBackendError, what ProcessGroupNCCL raises for a collective
    on a destroyed group), whatever would serve the call; so is a default group that was never made
    or was destroyed (ValueError, as torch.distributed), and a group this rank is not in."""
    if group is None:
        return c10d._get_default_group()
    if isinstance(group, str):
        try:
            return c10d._resolve_process_group(group)
        except RuntimeError:  # "Could not resolve the process group registered under the name ..."
            raise _gone(group) from None
    if c10d._rank_not_in_group(group):
        raise ValueError("symmem: this rank is not a member of the group (torch.distributed.new_group gave it "
                         "GroupMember.NON_GROUP_MEMBER)")
    if group not in c10d._pg_names:  # c10d's own registry of live groups
        raise _gone(group.group_name)
    return group


def _gone(name):
    """The refusal of a call on a group torch.distributed no longer knows; what symmem held for it is
    retired (and released once nothing uses it)."""
    release_unused()
    return errors.SymmemError(_native.ErrorCode.kInvalidArgument,
                              f"symmem: process group {name!r} was destroyed (torch.distributed.destroy_process_group) "
                              "or is not registered with torch.distributed; no collective runs on it")


def _alive(state, group):
    """Whether `state` is the live state of `group` (torch reuses names and ids of dead groups)."""
    return not state.closed and state.group_ref() is group and group in c10d._pg_names


def _on_group_death(_ref):
    """A group's Python object died (destroy_process_group, with no reference left): retire its state
    and release what nothing uses any more. (A weakref callback: what it raises would only be printed.)"""
    if sys is None or sys.is_finalizing():  # (module globals may be None at interpreter shutdown)
        return  # the process is ending: the core's destructors release what is left
    try:
        for state in list(_states.values()):
            if state.group_ref() is None:
                state.retire()
        release_unused()
    except Exception:  # noqa: BLE001
        log.exception("symmem: releasing the communicators of a destroyed group failed")


def release_unused() -> None:
    """Retires the states of groups torch.distributed no longer knows, and releases the memory of
    every retired communicator that nothing may use any more, and what live communicators hold for
    closed objects whose tensors are gone (module docstring). Local; skipped
    during CUDA graph capture on this thread (the core releases in relaxed capture mode, so a
    capture on another thread is not disturbed)."""
    global _releasing
    if _releasing:
        return
    _releasing = True
    try:
        for state in list(_states.values()):
            g = state.group_ref()
            if state.closed or g is None or g not in c10d._pg_names:
                state.retire()
        if capturing():
            return
        for state in list(_states.values()):
            for comm in list(state.communicators.values()):
                comm._release_held()  # (a retired one releases what it holds with itself)
        for comm in list(_retired):
            if comm in _retired and comm._releasable():
                _retired.remove(comm)
                comm._release()
    finally:
        _releasing = False


def close_all() -> None:
    """Closes every group's communicators (each rank releases its own side once nothing uses it)."""
    for state in list(_states.values()):
        state.retire()
    release_unused()


class GroupState:
    """What symmem holds for one live process group: its communicators (the group's own and one per
    ``purpose``) and, through them, every buffer they lend."""

    def __init__(self, group):
        self.name = group.group_name
        self.group_ref = weakref.ref(group, _on_group_death)
        self.rank = group.rank()
        self.world = group.size()
        self.communicators = {}  # purpose (None: the group's own) -> GroupCommunicator
        self.failures = {}       # purpose -> why its communicator could not be built (the same on every rank)
        self.closed = False

    @property
    def group(self):
        """The ProcessGroup (None once its object died)."""
        return self.group_ref()

    def communicator(self, purpose=None):
        """The communicator for `purpose` (built on first use: collective over the group's ranks)."""
        comm = self.communicators.get(purpose)
        if comm is not None:
            return comm
        if self.closed:
            raise errors.SymmemError(_native.ErrorCode.kAborted, f"symmem: the state of group {self.name!r} was closed")
        failure = self.failures.get(purpose, self.failures.get(None))
        if failure is not None:
            raise errors.SymmemError(_native.ErrorCode.kUnsupported, failure)
        group = self.group
        if group is None:
            raise errors.SymmemError(_native.ErrorCode.kAborted, f"symmem: group {self.name!r} was destroyed")
        try:
            comm = GroupCommunicator._build(self, group, purpose)
        except errors.SymmemError as e:
            self.failures[purpose] = str(e)
            raise
        self.communicators[purpose] = comm
        return comm

    def unavailable_reason(self, purpose=None):
        """Why symmem cannot serve this group (for `purpose`), or None; builds the communicator on
        first use (collective)."""
        if purpose not in self.communicators:
            try:
                self.communicator(purpose)
            except errors.SymmemError as e:
                return str(e)
        return None

    def retire(self):
        """Nothing is lent from this group's communicators again; each is released once nothing uses it."""
        if self.closed:
            return
        self.closed = True
        if _states.get(self.name) is self:
            del _states[self.name]
        for key, state in list(_by_id.items()):
            if state is self:
                del _by_id[key]
        for comm in self.communicators.values():
            comm._retire()
            _retired.append(comm)


class GroupCommunicator:
    """The symmem communicator of a process group (default: the world group; a ProcessGroup or its
    name).

    ``GroupCommunicator(group)`` is collective the first time it is called for a group, then returns
    the cached instance. The ranks are one process per GPU, each on its
    ``torch.cuda.current_device()``. ``purpose`` names a second communicator of the same group, with
    state of its own, for calls on a stream unordered with the group's other symmem calls (FSDP2's
    all-gathers beside its reduce-scatters): calls of one communicator run in host order, whatever
    their streams (a stream change is joined with an event). A group that spans nodes gets a
    communicator of several nodes (``nodes > 1``): all_gather runs hierarchically (NCCL between
    nodes, copy engines inside each); the torch.distributed-style reductions fall back to
    torch.distributed for it.
    """

    _held = ()  # (release, spans) of closed objects (hold)

    def __new__(cls, group=None, purpose=None):
        return state_of(group).communicator(purpose)

    @classmethod
    def _build(cls, state, group, purpose):
        self = object.__new__(cls)
        self.state = state
        self.purpose = purpose
        self.key = state.name if purpose is None else f"{state.name}#{purpose}"
        self.group_name = state.name
        self.rank = state.rank
        self.world = state.world
        self.closed = False
        self.workspaces = {}  # name -> (ptr, bytes): the fused ops' growable workspaces
        self.lenders = {}     # FSDP's buffers, by lender name
        self.pool_slot = None  # pools.py: the pool allocator's slot and the MemPool over it
        self.pool = None
        self.final_failure = None  # the recorded failure when it closed (Work reads it after release)
        self._spans = weakref.WeakSet()  # memory it lent that tensors still reference (memory.lent_tensor)
        if capturing():
            raise RuntimeError(f"symmem: the communicator of group {self.group_name!r} is built on its first call, "
                               "which cannot be inside CUDA graph capture; make one call (or symmem.torch."
                               "GroupCommunicator(group)) before capturing")
        # Store keys of their own per group name and purpose (and generation, for names torch
        # reuses): groups of the same ranks may build their communicators in any order.
        generation = _generations.get(self.key, 0)
        _generations[self.key] = generation + 1
        store = c10d.PrefixStore(f"symmem-{self.key}-{generation}", c10d._get_process_group_store(group))
        timeout_ms = _creation_timeout_ms()
        exchange = StoreExchange(store, self.rank, self.world, "x", timeout_ms,
                                 what=f"building the symmem communicator of group {self.group_name!r}")
        # Which ranks share a node is the core's decision (LOCAL_WORLD_SIZE for the world group,
        # host names for others, SYMMEM_NODE_SIZE to simulate nodes), taken alike on every rank.
        failure, built = None, None
        try:
            if not torch.cuda.is_available():
                raise errors.SymmemError(_native.ErrorCode.kUnsupported, "no CUDA GPU is available to this process")
            self.device = torch.cuda.current_device()
            self.torch_device = torch.device("cuda", self.device)
            built = core.Communicator(self.rank, self.world, self.device, exchange)
        except errors.SymmemError as e:
            failure = e
        why = _agree_on_outcome(store, self.rank, self.world,
                                "ok" if failure is None else f"rank {self.rank}: {failure}", timeout_ms)
        if why is not None:
            if built is not None:
                built.destroy()
            # Every rank raises the same reason, so every rank falls back (or fails) alike.
            raise errors.SymmemError(failure.code if failure is not None else _native.ErrorCode.kBootstrap,
                                     f"symmem communicator of group {self.group_name!r} not built: {why}") from failure
        self.core = built
        self.nodes = built.nodes
        log.debug("symmem: built the communicator %s (rank %d of %d, %d nodes)", self.key, self.rank, self.world,
                  self.nodes)
        return self

    @property
    def group(self):
        """The ProcessGroup (None once it is gone)."""
        return self.state.group

    def check(self) -> None:
        """Raises the recorded failure (SymmemError naming the rank) of any earlier call; never collective."""
        self.core.check()

    def close(self) -> None:
        """Closes the group's communicators: nothing is lent from them again, the next call on the group
        builds new ones, and their memory is released once nothing uses it (tensors over it, graphs
        that captured a call, pool segments). Every rank should call it."""
        self.state.retire()
        release_unused()

    def failure(self):
        """The recorded failure of an earlier call (a SymmemError naming the rank), or None; also after
        the communicator was closed and released."""
        if self.closed:
            return self.final_failure
        try:
            self.core.check()
        except errors.SymmemError as e:
            return e
        return None

    def describe(self, collective, out, inp):
        """The plan symmem would run for these tensors (nothing runs), e.g. 'all_reduce low_latency ...'."""
        return _route.describe(self, collective, out, inp)

    def workspace(self, name, nbytes):
        """A heap workspace of at least `nbytes` for `name` (symmetric). Growing it is collective (every
        rank makes the same calls, so every rank grows alike) and never frees the old one, which a
        CUDA graph may reference: it grows in steps of 32 MiB."""
        ws = self.workspaces.get(name)
        if ws is not None and ws[1] >= nbytes:
            return ws[0]
        if capturing():
            raise RuntimeError(f"symmem: the {name} workspace of group {self.group_name!r} holds "
                               f"{ws[1] if ws else 0} bytes, {nbytes} needed; growing it is collective and cannot run "
                               "during CUDA graph capture: make one eager call of the largest shape first")
        self._ensure_open()
        step = 32 << 20
        nbytes = (nbytes + step - 1) // step * step
        ptr = self.core.allocate(nbytes)
        self.workspaces[name] = (ptr, nbytes)
        return ptr

    def hold(self, release, spans):
        """Keeps local memory of an object closed while tensors over it live: `release()` frees it
        (locally) once `spans` (a WeakSet of those tensors' spans, memory.lent_tensor) is empty and
        no CUDA graph of the communicator lives, at release_unused's points or the communicator's
        release; never at garbage collection. Never collective."""
        self._held = [*self._held, (release, spans)]

    def _release_held(self, everything=False):
        kept = []
        for release, spans in self._held:
            if everything or (not spans and self.core.live_graphs == 0):
                release()
            else:
                kept.append((release, spans))
        self._held = kept

    def _ensure_open(self):
        if self.closed:
            raise errors.SymmemError(_native.ErrorCode.kAborted,
                                     f"symmem: the communicator {self.key!r} was closed (its group was closed, "
                                     "destroyed or made again); take the group's current one")

    def _retire(self):
        self.final_failure = self.failure()
        self.closed = True
        self.lenders.clear()     # FSDP's views of lent buffers keep their memory until they die
        self.workspaces.clear()
        pools.unbind(self)

    def _releasable(self):
        return not self._spans and self.core.live_graphs == 0 and not pools.in_use(self)

    def _release(self):
        """Local release: what it holds for closed objects, then the core, which synchronises the device
        first (in relaxed capture mode) and unmaps. Only once _releasable: no tensor over its memory."""
        log.debug("symmem: releasing the communicator %s", self.key)
        self._release_held(everything=True)
        self.core.destroy()
