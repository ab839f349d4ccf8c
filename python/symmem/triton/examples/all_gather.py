"""All-gather in Triton on symmem's heap with an SM budget: a persistent grid of `programs`
programs (one SM each; Iris's comm_sms, symmem's max_blocks) walks the (peer, tile) pairs.

  pull: out (any CUDA tensor) [W * n] <- every rank's `inp` (symmetric), peers in the order
        rank+1, rank+2, ... (ranks do not all read one peer at once)
  push: every rank stores its `inp` (any CUDA tensor) into slot `rank` of every peer's `out`
        (symmetric)

    barrier 0   pull: every rank's input is written; push: every peer reached this call, so what
                read its `out` before (its stream) is done
    copy
    barrier 1   pull: no peer reads this rank's input any more; push: every store into this rank's
                `out` has landed
"""
import torch
import triton
import triton.language as tl

import symmem.triton as smt

from ._common import TAGS, dtype_name, group_communicator, require_heap, tile_elements


# Bytes each thread moves per tile: a program's loads in flight are what hides NVLink's latency
# from a small SM budget (16 bytes, one vector a thread, left a 16-program pull at a quarter of the
# CUDA pull's bandwidth on 2 x H200; 128 bytes, with the own slot riding along, 98-99 %).
BYTES_PER_THREAD = 128


@triton.jit(do_not_specialize=["signature", "rank"])
def all_gather_kernel(inp, out, n, heap_stride, table, sync, signature, rank, WORLD: tl.constexpr,
                      BLOCK: tl.constexpr, PUSH: tl.constexpr, TABLE: tl.constexpr):
    """TABLE: peers through `table` (every rank's copy of the symmetric operand, e.g. PyTorch's
    buffer_ptrs_dev) instead of symmem's heap stride."""
    epoch = smt.epoch_begin(sync)
    ok = smt.barrier(sync, signature, epoch, 0, rank, WORLD)
    if ok:
        tiles = tl.cdiv(n, BLOCK)
        t = tl.program_id(0)
        if PUSH or WORLD == 1:
            while t < tiles * WORLD:
                p = (rank + 1 + t // tiles) % WORLD  # this rank last: its peers are the slow part
                offsets = (t % tiles) * BLOCK + tl.arange(0, BLOCK)
                mask = offsets < n
                if PUSH:
                    if TABLE:
                        dst = smt.peer_from_table(out + rank * n + offsets, table, p, rank)
                    else:
                        dst = smt.peer(out + rank * n + offsets, p, rank, heap_stride)
                    tl.store(dst, tl.load(inp + offsets, mask=mask), mask=mask)
                else:
                    tl.store(out + p * n + offsets, tl.load(inp + offsets, mask=mask), mask=mask)
                t += tl.num_programs(0)
        else:
            # Pull: (peer, tile) pairs; the own slot's tile t rides along with pair t, its loads in
            # flight during the peer's round trip (as the CUDA pull's own-slot warps): copied after
            # the peers, it added a local pass to the NVLink time (70 % of the CUDA pull).
            while t < tiles * (WORLD - 1):
                p = (rank + 1 + t // tiles) % WORLD
                offsets = (t % tiles) * BLOCK + tl.arange(0, BLOCK)
                mask = offsets < n
                own_mask = mask & (t < tiles)  # the own slot's tile t: the same offsets as pair t's
                if TABLE:
                    src = smt.peer_from_table(inp + offsets, table, p, rank)
                else:
                    src = smt.peer(inp + offsets, p, rank, heap_stride)
                theirs = tl.load(src, mask=mask)
                mine = tl.load(inp + offsets, mask=own_mask)
                tl.store(out + p * n + offsets, theirs, mask=mask)
                tl.store(out + rank * n + offsets, mine, mask=own_mask)
                t += tl.num_programs(0)
        ok = smt.barrier(sync, signature, epoch, 1, rank, WORLD)
    smt.epoch_commit(sync, epoch)


def all_gather(inp, comm=None, out=None, programs=16, mode="pull", num_warps=16, block=None, table=None,
               bytes_per_thread=BYTES_PER_THREAD):
    """out[r * n:(r + 1) * n] = rank r's `inp` (n elements), with `programs` programs. Pull: `inp`
    symmetric (the same heap offset on every rank); push: `out` symmetric. `table`: an object with
    data_ptr() (a device array of every rank's copy of the symmetric operand, as PyTorch's
    buffer_ptrs_dev) to reach peers through it instead of symmem's heap (the synchronisation stays
    the communicator's). A tile is `block` elements, by default `bytes_per_thread` bytes for each of
    the num_warps * 32 threads. Returns out."""
    if mode not in ("pull", "push"):
        raise ValueError(f"all_gather: mode is 'pull' or 'push', not {mode!r}")
    from ...torch.device import core_of
    world = core_of(comm).local_world
    n = inp.numel()
    out = torch.empty(world * n, dtype=inp.dtype, device=inp.device) if out is None else out
    if out.numel() != world * n or out.dtype != inp.dtype:
        raise ValueError(f"all_gather: out holds {out.numel()} {out.dtype}, expected {world * n} {inp.dtype}")
    if table is None:
        require_heap(comm, inp if mode == "pull" else out, "inp" if mode == "pull" else "out", f"all_gather({mode})")
    block = block or tile_elements(num_warps, bytes_per_thread, inp.element_size())
    from ...torch.device import sync_context
    smt.launch(all_gather_kernel, programs, inp, out, n, comm=comm, name=f"all_gather_{mode}",
               shape=(n, dtype_name(inp)), table=table if table is not None else sync_context(comm), BLOCK=block,
               PUSH=mode == "push", TABLE=table is not None, num_warps=num_warps)
    return out


@torch.library.custom_op("symmem_triton::all_gather", mutates_args=(), tags=TAGS)
def _all_gather_op(inp: torch.Tensor, group_name: str, programs: int = 16) -> torch.Tensor:
    """Pull (inp symmetric); the result is a new tensor."""
    return all_gather(inp, group_communicator(group_name), programs=programs, mode="pull")


@_all_gather_op.register_fake
def _(inp, group_name, programs=16):
    world = torch.distributed.get_world_size(torch.distributed.distributed_c10d._resolve_process_group(group_name))
    return inp.new_empty(world * inp.numel())


@torch.library.custom_op("symmem_triton::all_gather_into", mutates_args=("out",), tags=TAGS)
def _all_gather_into_op(out: torch.Tensor, inp: torch.Tensor, group_name: str, programs: int = 16,
                        mode: str = "pull") -> None:
    """Pull (inp symmetric) or push (out symmetric) into `out`."""
    all_gather(inp, group_communicator(group_name), out=out, programs=programs, mode=mode)


@_all_gather_into_op.register_fake
def _(out, inp, group_name, programs=16, mode="pull"):
    return None
