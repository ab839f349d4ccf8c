"""All-gather + matmul in Triton, fed by symmem's copy-engine pieces: c = all_gather(a_shard) @ b.

symmem gathers (symmem.device.all_gather_pieces, the gather half of its CUTLASS all_gather_matmul):
this rank's shard goes into its slot of the symmetric `gathered` on the caller's stream, and the
peers' shards are pulled on the copy engines (zero SMs), piece by piece, each piece announced by a
flag in this rank's memory. Meanwhile a persistent Triton GEMM with TMA loads (the tma_persistent
tutorial's structure, the recipes' and kraken's fused kernel) computes the tiles:

  for each tile (own shard's rows first, then rank+1's, ...: the order the copies land)
      wait for the flags of the pieces holding its rows   (bounded: a dead peer is named, never a hang)
      fence.proxy.async.global                            (the acquire is the generic proxy's; TMA is the async proxy)
      for k: TMA-load A and B tiles, wgmma                 (the software-pipelined loop: no wait inside)
      TMA-store the C tile

The waits sit in the outer tile loop, which is not pipelined, so no TMA load of a tile is issued
before that tile's wait (test_triton_ptx checks the PTX: a proxy fence on every path from a flag's
acquire to a TMA load).

    python -m symmem.triton.examples.all_gather_matmul --world1-vs-mm --csv out.csv
measures it at world 1 against torch.mm (K=16384, N=6656, M=4096/8192/16384).
"""
import argparse
import datetime
import statistics

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import symmem.triton as smt

from ._common import TAGS, dtype_name, group_communicator, require_heap

# (BM, BN, BK, STAGES, num_warps, EPILOGUE_SUBTILE): the first is the default; --world1-vs-mm tries all.
CONFIGS = [(128, 256, 64, 3, 8, True), (128, 256, 64, 4, 8, True), (128, 128, 64, 4, 8, False),
           (256, 128, 64, 3, 8, True)]


