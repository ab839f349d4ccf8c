"""The fused ops of tensor parallelism against their references, under torchrun (one process per GPU):

    torchrun --nproc-per-node 2 -m symmem.bench.all_gather_matmul --out results
    torchrun --nproc-per-node 2 -m symmem.bench.all_gather_matmul --op matmul_reduce_scatter --out ...

--op all_gather_matmul (default): C [M x N] = all_gather(A_shard) [M x K] @ B [K x N], M = rows
gathered over the ranks. Rows:
  gemm_alone      torch.mm of the whole A (already gathered) by B: the floor
  nccl_then_gemm  NCCL all_gather_into_tensor, then torch.mm, on one stream
  torch_fused     torch.ops.symm_mem.fused_all_gather_matmul (torch's symmetric-memory op)
  symmem_fused    symmem.torch.all_gather_matmul (copy-engine shards, one persistent GEMM)
  symmem_fused_in_place  the same with A_shard already in the workspace (all_gather_matmul_input):
                  no own-shard copy before the GEMM
  symmem_fused_b_transposed  symmem_fused with B given as W.t() (W = B's transpose, contiguous: the
                  weight layout of x @ W.t()): the GEMM reads B column-major where it lies
  symmem_triton_fused  symmem.triton.examples.all_gather_matmul: symmem's copy-engine pieces feeding a
                  persistent Triton TMA GEMM (A_shard copied into a symmetric gather buffer, as
                  symmem_fused). Its tile configuration (the example's CONFIGS) is picked per shape
                  at warm-up: the fastest, by the slowest rank's median of 3 interleaved samples,
                  of those that compile and run on this GPU (tried first on a communicator of each
                  rank alone: a failed launch inside the collective would leave the group's
                  communicator unusable); CSV column `config`. Run when named (--impls);
                  skipped, and said why, without Triton or TMA (sm_90), with N or K not a multiple
                  of 8, or across nodes
--op matmul_reduce_scatter: C_shard [M / world x N] = this rank's rows of the sum over ranks of
A [M x K] @ B [K x N] (every rank's own A and B: K is each rank's slice). Rows:
  gemm_alone      torch.mm(A, B) [M x N]: the floor
  gemm_then_nccl  torch.mm, then NCCL reduce_scatter_tensor of the product (in the output type)
  torch_fused     torch.ops.symm_mem.fused_matmul_reduce_scatter (torch's symmetric-memory op)
  symmem_fused    symmem.torch.matmul_reduce_scatter (one persistent GEMM, float32 partial sums
                  pulled by copy engine)
  symmem_fused_b_transposed  the same with B given as W.t() (column-major, read in place)
Every configuration runs `--calls` back-to-back calls per sample, configurations interleaved
round after round (clocks drift); the time of a configuration is the slowest rank's median over
`--reps` samples, with the fastest and slowest sample. Random normal inputs (power depends on the
data); `wrong` counts elements of C farther from a float32 reference than the output type's
rounding allows (the reference of matmul_reduce_scatter: float32 products reduce-scattered in
float32 by NCCL; the rows that sum partials rounded to the output type are allowed world + 1
roundings of the partials' summed magnitude, since partials of opposite signs cancel in the sum
but not in their rounding). CSV op=all_gather_matmul or matmul_reduce_scatter, shape MxNxK, config
(symmem_triton_fused only).
"""
import argparse
import datetime
import os
import statistics

import torch
import torch.distributed as dist

from ..timing import time_us
from ._results import pyplot, write_results
from ._torchrun import init_nccl
from .torch import _commit

IMPLS = {"all_gather_matmul": ("gemm_alone", "nccl_then_gemm", "torch_fused", "symmem_fused", "symmem_fused_in_place",
                               "symmem_fused_b_transposed", "symmem_triton_fused"),
         "matmul_reduce_scatter": ("gemm_alone", "gemm_then_nccl", "torch_fused", "symmem_fused",
                                   "symmem_fused_b_transposed")}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
RTOL = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}
FIELDS = ["op", "impl", "world", "dtype", "shape", "m", "n", "k", "time_us", "time_min_us", "time_max_us",
          "vs_gemm_alone", "tflops", "wrong", "gpu", "commit", "date", "config"]
TRITON_SAMPLES = 3  # interleaved samples of each tile configuration at warm-up


