"""Symmetric tensors as kernels see them (docs/kernels.md): a handle with every rank's copy (as
tensors and as a device table of addresses), the signal pads, the heap stride and the node's rank
and world; and the communicator's sync context as an int64 device tensor, for symmem.triton.

    h = symmem.torch.device.handle(x)        # x from symmem.torch.empty (or inside such a buffer)
    h.peer_tensors[p]                        # rank p's copy of x, as a tensor (copy_() runs on copy engines)
    h.ptr_table, h.pad_table                 # int64 CUDA tensors [world]: addresses of the copies / pads
    h.heap_stride                            # peer p's copy of any heap address a is a + (p - rank) * stride

Everything here is local (no collective) and comes from the C ABI (symmem.device).
"""
import weakref
from dataclasses import dataclass

import torch

from .. import device as _device
from ..communicator import Communicator as _CoreCommunicator
from .groups import GroupCommunicator
from .memory import heap_tensor

_sync_tensors = weakref.WeakKeyDictionary()  # core communicator -> its sync-context tensor


def _owner_of(comm):
    """What heap tensors of `comm` hold on to: a GroupCommunicator (its memory stays mapped while
    they live; from itself or a process group, None: the world group), or a core communicator
    (symmem.communicator.Communicator, e.g. ranks built through the C ABI) as given."""
    if isinstance(comm, _CoreCommunicator) or getattr(comm, "core", None) is not None:
        return comm
    return GroupCommunicator(comm)


def core_of(comm=None):
    """The symmem.communicator.Communicator behind `comm`: itself, a GroupCommunicator (its .core),
    or a process group (None: the world group)."""
    owner = _owner_of(comm)
    return owner if isinstance(owner, _CoreCommunicator) else owner.core


def _ensure_open(owner):
    if not isinstance(owner, _CoreCommunicator):
        owner._ensure_open()  # a closed group's communicator lends nothing more


def sync_context(comm=None):
    """The communicator's sync context (symmem.device.sync_words) as an int64 tensor on its device,
    made once per communicator; symmem.triton.launch passes it to kernels as `sync`."""
    return _sync_of(core_of(comm))[0]


def _sync_of(core):
    """(the sync-context tensor, the symmem.device.SyncContext it holds) of a core communicator."""
    entry = _sync_tensors.get(core)
    if entry is None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("symmem.triton: the communicator's sync context is made on its first user kernel, "
                               "which cannot be inside CUDA graph capture; launch once (or call "
                               "symmem.torch.device.sync_context) before capturing")
        context = _device.sync_context(core)
        tensor = torch.tensor(_device.sync_words(context), dtype=torch.int64, device=torch.device("cuda", core.device))
        entry = _sync_tensors[core] = (tensor, context)
    return entry


@dataclass(frozen=True)
class TensorHandle:
    """A symmetric tensor on this rank, as a kernel sees it."""
    tensor: torch.Tensor
    rank: int                  # in the node: the index of the peers
    world: int                 # ranks of the node
    heap_stride: int           # bytes: rank p's copy of heap address a is a + (p - rank) * heap_stride
    peer_tensors: tuple        # rank p's copy of `tensor`, as a tensor (same shape and dtype)
    ptr_table: torch.Tensor    # int64 [world]: address of rank p's copy of `tensor`
    pad_table: torch.Tensor    # int64 [world]: address of rank p's signal pad (uint32 words)
    signal_pad: torch.Tensor   # this rank's signal pad, int32 [pad_words], zeroed at allocation
    pad_words: int
    buffer: _device.DeviceHandle  # the whole heap buffer holding `tensor`


def handle(tensor, comm=None):
    """The TensorHandle of `tensor`, a contiguous CUDA tensor inside one heap buffer of `comm`'s
    communicator (a symmetric tensor of symmem.torch.empty, or a view into one at the same offset
    on every rank). Local. Its peer tensors keep the heap mapped as symmem.torch.empty's do."""
    owner = _owner_of(comm)
    _ensure_open(owner)
    core = core_of(owner)
    if not tensor.is_cuda or not tensor.is_contiguous():
        raise ValueError("symmem.torch.device.handle: the tensor must be a contiguous CUDA tensor")
    nbytes = max(tensor.numel() * tensor.element_size(), 1)
    found = core.buffer_of(tensor.data_ptr(), nbytes)
    if found is None:
        raise ValueError(f"symmem.torch.device.handle: the tensor at {tensor.data_ptr():#x} ({nbytes} bytes) is not "
                         "inside one heap buffer of the communicator (make it with symmem.torch.empty)")
    buffer = _device.buffer_device_handle(core, found[0])
    offset = tensor.data_ptr() - buffer.local

    def view(address, numel, dtype, shape):
        raw = heap_tensor(owner, address, numel * torch.empty((), dtype=dtype).element_size())
        return raw.view(dtype).view(shape)

    device = torch.device("cuda", core.device)
    peers = tuple(view(base + offset, tensor.numel(), tensor.dtype, tensor.shape) for base in buffer.peers)
    return TensorHandle(
        tensor=tensor, rank=buffer.rank, world=buffer.world, heap_stride=buffer.heap_stride, peer_tensors=peers,
        ptr_table=torch.tensor([base + offset for base in buffer.peers], dtype=torch.int64, device=device),
        pad_table=torch.tensor(list(buffer.peer_signal_pads), dtype=torch.int64, device=device),
        signal_pad=view(buffer.signal_pad, buffer.signal_pad_words, torch.int32, (buffer.signal_pad_words,)),
        pad_words=buffer.signal_pad_words, buffer=buffer)
