"""symmem.torch against torch.distributed (NCCL) and PyTorch's symmetric memory, from Python, in one
run on the same GPUs: vLLM's device-communicator table (all-reduce of T x 8192 bf16) and the
matching all-gathers, eager and replayed from CUDA graphs.

    torchrun --nproc-per-node 2 -m symmem.bench.torch --out results

Rows (impl):
  nccl                     torch.distributed.all_reduce (in place) / all_gather_into_tensor
  torch_symm_mem_one_shot  torch.ops.symm_mem.one_shot_all_reduce on a rendezvoused buffer
  torch_symm_mem_two_shot  torch.ops.symm_mem.two_shot_all_reduce_ on a rendezvoused buffer
  symmem_torch             symmem.torch.all_reduce (the drop-in, in place, as the two-shot row) and
                           torch.ops.symmem.all_gather_into_tensor_out on symmetric tensors
                           (symmem.torch.empty): zero copy, as the symm_mem rows
  symmem_torch_op          torch.ops.symmem.all_reduce_ on a symmetric tensor: the same kernel as
                           symmem_torch, through the dispatcher (what torch.compile'd code calls)
  symmem_torch_staged      TPAllReduce.all_reduce / the drop-in all_gather_into_tensor on tensors from
                           the caching allocator (what vLLM passes): the input is staged when needed
  symmem_triton_one_shot   symmem.triton.examples.one_shot_all_reduce (all-reduce only): a Triton kernel
                           reading every peer's symmetric input (symmem.torch.empty) through the heap,
                           fp32 sums in rank order, into a tensor of the caching allocator; a user call
                           of the same communicator (signed by symmem.triton.launch, capturable);
                           its eager time holds Triton's launch path in Python. Left out, and said
                           why, without Triton or on a group across nodes; run with --triton (not yet measured on
                           GPUs: off by default until it is)
Eager: `calls` back-to-back calls between two events (Python, dispatcher and launch included).
Graph: one CUDA graph of 10 calls, replayed `replays` times between two events. Every sample of
every configuration is taken in turn (ABAB...), `reps` times; the CSV holds the median with the
fastest and slowest sample. After timing, every configuration's output is checked once
(symmem.testing, the oracles symmem's tests use): symmem's all-reduce rows bit for bit against
symmem's documented order (fp32 sums in rank order, one rounding), the other libraries' rows
(nccl, torch_symm_mem_*: another order, partial sums rounded to bf16) within the rounding bound of
any order, from the float64 sum, the world size and the dtype; gathers bit for bit against NCCL's;
and every output against every other rank's bits. `wrong` counts the elements that fail.
"""
import argparse
import datetime
import os
import statistics
import subprocess
import zlib

import torch
import torch.distributed as dist

from .. import testing
from ..timing import capture, replay_us, time_us
from ._results import pyplot, write_results
from ._torchrun import init_nccl

TOKENS = [32, 64, 96, 128, 192, 256, 1024, 2048, 3062, 4096]
HIDDEN = 8192
DTYPE = torch.bfloat16
GRAPH_CALLS = 10
IN_PLACE = ("nccl", "torch_symm_mem_two_shot", "symmem_torch", "symmem_torch_op")  # all-reduce rows