@triton.jit(do_not_specialize=["signature", "rank"])
def all_gather_matmul_kernel(a_desc, b_desc, c_desc, flags, M, N, K, shard_rows, piece_rows, pieces, sync, signature,
                             rank, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                             STAGES: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr):
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    tiles_per_group = GROUP_M * tiles_n
    first_m = tl.cdiv(rank * shard_rows, BM) % tiles_m  # the first tile wholly in the own shard
    ok = tl.full([], 1, tl.int1)
    for tile in range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
        group_first = (tile // tiles_per_group) * GROUP_M
        group_m = tl.minimum(tiles_m - group_first, GROUP_M)
        pid_m = (group_first + (tile % tiles_per_group) % group_m + first_m) % tiles_m
        pid_n = (tile % tiles_per_group) // group_m
        row0 = pid_m * BM
        row1 = tl.minimum(row0 + BM, M)
        # The pieces holding rows [row0, row1), shard by shard (the own shard is there already).
        shard = row0 // shard_rows
        while shard * shard_rows < row1:
            if ok & (shard != rank):
                lo = tl.maximum(row0, shard * shard_rows) - shard * shard_rows
                hi = tl.minimum(row1, (shard + 1) * shard_rows) - 1 - shard * shard_rows
                first_piece = lo // piece_rows
                ok = smt.wait_signals(sync, signature, flags + shard * pieces + first_piece,
                                      hi // piece_rows - first_piece + 1, 1, smt.EQUAL, shard, first_piece)
            shard += 1
        smt.fence_proxy_async_global()  # the rows acquired through the flags, visible to TMA
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k in tl.range(0, K, BK, num_stages=STAGES):
            acc = tl.dot(a_desc.load([row0, k]), b_desc.load([k, pid_n * BN]), acc)
        if EPILOGUE_SUBTILE:  # two half-width stores: half the shared memory for the epilogue
            halves = tl.permute(tl.reshape(acc, (BM, 2, BN // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            c_desc.store([row0, pid_n * BN], left.to(c_desc.dtype))
            c_desc.store([row0, pid_n * BN + BN // 2], right.to(c_desc.dtype))
        else:
            c_desc.store([row0, pid_n * BN], acc.to(c_desc.dtype))


class _Address:
    """A device address as Triton takes a pointer argument (data_ptr and dtype)."""

    def __init__(self, address, dtype):
        self._address, self.dtype = address, dtype

    def data_ptr(self):
        return self._address


def all_gather_matmul(a_shard, b, gathered, comm=None, out=None, programs=None, config=None):
    """c [M x N] = all_gather(a_shard) [M x K] @ b [K x N], M = world * a_shard rows; fp16 or bf16,
    fp32 accumulation. `gathered` is a symmetric [M x K] tensor of the communicator's heap (it holds
    the gathered A after the call); when a_shard is this rank's slot of it, nothing is copied.
    `programs`: the persistent grid (default every SM). Collective; returns c."""
    from ... import device as _device
    from ...torch.device import core_of
    core = core_of(comm)
    world = core.local_world
    rows, k = a_shard.shape
    m, n = world * rows, b.shape[1]
    if a_shard.dtype not in (torch.float16, torch.bfloat16) or b.dtype != a_shard.dtype or b.shape[0] != k:
        raise ValueError(f"all_gather_matmul: a_shard {tuple(a_shard.shape)} {a_shard.dtype} and b "
                         f"{tuple(b.shape)} {b.dtype}: fp16 or bf16, b with K = {k} rows")
    if gathered.shape != (m, k) or gathered.dtype != a_shard.dtype:
        raise ValueError(f"all_gather_matmul: gathered is {tuple(gathered.shape)} {gathered.dtype}, "
                         f"expected ({m}, {k}) {a_shard.dtype}")
    require_heap(comm, gathered, "gathered", "all_gather_matmul")
    bm, bn, bk, stages, warps, subtile = config or CONFIGS[0]
    c = torch.empty(m, n, dtype=a_shard.dtype, device=a_shard.device) if out is None else out
    a_desc = TensorDescriptor.from_tensor(gathered, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b, [bk, bn])
    c_desc = TensorDescriptor.from_tensor(c, [bm, bn // 2 if subtile else bn])
    grid = programs or torch.cuda.get_device_properties(a_shard.device).multi_processor_count
    grid = min(grid, smt.MAX_BLOCKS.value, triton.cdiv(m, bm) * triton.cdiv(n, bn))

    def consume(pieces):
        smt.launch(all_gather_matmul_kernel, grid, a_desc, b_desc, c_desc, _Address(pieces.flags, torch.int32), m, n,
                   k, pieces.shard_rows, pieces.piece_rows, pieces.pieces, comm=core, name="all_gather_matmul",
                   shape=(m, n, k, dtype_name(a_shard), bm, bn, bk), BM=bm, BN=bn, BK=bk, GROUP_M=8, STAGES=stages,
                   EPILOGUE_SUBTILE=subtile, num_warps=warps)

    stream = torch.cuda.current_stream(a_shard.device).cuda_stream
    _device.all_gather_pieces(core, gathered.data_ptr(), a_shard.data_ptr(), m, k * a_shard.element_size(), bm,
                              stream, consume)
    return c


@torch.library.custom_op("symmem_triton::all_gather_matmul", mutates_args=("gathered",), tags=TAGS)
def _all_gather_matmul_op(a_shard: torch.Tensor, b: torch.Tensor, gathered: torch.Tensor,
                          group_name: str) -> torch.Tensor:
    return all_gather_matmul(a_shard, b, gathered, group_communicator(group_name))


@_all_gather_matmul_op.register_fake
def _(a_shard, b, gathered, group_name):
    return a_shard.new_empty(gathered.shape[0], b.shape[1])


# ---- python -m symmem.triton.examples.all_gather_matmul --world1-vs-mm ----------------------------

class _OneRank:
    """The exchange of a communicator of one rank (no other rank to talk to)."""

    def all_gather(self, mine):
        return [mine]

    def barrier(self):
        pass


def _median_ms(fn, reps, batches=5):
    """Median over `batches` of the mean time of `reps` back-to-back calls."""
    from ...timing import time_us
    return statistics.median(time_us(fn, reps) / 1000 for _ in range(batches))


def world1_vs_mm(csv_path, commit, shapes, dtype, reps):
    """At world 1 (the gather is the own shard, in place) the fused example is its GEMM: each
    configuration against torch.mm, interleaved A/B, median of `reps`; the best configuration per
    shape goes to the CSV with its ratio and its largest error relative to torch.mm's result."""
    import symmem
    from symmem.torch.memory import heap_tensor
    torch.cuda.set_device(0)
    comm = symmem.Communicator(0, 1, 0, _OneRank())
    gpu = torch.cuda.get_device_name(0)
    rows = []
    try:
        for m, n, k in shapes:
            nbytes = m * k * torch.empty((), dtype=dtype).element_size()
            gathered = heap_tensor(comm, comm.allocate(nbytes), nbytes).view(dtype).view(m, k)
            gathered.copy_(torch.randn(m, k, device="cuda").to(dtype))
            b = torch.randn(k, n, device="cuda").to(dtype)
            reference = torch.mm(gathered, b)
            best = None
            for config in CONFIGS:
                try:
                    c = all_gather_matmul(gathered, b, gathered, comm, config=config)
                    torch.cuda.synchronize()
                except Exception as e:  # a configuration that does not fit this GPU (shared memory)
                    print(f"m={m} config {config}: skipped ({type(e).__name__}: {str(e)[:120]})", flush=True)
                    continue
                comm.check()
                error = ((c.float() - reference.float()).abs().max() / reference.float().abs().max()).item()
                ours, theirs = [], []
                for _ in range(3):  # A/B interleaved: clock and power drift cancel
                    ours.append(_median_ms(lambda: all_gather_matmul(gathered, b, gathered, comm, out=c,
                                                                     config=config), reps))
                    theirs.append(_median_ms(lambda: torch.mm(gathered, b), reps))
                row = (statistics.median(ours), statistics.median(theirs), config, error)
                print(f"m={m} n={n} k={k} {dtype_name(gathered)} config {config}: triton {row[0]:.3f} ms, torch.mm "
                      f"{row[1]:.3f} ms, ratio {row[0] / row[1]:.3f}, max rel error {error:.2e}", flush=True)
                if best is None or row[0] / row[1] < best[0] / best[1]:
                    best = row
            if best is None:
                raise RuntimeError(f"no configuration ran at m={m}")
            rows.append((m, n, k, best))
            del gathered
    finally:
        comm.close()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    type_name = str(dtype).replace("torch.", "")  # named apart from dtype_name, the helper called above
    command = (f"python3 -m symmem.triton.examples.all_gather_matmul --world1-vs-mm --dtype {type_name} "
               f"--m {','.join(str(r[0]) for r in rows)} --n {rows[0][1]} --k {rows[0][2]}")
    with open(csv_path, "w") as f:
        f.write("date,commit,gpu,dtype,m,n,k,config,triton_ms,torch_mm_ms,ratio,max_rel_error,command\n")
        for m, n, k, (ours, theirs, config, error) in rows:
            f.write(f"{date},{commit},{gpu},{type_name},{m},{n},{k},"
                    f"\"{config}\",{ours:.4f},{theirs:.4f},{ours / theirs:.4f},{error:.3e},\"{command}\"\n")
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world1-vs-mm", action="store_true", required=True)
    parser.add_argument("--csv", default="all_gather_matmul_world1.csv")
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    parser.add_argument("--m", default="4096,8192,16384")
    parser.add_argument("--n", type=int, default=6656)
    parser.add_argument("--k", type=int, default=16384)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args(argv)
    shapes = [(int(m), args.n, args.k) for m in args.m.split(",")]
    world1_vs_mm(args.csv, args.commit, shapes, getattr(torch, args.dtype), args.reps)


if __name__ == "__main__":
    main()
