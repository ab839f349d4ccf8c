"""MoE dispatch / combine contexts for Python, with no torch dependency (include/symmem/ep.hpp):
device addresses and CUDA streams are integers here; symmem.torch.moe wraps them in tensors.

    ctx = EpContext(comm, num_experts=256, topk=8, hidden=7168, max_tokens_per_rank=128)
    ctx.dispatch(x, x_scales, topk_idx, topk_idx_int64, topk_weights, num_tokens, num_tokens_device, stream)
    ctx.received()  # device addresses of the receive area, counts, combine input
    ctx.combine(expert_out, out, weights_applied, topk_weights, stream)
"""
import ctypes
import re

from . import _native, errors
from ._native import lib

_ep_dispatch = _native.per_call("ep_dispatch")
_ep_combine = _native.per_call("ep_combine")

PAYLOADS = {"bfloat16": 0, "float8_e4m3": 1}  # symmem::EpPayload in declaration order
LAYOUTS = {"expert_major": 0, "rank_major": 1}  # symmem::EpLayout in declaration order


def _config_args(num_experts, topk, hidden, max_tokens_per_rank, payload, layout, max_tokens_per_expert,
                 max_received_rows, max_blocks):
    if payload not in PAYLOADS:
        raise errors.SymmemError(_native.ErrorCode.kInvalidArgument, f"payload {payload!r} is not one of {sorted(PAYLOADS)}")
    if layout not in LAYOUTS:
        raise errors.SymmemError(_native.ErrorCode.kInvalidArgument, f"layout {layout!r} is not one of {sorted(LAYOUTS)}")
    return (int(num_experts), int(topk), int(hidden), int(max_tokens_per_rank), PAYLOADS[payload], LAYOUTS[layout],
            int(max_tokens_per_expert), int(max_received_rows), int(max_blocks))


def memory(world, num_experts, topk, hidden, max_tokens_per_rank, payload="bfloat16", layout="expert_major",
           max_tokens_per_expert=0, max_received_rows=0, max_blocks=-1):
    """(heap bytes, local bytes) per rank that such a context allocates, before it does."""
    heap, local = ctypes.c_size_t(), ctypes.c_size_t()
    _native.check(lib.symmem_ep_memory(*_config_args(num_experts, topk, hidden, max_tokens_per_rank, payload, layout,
                                                     max_tokens_per_expert, max_received_rows, max_blocks),
                                       int(world), ctypes.byref(heap), ctypes.byref(local)))
    return heap.value, local.value


def blocks_for(comm, num_experts, topk, hidden, max_tokens_per_rank, payload="bfloat16", layout="expert_major",
               max_tokens_per_expert=0, max_received_rows=0, max_blocks=-1):
    """The blocks (SMs) such a context on `comm` would take (its blocks()): local, allocates nothing."""
    blocks = ctypes.c_int()
    comm._call(lib.symmem_ep_blocks_for(comm.handle, *_config_args(num_experts, topk, hidden, max_tokens_per_rank,
                                                                   payload, layout, max_tokens_per_expert,
                                                                   max_received_rows, max_blocks),
                                        ctypes.byref(blocks)))
    return blocks.value


class EpContext:
    """A dispatch / combine context of a symmem.communicator.Communicator (collective creation)."""

    def __init__(self, comm, num_experts, topk, hidden, max_tokens_per_rank, payload="bfloat16",
                 layout="expert_major", max_tokens_per_expert=0, max_received_rows=0, max_blocks=-1):
        self._comm = comm  # keeps the communicator alive
        self.payload, self.layout = payload, layout
        handle = ctypes.c_void_p()
        comm._call(lib.symmem_ep_create(comm.handle, *_config_args(num_experts, topk, hidden, max_tokens_per_rank,
                                                                   payload, layout, max_tokens_per_expert,
                                                                   max_received_rows, max_blocks),
                                        ctypes.byref(handle)))
        self._handle = handle.value

    @property
    def handle(self):
        if self._handle is None:
            raise errors.SymmemError(_native.ErrorCode.kInvalidArgument, "the EP context was destroyed")
        return self._handle

    def received(self):
        """Device addresses: dict of x, x_scales, topk_idx, topk_weights, expert_num_tokens, num_rows,
        combine_input (0 where the layout or payload has none), and rows."""
        ptrs = [ctypes.c_void_p() for _ in range(7)]
        rows = ctypes.c_size_t()
        self._comm._call(lib.symmem_ep_received(self.handle, *[ctypes.byref(p) for p in ptrs], ctypes.byref(rows)))
        names = ("x", "x_scales", "topk_idx", "topk_weights", "expert_num_tokens", "num_rows", "combine_input")
        result = {n: (p.value or 0) for n, p in zip(names, ptrs)}
        result["rows"] = rows.value
        return result

    def dispatch(self, x, x_scales, topk_idx, topk_idx_int64, topk_weights, num_tokens, num_tokens_device, stream):
        rc = _ep_dispatch(self._handle, x, x_scales, topk_idx, int(topk_idx_int64), topk_weights, int(num_tokens),
                          num_tokens_device, stream)
        if rc:
            self._comm._call(rc)

    def combine(self, expert_out, out, weights_applied, topk_weights, stream):
        rc = _ep_combine(self._handle, expert_out, out, int(weights_applied), topk_weights, stream)
        if rc:
            self._comm._call(rc)

    def blocks(self):
        """The blocks (SMs) dispatch and combine take: max_blocks, or the library's choice (-1)."""
        if not hasattr(lib, "symmem_ep_blocks"):  # an older library (A/B runs): its description says
            return int(re.search(r"blocks=(\d+)", self.describe()).group(1))
        blocks = ctypes.c_int()
        self._comm._call(lib.symmem_ep_blocks(self.handle, ctypes.byref(blocks)))
        return blocks.value

    def describe(self):
        text = ctypes.create_string_buffer(512)
        self._comm._call(lib.symmem_ep_describe(self.handle, text, len(text)))
        return text.value.decode()

    def close(self, memory_lent=False):
        """Collective: releases the context's heap buffers, unless a CUDA graph that captured a call
        may still replay or some rank says `memory_lent` (it still holds objects over the context's
        memory): then every rank keeps them until the communicator closes. The context takes no more
        calls; its local scratch (the counts) lives until destroy()."""
        self._comm._call(lib.symmem_ep_close_lent(self.handle, int(bool(memory_lent))))

    def destroy(self):
        """Local: frees the context's local scratch; its heap buffers stay with the communicator
        (until close() releases them, or the communicator closes)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            lib.symmem_ep_destroy(handle)