class _TritonFused:
    """symmem_triton_fused: the Triton example gathering into one symmetric buffer sized for the
    largest shape (heap memory returns only with the communicator: allocated once, viewed per
    shape at offset 0, the same on every rank), with a tile configuration picked per shape."""

    def __init__(self, example, group, max_m, k, calls):
        import symmem.torch as st
        self.example, self.group, self.calls = example, group, calls
        self.buffer = st.empty(max_m * k * 2, dtype=torch.uint8, group=group)  # fp16 and bf16: 2 bytes
        self.runnable = {}  # dtype -> the example's configurations that run on this GPU, on every rank
        self.chosen = {}    # (dtype, m) -> the configuration picked

    @staticmethod
    def create(group, max_m, n, k, calls):
        """A _TritonFused, or None (rank 0 prints why) where any rank cannot run the row: every rank
        leaves it out alike, or their sequences of calls would differ."""
        import symmem.torch as st
        why = None
        major, minor = torch.cuda.get_device_capability()
        if st.GroupCommunicator(group).nodes > 1:  # every rank: the communicator's first use is collective
            why = "the copy-engine pieces and the Triton kernel's waits serve one node; this group spans several"
        elif major < 9:
            why = f"it needs TMA and wgmma (sm_90 or newer); this GPU is sm_{major}{minor}"
        elif n % 8 or k % 8:
            why = f"TMA needs rows of a multiple of 16 bytes: N = {n} and K = {k} must be multiples of 8"
        example = None
        if why is None:
            try:
                from symmem.triton.examples import all_gather_matmul as example
            except Exception as e:  # no Triton, or one symmem.triton does not work with
                why = f"symmem.triton does not import ({type(e).__name__}: {str(e)[:160]})"
        able = torch.tensor([why is None], dtype=torch.int32, device="cuda")
        dist.all_reduce(able, op=dist.ReduceOp.MIN, group=group)
        if not able.item():
            if group.rank() == 0:
                print(f"symmem_triton_fused skipped: {why or 'another rank cannot run it'}", flush=True)
            return None
        return _TritonFused(example, group, max_m, k, calls)

    def _runnable(self, dtype):
        """The example's configurations that compile and run here, on every rank. Each is tried on a
        communicator of this rank alone (world 1, the shard in place, as world1_vs_mm runs them):
        a consumer that fails inside all_gather_pieces makes its communicator unusable, so a
        configuration beyond this GPU (shared memory) must fail there, not in the group's. A failed
        one's communicator is released and the next configuration gets a new one."""
        if dtype in self.runnable:
            return self.runnable[dtype]
        import symmem
        from symmem.torch.memory import heap_tensor
        size = 512  # a few tiles of every configuration
        nbytes = size * size * 2
        b = torch.randn(size, size, device="cuda").to(dtype)
        runs, alone, a = [], None, None
        for config in self.example.CONFIGS:
            try:
                if alone is None:
                    alone = symmem.Communicator(0, 1, torch.cuda.current_device(), self.example._OneRank())
                    a = heap_tensor(alone, alone.allocate(nbytes), nbytes).view(dtype).view(size, size)
                    a.copy_(b)
                self.example.all_gather_matmul(a, b, a, alone, config=config)
                torch.cuda.synchronize()
                alone.check()
                runs.append(1)
            except Exception as e:  # shared memory or registers beyond this GPU's
                print(f"rank {self.group.rank()}: symmem_triton_fused configuration {config} does not run on this "
                      f"GPU ({type(e).__name__}: {str(e)[:160]})", flush=True)
                runs.append(0)
                a = None
                if alone is not None:
                    torch.cuda.synchronize()  # what the failed call enqueued ends before its memory goes
                    alone.destroy()  # local release: a communicator of one rank has no peer to close with
                alone = None
        a = None
        if alone is not None:
            alone.close()
        agreed = torch.tensor(runs, dtype=torch.int32, device="cuda")
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=self.group)
        self.runnable[dtype] = [c for c, ok in zip(self.example.CONFIGS, agreed.tolist()) if ok]
        return self.runnable[dtype]

    def call(self, a_shard, b, out):
        """The row's call at this shape, with the fastest runnable configuration, or None (rank 0
        prints why) where none runs. Collective: every rank times every configuration in turn,
        TRITON_SAMPLES rounds of `calls` calls after two warm-up calls (the first compiles), and
        takes the one whose slowest rank's median is least: the same on every rank."""
        world, (rows, k) = self.group.size(), a_shard.shape
        m, dtype = world * rows, a_shard.dtype
        gathered = self.buffer[:m * k * 2].view(dtype).view(m, k)

        def run(config):
            return lambda: self.example.all_gather_matmul(a_shard, b, gathered, comm=self.group, out=out,
                                                          config=config)
        configs = self._runnable(dtype)
        if not configs:
            if self.group.rank() == 0:
                print(f"symmem_triton_fused skipped at {dtype}: none of the example's configurations runs here",
                      flush=True)
            return None
        for config in configs:
            run(config)()
            run(config)()
        samples = [[] for _ in configs]
        for _ in range(TRITON_SAMPLES):
            for i, config in enumerate(configs):
                samples[i].append(time_us(run(config), self.calls))
        times = torch.tensor([statistics.median(s) for s in samples], dtype=torch.float64, device="cuda")
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=self.group)
        best = int(torch.argmin(times).item())
        self.chosen[(dtype, m)] = configs[best]
        if self.group.rank() == 0:
            tried = ", ".join(f"{c}: {t:.1f} us" for c, t in zip(configs, times.tolist()))
            print(f"symmem_triton_fused {str(dtype).replace('torch.', '')} {m}x{b.shape[1]}x{k}: "
                  f"configuration {configs[best]} ({tried})", flush=True)
        return run(configs[best])