def _commit():
    if os.environ.get("SYMMEM_COMMIT"):
        return os.environ["SYMMEM_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(__file__), timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class Case:
    """One implementation at one size: `call()` runs one collective (the same buffers every time)."""

    def __init__(self, op, impl, tokens, call, output, inputs, reference):
        self.op, self.impl, self.tokens = op, impl, tokens
        self.call, self.output, self.inputs, self.reference = call, output, inputs, reference
        # What a reduction is checked against: symmem's rows its documented order, bit for bit;
        # the other libraries' the rounding bound of any order.
        self.order = testing.SYMMEM if impl.startswith("symmem") else testing.ANY
        self.graph = None
        self.graph_output = None  # the tensor the graph's last call writes
        self.graph_of_one = None  # in-place all-reduces: a graph of one call, for the check
        self.samples = {"eager": [], "graph": []}


def _fill(tensors, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    for t in tensors:
        t.copy_(torch.randn(t.shape, generator=g, device="cuda", dtype=torch.float32).to(t.dtype))


def _build_all_reduce(tokens, group, symm_mem, st, triton_one_shot, triton_grids=()):
    g = group.group_name
    n = tokens * HIDDEN
    cases = []
    x = torch.empty(n, dtype=DTYPE, device="cuda")
    cases.append(Case("all_reduce", "nccl", tokens, lambda: dist.all_reduce(x, group=group), lambda: x, [x], "sum"))
    if symm_mem is not None:
        b1 = symm_mem.empty(n, dtype=DTYPE, device="cuda")
        symm_mem.rendezvous(b1, g)
        out1 = {}

        def one_shot():
            out1["y"] = torch.ops.symm_mem.one_shot_all_reduce(b1, "sum", g)
        cases.append(Case("all_reduce", "torch_symm_mem_one_shot", tokens, one_shot, lambda: out1["y"], [b1], "sum"))
        b2 = symm_mem.empty(n, dtype=DTYPE, device="cuda")
        symm_mem.rendezvous(b2, g)
        cases.append(Case("all_reduce", "torch_symm_mem_two_shot", tokens,
                          lambda: torch.ops.symm_mem.two_shot_all_reduce_(b2, "sum", g), lambda: b2, [b2], "sum"))
    s = st.empty(n, dtype=DTYPE, group=group)
    cases.append(Case("all_reduce", "symmem_torch", tokens, lambda: st.all_reduce(s, group=group), lambda: s, [s],
                      "sum"))
    s_op = st.empty(n, dtype=DTYPE, group=group)
    cases.append(Case("all_reduce", "symmem_torch_op", tokens, lambda: torch.ops.symmem.all_reduce_(s_op, "sum", g),
                      lambda: s_op, [s_op], "sum"))
    tp = st.TPAllReduce(group, max_size=n * 2)
    xl = torch.empty(n, dtype=DTYPE, device="cuda")
    out_l = {}

    def symmem_staged():
        out_l["y"] = tp.all_reduce(xl)
    cases.append(Case("all_reduce", "symmem_torch_staged", tokens, symmem_staged, lambda: out_l["y"], [xl], "sum"))
    if triton_one_shot is not None:
        xt = st.empty(n, dtype=DTYPE, group=group)
        yt = torch.empty(n, dtype=DTYPE, device="cuda")  # out of place: peers read xt while yt is written
        cases.append(Case("all_reduce", "symmem_triton_one_shot", tokens,
                          lambda: triton_one_shot(xt, group, out=yt), lambda: yt, [xt], "sum"))
        for programs, nbytes in triton_grids:  # other grids than the default, on the same buffers
            cases.append(Case("all_reduce", f"symmem_triton_one_shot_p{programs}_b{nbytes}", tokens,
                              lambda p=programs, b=nbytes: triton_one_shot(xt, group, out=yt, max_programs=p,
                                                                           bytes_per_thread=b),
                              lambda: yt, [xt], "sum"))
    return cases


def _triton_one_shot(group, st):
    """symmem.triton.examples.one_shot_all_reduce, or None (rank 0 prints why) where any rank cannot
    run it: the ranks leave the row out alike, or their sequences of calls would differ."""
    why = None
    if st.GroupCommunicator(group).nodes > 1:  # every rank: the communicator's first use is collective
        why = "a Triton kernel reaches its peers through the heap, which spans one node; this group spans several"
    try:
        from symmem.triton.examples import one_shot_all_reduce
    except Exception as e:  # no Triton, or one symmem.triton does not work with
        why = f"symmem.triton does not import ({type(e).__name__}: {str(e)[:160]})"
    able = torch.tensor([why is None], dtype=torch.int32, device="cuda")
    dist.all_reduce(able, op=dist.ReduceOp.MIN, group=group)
    if able.item():
        return one_shot_all_reduce
    if group.rank() == 0:
        print(f"symmem_triton_one_shot skipped: {why or 'another rank cannot run it'}", flush=True)
    return None


def _build_all_gather(tokens, group, st):
    g = group.group_name
    world = group.size()
    n = tokens * HIDDEN // world  # the gathered tensor is T x 8192, as the all-reduce's
    x = torch.empty(n, dtype=DTYPE, device="cuda")
    y = torch.empty(n * world, dtype=DTYPE, device="cuda")
    cases = [Case("all_gather", "nccl", tokens, lambda: dist.all_gather_into_tensor(y, x, group=group), lambda: y,
                  [x], "gather")]
    xs = st.empty(n, dtype=DTYPE, group=group)
    ys = st.empty(n * world, dtype=DTYPE, group=group)
    cases.append(Case("all_gather", "symmem_torch", tokens,
                      lambda: torch.ops.symmem.all_gather_into_tensor_out(xs, g, out=ys), lambda: ys, [xs], "gather"))
    xl = torch.empty(n, dtype=DTYPE, device="cuda")
    yl = torch.empty(n * world, dtype=DTYPE, device="cuda")
    cases.append(Case("all_gather", "symmem_torch_staged", tokens, lambda: st.all_gather_into_tensor(yl, xl, group),
                      lambda: yl, [xl], "gather"))
    return cases


def _time_eager(case, calls):
    for _ in range(3):
        case.call()
    return time_us(case.call, calls)


def _capture(case):
    case.graph = capture(case.call, GRAPH_CALLS, warmups=3)
    case.graph_output = case.output()
    if case.op == "all_reduce" and case.impl in IN_PLACE:
        case.graph_of_one = capture(case.call, 1, warmups=0)


def _time_graph(case, replays):
    case.graph.replay()
    return replay_us(case.graph, replays, GRAPH_CALLS)


def _check(case, group, mode):
    """Elements of the case's output that are wrong after a fresh input, for one eager call and
    for one replay of the timed graph (10 calls). An in-place all-reduce compounds over the
    graph's calls: after k calls every rank holds world^(k-1) x the sum, so its timed graph is
    checked as k calls in a row (symmem's order repeated, or the bound of any order compounded
    over k calls), and its graph of one call as one."""
    if mode == "eager":
        return _check_run(case, group, mode, case.call, case.output, 1)
    if case.op == "all_reduce" and case.impl in IN_PLACE:
        return (_check_run(case, group, "graph1", case.graph_of_one.replay, case.output, 1) +
                _check_run(case, group, mode, case.graph.replay, case.output, GRAPH_CALLS))
    return _check_run(case, group, mode, case.graph.replay, lambda: case.graph_output, 1)


def count_wrong(case, out, parts, compounded=1):
    """Elements of `out` that are wrong for `case`, given every rank's input (parts, [world, n]):
    a gather bit for bit against the inputs in rank order; a sum (after `compounded` in-place calls)
    in the case's order (symmem.testing)."""
    if case.reference == "gather":
        return int((out.view(torch.int16) != parts.reshape(-1).view(torch.int16)).sum().item())
    return int(testing.wrong_elements(out, parts, case.order, "sum", calls=compounded).sum().item())


def _check_run(case, group, label, run, output, compounded):
    rank, world = group.rank(), group.size()
    seed = 1000 + 7 * rank + case.tokens + zlib.crc32(label.encode()) % 1000
    _fill(case.inputs, seed)
    run()
    torch.cuda.synchronize()
    out = output().reshape(-1).clone()  # an in-place case's output is its input, refilled below
    _fill(case.inputs, seed)
    inp = case.inputs[0].reshape(-1)
    parts = torch.empty(world * inp.numel(), dtype=inp.dtype, device="cuda")
    dist.all_gather_into_tensor(parts, inp.contiguous(), group=group)
    wrong = count_wrong(case, out, parts.view(world, -1), compounded)
    mine = out.view(torch.uint8)
    every = torch.empty(world * mine.numel(), dtype=torch.uint8, device="cuda")
    dist.all_gather_into_tensor(every, mine.contiguous(), group=group)
    wrong += int((every.view(world, -1) != every.view(world, -1)[0]).any(0).sum().item())
    return wrong


def _vllm_table(rows, op, mode, impls, file=None):
    lines = [f"{op}, {mode} (us per call, median)",
             " | ".join(["Tensor Shape".ljust(16)] + [i.ljust(12) for i in impls] + ["Best (Speedup vs nccl)"])]
    for tokens in TOKENS:
        got = {r["impl"]: r for r in rows if r["op"] == op and r["mode"] == mode and r["tokens"] == tokens}
        if not got:
            continue
        cells = [f"({tokens}, {HIDDEN})".ljust(16)]
        for impl in impls:
            cells.append((f"{got[impl]['time_us']:.2f}" if impl in got else "-").ljust(max(12, len(impl))))
        best = min(got.values(), key=lambda r: r["time_us"])
        speedup = got["nccl"]["time_us"] / best["time_us"] if "nccl" in got else float("nan")
        cells.append(f"{best['impl']} ({speedup:.2f}x)")
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def _plot(rows, path):
    plt = pyplot()
    if plt is None:
        return
    ops = sorted({r["op"] for r in rows})
    fig, axes = plt.subplots(len(ops), 2, figsize=(12, 4.5 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        for j, mode in enumerate(("eager", "graph")):
            ax = axes[i][j]
            for impl in sorted({r["impl"] for r in rows if r["op"] == op}):
                sel = sorted((r for r in rows if r["op"] == op and r["mode"] == mode and r["impl"] == impl),
                             key=lambda r: r["bytes"])
                if not sel:
                    continue
                x = [r["bytes"] / 2**20 for r in sel]
                y = [r["time_us"] for r in sel]
                err = [[r["time_us"] - r["time_min_us"] for r in sel], [r["time_max_us"] - r["time_us"] for r in sel]]
                ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=impl)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("MiB (T x 8192 bf16)")
            ax.set_ylabel("us per call (median; bars: fastest..slowest sample)")
            ax.set_title(f"{op}, {mode}, world {rows[0]['world']}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="directory for the CSV, the tables and the PNG")
    parser.add_argument("--reps", type=int, default=15, help="samples per configuration, interleaved")
    parser.add_argument("--calls", type=int, default=30, help="eager calls per sample")
    parser.add_argument("--replays", type=int, default=5, help="graph replays per sample")
    parser.add_argument("--tokens", type=int, nargs="*", default=TOKENS)
    parser.add_argument("--ops", nargs="*", default=["all_reduce", "all_gather"])
    parser.add_argument("--no-symm-mem", action="store_true", help="leave out the torch symmetric-memory rows")
    parser.add_argument("--triton", action="store_true", help="add the symmem.triton row (symmem_triton_one_shot)")
    parser.add_argument("--triton-grids", default="",
                        help="with --triton, more one-shot rows: PROGRAMS:BYTES_PER_THREAD,... (at most PROGRAMS "
                             "programs, tiles of BYTES_PER_THREAD a thread), e.g. 48:16,32:32")
    args = parser.parse_args(argv)
    triton_grids = []
    for grid in filter(None, args.triton_grids.split(",")):
        try:
            programs, nbytes = (int(v) for v in grid.split(":"))
        except ValueError:
            parser.error(f"--triton-grids: {grid!r} is not PROGRAMS:BYTES_PER_THREAD")
        if programs < 1 or nbytes < 1 or nbytes & (nbytes - 1):
            parser.error(f"--triton-grids: {grid}: programs >= 1, bytes a power of two")
        triton_grids.append((programs, nbytes))

    init_nccl()
    group = dist.group.WORLD
    rank, world = group.rank(), group.size()
    import symmem.torch as st
    symm_mem = None
    if not args.no_symm_mem:
        import torch.distributed._symmetric_memory as symm_mem
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(group.group_name)
    triton_one_shot = None
    if "all_reduce" in args.ops and args.triton:
        triton_one_shot = _triton_one_shot(group, st)

    cases = []
    for tokens in args.tokens:
        if "all_reduce" in args.ops:
            cases += _build_all_reduce(tokens, group, symm_mem, st, triton_one_shot, triton_grids)
        if "all_gather" in args.ops:
            cases += _build_all_gather(tokens, group, st)
    for i, case in enumerate(cases):
        _fill(case.inputs, 17 * rank + i)
        _capture(case)
    for _ in range(args.reps):  # interleaved: every configuration once per round
        for case in cases:
            case.samples["eager"].append(_time_eager(case, args.calls))
            case.samples["graph"].append(_time_graph(case, args.replays))

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    commit, gpu = _commit(), torch.cuda.get_device_name()
    rows = []
    for case in cases:
        for mode in ("eager", "graph"):
            wrong = _check(case, group, mode)
            # Every rank's time: the slowest rank's median is the collective's time.
            med = torch.tensor([statistics.median(case.samples[mode]), min(case.samples[mode]),
                                max(case.samples[mode])], device="cuda", dtype=torch.float64)
            dist.all_reduce(med, op=dist.ReduceOp.MAX, group=group)
            w = torch.tensor([wrong], device="cuda")
            dist.all_reduce(w, group=group)
            nbytes = case.tokens * HIDDEN * 2
            per_rank = nbytes if case.op == "all_reduce" else nbytes // world
            t = med[0].item()
            factor = 2 * (world - 1) / world if case.op == "all_reduce" else (world - 1) / world
            rows.append({"op": case.op, "impl": case.impl, "mode": mode, "world": world, "dtype": "bfloat16",
                         "bytes_per_rank": per_rank, "count": per_rank // 2, "blocks": -1, "time_us": t,
                         "time_min_us": med[1].item(), "time_max_us": med[2].item(),
                         "algbw_gbs": nbytes / t / 1e3, "busbw_gbs": nbytes / t / 1e3 * factor,
                         "wrong": int(w.item()), "tokens": case.tokens, "bytes": nbytes, "gpu": gpu,
                         "commit": commit, "date": date})
    for r in rows:
        nccl = [x for x in rows if x["op"] == r["op"] and x["mode"] == r["mode"] and x["tokens"] == r["tokens"]
                and x["impl"] == "nccl"]
        r["vs_nccl"] = nccl[0]["time_us"] / r["time_us"] if nccl else float("nan")

    if rank == 0:
        impls_ar = ["nccl", "torch_symm_mem_one_shot", "torch_symm_mem_two_shot", "symmem_torch", "symmem_torch_op",
                    "symmem_torch_staged", "symmem_triton_one_shot"]
        impls_ar += [f"symmem_triton_one_shot_p{p}_b{b}" for p, b in triton_grids]
        impls_ag = ["nccl", "symmem_torch", "symmem_torch_staged"]
        text = []
        for op, impls in (("all_reduce", impls_ar), ("all_gather", impls_ag)):
            for mode in ("eager", "graph"):
                if any(r["op"] == op and r["mode"] == mode for r in rows):
                    text.append(_vllm_table(rows, op, mode, impls))
        text.append(f"world {world}, {gpu}, commit {commit}, {date}; wrong elements in all rows: "
                    f"{sum(r['wrong'] for r in rows)}")
        print("\n\n".join(text), flush=True)
        if args.out:
            fields = ["op", "impl", "mode", "world", "dtype", "bytes_per_rank", "count", "blocks", "time_us",
                      "time_min_us", "time_max_us", "algbw_gbs", "busbw_gbs", "wrong", "vs_nccl", "gpu", "commit",
                      "date"]
            write_results(args.out, f"torch_bench_{world}", fields, rows, "\n\n".join(text), _plot,
                          ignore_extra_keys=True)
    dist.barrier()


if __name__ == "__main__":
    main()
