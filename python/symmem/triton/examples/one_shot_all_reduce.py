"""One-shot all-reduce in Triton on symmem's heap: every rank reads every peer's input (a symmetric
tensor) and sums in fp32 in rank order 0..W-1, so that every rank gets the bit-identical result
symmem's CUDA one-shot gives (src/device/reduce.cuh).

    barrier 0   every rank's input is written (entry: the peers reached this call)
    sum         out[i] = in_0[i] + in_1[i] + ... read through peer()
    barrier 1   no peer reads this rank's input any more (the caller may overwrite it)
"""
import torch
import triton
import triton.language as tl

import symmem.triton as smt

from ._common import ACCUMULATE, TAGS, dtype_name, group_communicator, require_heap, tile_elements

# The default grid: a tile of BYTES_PER_THREAD a thread, at most MAX_PROGRAMS programs (each
# program's tiles are summed one after the other: fewer programs, more NVLink round trips). Swept on
# 2 x H200 from graphs (symmem.bench.torch --triton-grids, scripts/gpu_run.sh triton_all_reduce_grids): 64 x 32 B
# was the fastest grid at every vLLM size, 8.72 us at 0.5 MiB against 9.40 for 24 x 64 B and 9.86
# for the old 24 x 16 B.
BYTES_PER_THREAD = 32
MAX_PROGRAMS = 64


@triton.jit(do_not_specialize=["signature", "rank"])
def one_shot_all_reduce_kernel(inp, out, n, heap_stride, sync, signature, rank, WORLD: tl.constexpr,
                               BLOCK: tl.constexpr, ACC: tl.constexpr):
    pid = tl.program_id(0)
    epoch = smt.epoch_begin(sync)
    ok = smt.barrier(sync, signature, epoch, 0, rank, WORLD)
    if ok:
        start = pid * BLOCK
        while start < n:
            offsets = start + tl.arange(0, BLOCK)
            mask = offsets < n
            acc = tl.load(smt.peer(inp + offsets, 0, rank, heap_stride), mask=mask).to(ACC)
            for p in tl.static_range(1, WORLD):
                acc += tl.load(smt.peer(inp + offsets, p, rank, heap_stride), mask=mask).to(ACC)
            tl.store(out + offsets, acc.to(out.dtype.element_ty), mask=mask)
            start += tl.num_programs(0) * BLOCK
        ok = smt.barrier(sync, signature, epoch, 1, rank, WORLD)
    smt.epoch_commit(sync, epoch)


def one_shot_all_reduce(inp, comm=None, out=None, programs=None, num_warps=16, block=None,
                        bytes_per_thread=BYTES_PER_THREAD, max_programs=MAX_PROGRAMS):
    """out = sum over ranks of `inp` (a contiguous symmetric tensor of `comm`'s communicator: the
    same heap offset on every rank); `out` may be any CUDA tensor of inp's shape and dtype (not
    `inp`). `programs`: the grid (default: enough for the size, at most `max_programs`); a tile is
    `block` elements, by default `bytes_per_thread` bytes for each of the num_warps * 32 threads."""
    if dtype_name(inp) not in ACCUMULATE:
        raise TypeError(f"one_shot_all_reduce: {inp.dtype} is not summed (float32, float16, bfloat16, int32)")
    require_heap(comm, inp, "inp", "one_shot_all_reduce")
    out = torch.empty_like(inp) if out is None else out
    if out.data_ptr() == inp.data_ptr():
        raise ValueError("one_shot_all_reduce: out must not be inp (peers read inp while out is written)")
    n = inp.numel()
    block = block or tile_elements(num_warps, bytes_per_thread, inp.element_size())
    programs = programs or max(1, min(max_programs, triton.cdiv(n, block)))
    smt.launch(one_shot_all_reduce_kernel, programs, inp, out, n, comm=comm, name="one_shot_all_reduce",
               shape=(n, dtype_name(inp)), BLOCK=block, ACC=ACCUMULATE[dtype_name(inp)], num_warps=num_warps)
    return out


@torch.library.custom_op("symmem_triton::one_shot_all_reduce", mutates_args=(), tags=TAGS)
def _one_shot_all_reduce_op(inp: torch.Tensor, group_name: str) -> torch.Tensor:
    return one_shot_all_reduce(inp, group_communicator(group_name))


@_one_shot_all_reduce_op.register_fake
def _(inp, group_name):
    return torch.empty_like(inp)