def _transposed_weight(b):
    """b's values as W.t() of a contiguous W [n, k]: column-major, as a layer's x @ W.t() gives it."""
    return b.t().contiguous().t()


def _cases(m, n, k, dtype, group, torch_fused, triton):
    """impl -> (call, output getter) on shared inputs; plus the float32 reference of C. `triton`: the
    _TritonFused of the symmem_triton_fused row, or None."""
    import symmem.torch as st
    world, rank = group.size(), group.rank()
    g = torch.Generator(device="cuda").manual_seed(1000 + rank)
    a_shard = torch.randn(m // world, k, generator=g, device="cuda", dtype=torch.float32).to(dtype)
    gb = torch.Generator(device="cuda").manual_seed(7)
    b = torch.randn(k, n, generator=gb, device="cuda", dtype=torch.float32).to(dtype)
    a = torch.empty(m, k, device="cuda", dtype=dtype)
    dist.all_gather_into_tensor(a, a_shard, group=group)
    reference = a.float() @ b.float()
    c = {impl: torch.empty(m, n, device="cuda", dtype=dtype) for impl in IMPLS["all_gather_matmul"]}
    a_nccl = torch.empty_like(a)

    def gemm_alone():
        torch.mm(a, b, out=c["gemm_alone"])

    def nccl_then_gemm():
        dist.all_gather_into_tensor(a_nccl, a_shard, group=group)
        torch.mm(a_nccl, b, out=c["nccl_then_gemm"])

    def torch_fused_call():
        _, outs = torch.ops.symm_mem.fused_all_gather_matmul(a_shard, [b], 0, group.group_name, return_A=False)
        c["torch_fused"] = outs[0]

    def symmem_fused():
        c["symmem_fused"] = st.all_gather_matmul(a_shard, b, group=group)[0]

    a_in_place = st.all_gather_matmul_input(m // world, k, dtype, group=group)
    a_in_place.copy_(a_shard)

    def symmem_fused_in_place():
        c["symmem_fused_in_place"] = st.all_gather_matmul(a_in_place, b, group=group)[0]

    b_transposed = _transposed_weight(b)

    def symmem_fused_b_transposed():
        c["symmem_fused_b_transposed"] = st.all_gather_matmul(a_shard, b_transposed, group=group)[0]

    calls = {"gemm_alone": gemm_alone, "nccl_then_gemm": nccl_then_gemm, "symmem_fused": symmem_fused,
             "symmem_fused_in_place": symmem_fused_in_place, "symmem_fused_b_transposed": symmem_fused_b_transposed}
    if torch_fused:
        calls["torch_fused"] = torch_fused_call
    if triton is not None:
        symmem_triton_fused = triton.call(a_shard, b, c["symmem_triton_fused"])
        if symmem_triton_fused is not None:
            calls["symmem_triton_fused"] = symmem_triton_fused
    return calls, (lambda impl: c[impl]), reference


def _reduce_scatter_cases(m, n, k, dtype, group, torch_fused):
    """As _cases, for matmul_reduce_scatter: every rank's own A [m x k] and B [k x n]."""
    import symmem.torch as st
    world, rank = group.size(), group.rank()
    g = torch.Generator(device="cuda").manual_seed(2000 + rank)
    a = torch.randn(m, k, generator=g, device="cuda", dtype=torch.float32).to(dtype)
    b = torch.randn(k, n, generator=g, device="cuda", dtype=torch.float32).to(dtype)
    full = a.float() @ b.float()
    reference = torch.empty(m // world, n, device="cuda", dtype=torch.float32)
    dist.reduce_scatter_tensor(reference, full, group=group)
    # Sum over ranks of |partial product|: what the rounding of each partial in the output type
    # is relative to (partials of opposite signs cancel in the sum, not in their rounding).
    magnitude = torch.empty_like(reference)
    dist.reduce_scatter_tensor(magnitude, full.abs(), group=group)
    product = torch.empty(m, n, device="cuda", dtype=dtype)
    c = {"gemm_alone": product, "gemm_then_nccl": torch.empty(m // world, n, device="cuda", dtype=dtype)}

    def gemm_alone():
        torch.mm(a, b, out=product)

    def gemm_then_nccl():
        torch.mm(a, b, out=product)
        dist.reduce_scatter_tensor(c["gemm_then_nccl"], product, group=group)

    def torch_fused_call():
        c["torch_fused"] = torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", 0, group.group_name)

    def symmem_fused():
        c["symmem_fused"] = st.matmul_reduce_scatter(a, b, group=group)

    b_transposed = _transposed_weight(b)

    def symmem_fused_b_transposed():
        c["symmem_fused_b_transposed"] = st.matmul_reduce_scatter(a, b_transposed, group=group)

    calls = {"gemm_alone": gemm_alone, "gemm_then_nccl": gemm_then_nccl, "symmem_fused": symmem_fused,
             "symmem_fused_b_transposed": symmem_fused_b_transposed}
    if torch_fused:
        calls["torch_fused"] = torch_fused_call
    def check(impl):
        """(output, its float32 reference, the magnitude its rounding error is bounded by): the
        references that round each partial product and each partial sum in the output type err by
        up to world + 1 roundings of the partials' magnitude; symmem (float32 sums) and the product
        (gemm_alone, the whole M x N) round once."""
        if impl == "gemm_alone":
            return c[impl], full, full.abs()
        if impl in ("symmem_fused", "symmem_fused_b_transposed"):
            return c[impl], reference, reference.abs()
        return c[impl], reference, (world + 1) * magnitude
    return calls, check, None


def _wrong(c, reference, dtype, k, scale):
    bound = RTOL[dtype] * scale + 1e-3 * (k ** 0.5)
    return int(((c.float() - reference).abs() > bound).sum().item())


def _plot(rows, path):
    plt = pyplot()
    if plt is None:
        return
    dtypes = sorted({r["dtype"] for r in rows})
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6.5 * len(dtypes), 4.5), squeeze=False)
    for ax, dt in zip(axes[0], dtypes):
        shapes = sorted({(r["m"], r["shape"]) for r in rows if r["dtype"] == dt})
        impls = [i for i in IMPLS[rows[0]["op"]] if any(r["impl"] == i for r in rows)]
        width = 0.8 / len(impls)
        for j, impl in enumerate(impls):
            sel = {r["shape"]: r for r in rows if r["dtype"] == dt and r["impl"] == impl}
            xs = [i + j * width for i, _ in enumerate(shapes)]
            ys = [sel[s]["vs_gemm_alone"] if s in sel else float("nan") for _, s in shapes]
            ax.bar(xs, ys, width, label=impl)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(shapes))])
        ax.set_xticklabels([s for _, s in shapes], fontsize=8)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylim(0.9, max(1.6, max(r["vs_gemm_alone"] for r in rows if r["dtype"] == dt) + 0.05))
        ax.set_ylabel("time / gemm_alone (median of the slowest rank)")
        ax.set_title(f"{rows[0]['op']}, {dt}, world {rows[0]['world']}")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="directory for the CSV, the table and the PNG")
    parser.add_argument("--op", default="all_gather_matmul", choices=sorted(IMPLS))
    # Upper case: torchrun, which parses these arguments first, takes --m, --n as abbreviations of its own.
    parser.add_argument("--M", dest="m", type=int, nargs="*", default=[4096, 8192, 16384],
                        help="rows of C (gathered over the ranks, or scattered to them)")
    parser.add_argument("--N", dest="n", type=int, default=6656)
    parser.add_argument("--K", dest="k", type=int, default=16384)
    parser.add_argument("--dtypes", nargs="*", default=["fp16", "bf16"], choices=sorted(DTYPES))
    parser.add_argument("--reps", type=int, default=9, help="samples per configuration, interleaved")
    parser.add_argument("--calls", type=int, default=5, help="back-to-back calls per sample")
    parser.add_argument("--impls", nargs="*", default=None,
                        choices=sorted({i for impls in IMPLS.values() for i in impls}), help="default: every row but symmem_triton_fused")
    parser.add_argument("--stem", default=None, help="file name stem (default: the op)")
    args = parser.parse_args(argv)
    # symmem_triton_fused only when named: not yet measured on GPUs.
    default = [i for i in IMPLS[args.op] if i != "symmem_triton_fused"]
    args.impls = [i for i in (args.impls or default) if i in IMPLS[args.op]]
    args.stem = args.stem or args.op

    init_nccl()
    group = dist.group.WORLD
    world, rank = group.size(), group.rank()
    torch_fused = "torch_fused" in args.impls
    if torch_fused:
        import torch.distributed._symmetric_memory as symm_mem
        symm_mem.enable_symm_mem_for_group(group.group_name)
    triton = None
    if "symmem_triton_fused" in args.impls:
        triton = _TritonFused.create(group, max(args.m), args.n, args.k, args.calls)

    rows, date, commit, gpu = [], datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), \
        _commit(), torch.cuda.get_device_name()
    for dname in args.dtypes:
        dtype = DTYPES[dname]
        for m in args.m:
            if args.op == "all_gather_matmul":
                calls, output, reference = _cases(m, args.n, args.k, dtype, group, torch_fused, triton)
                checked = lambda impl: (output(impl), reference, reference.abs())  # noqa: E731
            else:
                calls, checked, _ = _reduce_scatter_cases(m, args.n, args.k, dtype, group, torch_fused)
            calls = {i: calls[i] for i in args.impls if i in calls}
            wrong = {}
            for impl, call in calls.items():  # warm-up (and the workspaces), then the check
                if args.op == "all_gather_matmul":
                    output(impl).fill_(float("nan"))  # a row that writes nothing fails its check
                call()
                call()
                torch.cuda.synchronize()
                out, ref, scale = checked(impl)
                wrong[impl] = _wrong(out, ref, dtype, args.k, scale)
                del out, ref, scale
            samples = {impl: [] for impl in calls}
            for _ in range(args.reps):  # interleaved: every configuration once per round
                for impl, call in calls.items():
                    samples[impl].append(time_us(call, args.calls))
            shape = f"{m}x{args.n}x{args.k}"
            for impl in calls:
                stats = torch.tensor([statistics.median(samples[impl]), min(samples[impl]), max(samples[impl])],
                                     device="cuda", dtype=torch.float64)
                dist.all_reduce(stats, op=dist.ReduceOp.MAX, group=group)
                w = torch.tensor([wrong[impl]], device="cuda")
                dist.all_reduce(w, group=group)
                t = stats[0].item()
                rows.append({"op": args.op, "impl": impl, "world": world, "dtype": dname, "shape": shape,
                             "m": m, "n": args.n, "k": args.k, "time_us": t, "time_min_us": stats[1].item(),
                             "time_max_us": stats[2].item(), "tflops": 2.0 * m * args.n * args.k / t / 1e6,
                             "wrong": int(w.item()), "gpu": gpu, "commit": commit, "date": date,
                             "config": str(triton.chosen[(dtype, m)]) if impl == "symmem_triton_fused" else ""})
            del calls, checked
            torch.cuda.empty_cache()
    for r in rows:
        base = [x for x in rows if x["shape"] == r["shape"] and x["dtype"] == r["dtype"] and x["impl"] == "gemm_alone"]
        r["vs_gemm_alone"] = r["time_us"] / base[0]["time_us"] if base else float("nan")
    if rank == 0:
        lines = [f"{'dtype':5} {'shape':>18} " + " ".join(f"{i:>22}" for i in args.impls)]
        for dname in args.dtypes:
            for m in args.m:
                shape = f"{m}x{args.n}x{args.k}"
                cells = []
                for impl in args.impls:
                    r = [x for x in rows if x["shape"] == shape and x["dtype"] == dname and x["impl"] == impl]
                    cells.append(f"{r[0]['time_us']:9.1f} us {r[0]['vs_gemm_alone']:5.3f}x" if r else "-")
                lines.append(f"{dname:5} {shape:>18} " + " ".join(f"{c:>22}" for c in cells))
        if triton is not None and triton.chosen:
            lines.append("symmem_triton_fused configurations (BM, BN, BK, STAGES, num_warps, EPILOGUE_SUBTILE): " +
                         "; ".join(f"{str(d).replace('torch.', '')} M={m}: {c}" for (d, m), c in triton.chosen.items()))
        lines.append(f"world {world}, {gpu}, commit {commit}, {date}; median of {args.reps} interleaved samples of "
                     f"{args.calls} calls (slowest rank); wrong elements in all rows: {sum(r['wrong'] for r in rows)}")
        text = "\n".join(lines)
        print(text, flush=True)
        if args.out:
            write_results(args.out, args.stem, FIELDS, rows, text, _plot)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
