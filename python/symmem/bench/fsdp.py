"""FSDP2 training step time: stock FSDP2 (NCCL) against FSDP2 with symmem's comms, in one run on the
same GPUs, at one or more model sizes (a Llama-style decoder, symmem.bench.llama).

    torchrun --nproc-per-node 2 -m symmem.bench.fsdp --out results

Rows (impl):
  nccl           stock FSDP2: NCCL all-gather and reduce-scatter
  symmem         copy-engine all-gather (no SMs) + symmem reduce-scatter (symmem.torch.fsdp.enable)
  symmem_sm      SM all-gather (algorithm auto) + symmem reduce-scatter
  symmem_ag      copy-engine all-gather + NCCL's reduce-scatter: bit-identical to nccl (wrong counts
                 any difference), the check that the all-gather moved every byte at this scale
  +bN (suffix)   enable(max_blocks=N): symmem's SM collectives take at most N blocks (default:
                 symmem.torch.fsdp.FSDP_MAX_BLOCKS), e.g. symmem+b128 (the tuning table's count)
  nccl_symm_mem  FSDP2 with set_symm_mem_for_comm, where the installed torch has it (>= 2.12)
  no_all_gather  an all-gather that moves nothing (garbage parameters, wrong = -1: not checked),
                 NCCL's reduce-scatter: the nccl step without all-gather cost
  no_all_gather_symmem_rs   the same with symmem's reduce-scatter: the symmem rows' reference
With them, each row's `all_gather_us` (the step's all-gathers alone, back to back, through the
row's comms: layers twice, the root once; copy-in and copy-out included) gives
`hidden` = 1 - (step - its reference step) / all_gather_us. The all-gathers alone run on one
stream with nothing else, so `all_gather_us` is an upper bound of their cost inside the step and
`hidden` leans high; the reference rows compute on garbage parameters.

Every row trains its own copy of the model: same initialisation, same tokens (four fixed batches
in turn: a task the model learns, so that the loss moves), bf16 parameters, AdamW, implicit
prefetch (or explicit, one layer ahead: --prefetch explicit). After `--warmup` steps per row, one
step of every row is timed in turn (ABAB...) `--steps` times (CUDA events around the step; the
slower rank's time). The CSV has the median step time with the fastest and slowest step; `wrong`
counts the steps (summed over ranks) whose loss leaves the nccl row's: the first step's at all,
the later ones by more than `--loss-rtol` x loss + `--loss-atol` (see _wrong_steps).
"""
import argparse
import datetime
import gc
import statistics

import torch
import torch.distributed as dist

from ._results import pyplot, write_results
from ._torchrun import init_nccl
from .llama import Decoder, loss_of, parameter_count
from .torch import _commit

# dim:layers:hidden (heads = dim / 128)
# The GPU must be the step's bottleneck for the comms to show: at 2048:8:5632 (0.54 B) with seq 2048
# the GPU was busy 18 ms of a 40 ms step (torch.profiler, 2 x H200): the host's Python is timed.
DEFAULT_SIZES = ["4096:8:11008", "4096:16:11008"]
COLORS = ["gray", "tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown"]


class _NoAllGather:
    """An all-gather that moves nothing (its output is garbage): the step time of a row with it is
    the step without all-gather cost, the reference for how much of the all-gathers is hidden."""

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        return None


def _all_gather_time_us(model, repeats=3):
    """The step's all-gathers alone, back to back, by the model's own comms: every layer twice
    (forward, and again in backward after resharding), the root once. Median of `repeats`."""
    from torch.distributed.fsdp import FSDPModule
    layers = [m for m in model.layers if isinstance(m, FSDPModule)]
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for module in [model, *layers, *layers]:
            module.unshard()
            module.reshard()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


class Row:
    def __init__(self, impl, size, args):
        from torch.distributed.fsdp import FSDPModule, fully_shard

        import symmem.torch.fsdp as sfsdp
        dim, layers, hidden = (int(v) for v in size.split(":"))
        self.impl, self.size = impl, size
        base, _, budget = impl.partition("+b")  # "symmem+b16": SM budget 16 blocks (enable's max_blocks)
        budget = {"max_blocks": int(budget)} if budget else {}  # else enable's default
        self.params = parameter_count(args.vocab, dim, layers, hidden)
        torch.manual_seed(0)
        with torch.device("cuda"):
            self.model = Decoder(args.vocab, dim, layers, dim // 128, hidden).to(torch.bfloat16)
        for layer in self.model.layers:
            fully_shard(layer)
        fully_shard(self.model)
        if args.prefetch == "explicit":  # each layer's all-gather issued one layer ahead
            layers = list(self.model.layers)
            for i, layer in enumerate(layers[:-1]):
                layer.set_modules_to_forward_prefetch([layers[i + 1]])
            for i, layer in enumerate(layers[1:], start=1):
                layer.set_modules_to_backward_prefetch([layers[i - 1]])
        if base == "symmem":
            sfsdp.enable(self.model, all_gather="copy_engine", **budget)
        elif base == "symmem_ag":
            sfsdp.enable(self.model, all_gather="copy_engine", reduce_scatter=False)
        elif base == "symmem_sm":
            sfsdp.enable(self.model, all_gather="auto", **budget)
        elif base in ("no_all_gather", "no_all_gather_symmem_rs"):
            if base == "no_all_gather_symmem_rs":  # symmem's reduce-scatter, as the symmem rows
                sfsdp.enable(self.model, all_gather=None, **budget)
            for m in self.model.modules():
                if isinstance(m, FSDPModule):
                    m.set_custom_all_gather(_NoAllGather())
        elif base == "nccl_symm_mem":
            for m in self.model.modules():
                if isinstance(m, FSDPModule):
                    m.set_symm_mem_for_comm()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=args.lr)
        # A learnable task (a few fixed sequences, in turn), so that the loss falls fast and a row
        # whose parameters or gradients went wrong leaves the nccl row's loss curve.
        g = torch.Generator(device="cuda").manual_seed(1000 + dist.get_rank())
        self.data = torch.randint(0, args.vocab, (4, args.batch, args.seq + 1), device="cuda", generator=g)
        self.times, self.losses = [], []

    def step(self, args, timed):
        tokens = self.data[len(self.losses) % len(self.data)]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        loss = loss_of(self.model, tokens)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        end.record()
        end.synchronize()
        self.losses.append(loss.item())
        if timed:
            self.times.append(start.elapsed_time(end) * 1000)


def _trace(rows, size, args, rank):
    """One profiled step of every row (all ranks step; rank 0 writes): a per-stream summary of the
    GPU's work (symmem.bench._trace_summary) and, for the first size, the chrome traces (gzip)."""
    import gzip
    import os
    import shutil

    from torch.profiler import ProfilerActivity, profile

    from ._trace_summary import summarize
    os.makedirs(args.trace, exist_ok=True)
    texts = []
    for row in rows:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            row.step(args, timed=False)
        if rank != 0:
            continue
        path = os.path.join(args.trace, f"trace_{size.replace(':', '_')}_{row.impl.replace('+', '_')}.json")
        prof.export_chrome_trace(path)
        texts.append(summarize(path, f"{size} {row.impl}"))
        if size == args.sizes[0] and row.impl in ("nccl", "symmem"):
            with open(path, "rb") as src, gzip.open(path + ".gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
        os.remove(path)
    if rank == 0:
        text = "\n".join(texts)
        print(text, flush=True)
        with open(os.path.join(args.trace, f"trace_summary_{size.replace(':', '_')}.txt"), "w") as f:
            f.write(text + "\n")


def _wrong_steps(losses, reference, args):
    """Steps whose loss leaves the nccl row's: the first step's exactly (its forward ran on the
    same parameters, gathered), the later ones beyond rtol + atol (the attention's and embedding's
    backward add with atomics, so even two nccl runs part by rounding after the first step)."""
    first = int(losses[0] != reference[0])
    return first + sum(abs(a - b) > args.loss_rtol * abs(b) + args.loss_atol for a, b in zip(losses[1:], reference[1:]))


def _table(results, args, world, gpu, commit, date):
    lines = [f"FSDP2 step, world {world}, {gpu}, seq {args.seq} x batch {args.batch}, bf16, {args.prefetch} "
             f"prefetch, {args.steps} interleaved steps after {args.warmup} warm-up (median ms [min, max])"]
    for size in dict.fromkeys(r["model"] for r in results):
        sel = [r for r in results if r["model"] == size]
        nccl = next(r for r in sel if r["impl"] == "nccl")["time_us"]
        lines.append(f"model {size} (dim:layers:hidden), {sel[0]['params'] / 1e9:.2f} B parameters")
        for r in sel:
            extra = (f"  all-gathers alone {r['all_gather_us'] / 1e3:.2f} ms, hidden {r['hidden']:.0%}"
                     if "hidden" in r else "")
            lines.append(f"  {r['impl']:14s} {r['time_us'] / 1e3:8.2f} [{r['time_min_us'] / 1e3:.2f}, "
                         f"{r['time_max_us'] / 1e3:.2f}]  nccl/this {nccl / r['time_us']:.3f}  wrong {r['wrong']}"
                         + extra)
    return "\n".join(lines) + f"\ncommit {commit}, {date}"


def plot(rows, path):
    """Bars: median step time per model size and impl (error bars: fastest..slowest step)."""
    plt = pyplot()
    if plt is None:
        return
    models = list(dict.fromkeys(r["model"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        sel = {r["impl"]: r for r in rows if r["model"] == model}
        names = [i for i in impls if i in sel]
        med = [float(sel[i]["time_us"]) / 1e3 for i in names]
        low = [m - float(sel[i]["time_min_us"]) / 1e3 for m, i in zip(med, names)]
        high = [float(sel[i]["time_max_us"]) / 1e3 - m for m, i in zip(med, names)]
        ax.bar(names, med, yerr=[low, high], capsize=4, color=[COLORS[impls.index(i) % len(COLORS)] for i in names])
        nccl = float(sel["nccl"]["time_us"]) / 1e3 if "nccl" in sel else None
        for x, m in enumerate(med):
            ax.text(x, m, f"{m:.1f}" + (f"\n{nccl / m:.3f}x" if nccl else ""), ha="center", va="bottom", fontsize=8)
        ax.set_title(f"{model} ({float(next(iter(sel.values()))['params']) / 1e9:.2f} B params)")
        ax.set_ylabel("ms per step (median; bars: min..max)")
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.suptitle(f"FSDP2 step, world {rows[0]['world']}, {rows[0]['gpu']}, commit {rows[0]['commit']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="directory for the CSV and the table")
    parser.add_argument("--sizes", nargs="*", default=DEFAULT_SIZES, help="dim:layers:hidden, one per model size")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1e-4, help="AdamW's (1e-3 diverges at 4096 wide)")
    parser.add_argument("--loss-rtol", type=float, default=1e-2)
    parser.add_argument("--loss-atol", type=float, default=2e-2,
                        help="absolute loss tolerance (the loss nears 0 as the task is learnt: rounding)")
    parser.add_argument("--prefetch", choices=["implicit", "explicit"], default="implicit",
                        help="FSDP2's prefetch: implicit (as issued), or explicit one layer ahead")
    parser.add_argument("--trace", default=None,
                        help="directory: profile one more step of every row, write what each stream did")
    parser.add_argument("--impls", nargs="*", default=["nccl", "symmem", "symmem+b128", "symmem_sm", "nccl_symm_mem",
                                                       "no_all_gather", "no_all_gather_symmem_rs"])
    args = parser.parse_args(argv)

    init_nccl()
    rank, world = dist.get_rank(), dist.get_world_size()
    from torch.distributed.fsdp import FSDPModule
    impls = [i for i in args.impls if i != "nccl_symm_mem" or hasattr(FSDPModule, "set_symm_mem_for_comm")]

    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    commit, gpu = _commit(), torch.cuda.get_device_name()
    results = []
    for size in args.sizes:
        rows = [Row(impl, size, args) for impl in impls]
        for row in rows:
            for _ in range(args.warmup):
                row.step(args, timed=False)
        for _ in range(args.steps):  # interleaved: one step of every row per round
            for row in rows:
                row.step(args, timed=True)
        if args.trace:
            _trace(rows, size, args, rank)
        reference = next(r for r in rows if r.impl == "nccl").losses
        if rank == 0:  # every third loss of each row, to see how far rounding moves them
            for row in rows:
                print(f"losses {size} {row.impl}: " + " ".join(f"{v:.4f}" for v in row.losses[::3]), flush=True)
        free = {r.impl: r for r in rows if r.impl.startswith("no_all_gather")}
        for row in rows:
            stats = torch.tensor([statistics.median(row.times), min(row.times), max(row.times)], dtype=torch.float64,
                                 device="cuda")
            dist.all_reduce(stats, op=dist.ReduceOp.MAX)
            w = torch.tensor([_wrong_steps(row.losses, reference, args)], device="cuda")
            dist.all_reduce(w)
            baseline = row.impl.startswith("no_all_gather")
            gc.collect()  # the previous rows' heap buffers go back before the all-gathers alone lend more
            torch.cuda.empty_cache()
            ag = torch.tensor([_all_gather_time_us(row.model) if not baseline else 0.0],
                              dtype=torch.float64, device="cuda")
            dist.all_reduce(ag, op=dist.ReduceOp.MAX)
            results.append({"op": "fsdp2_step", "impl": row.impl, "world": world, "model": size,
                            "params": row.params, "bytes_per_rank": row.params * 2 // world,
                            "time_us": stats[0].item(), "time_min_us": stats[1].item(),
                            "time_max_us": stats[2].item(),
                            "wrong": int(w.item()) if not baseline else -1,
                            "all_gather_us": ag.item(), "gpu": gpu, "commit": commit, "date": date})
        # Exposed all-gather cost: the step against the step with free all-gathers and the same
        # reduce-scatter (NCCL's for the nccl row, symmem's for the symmem rows).
        for r in results:
            if r["model"] != size or r["all_gather_us"] <= 0:
                continue
            budget = r["impl"].partition("+b")[2]
            nccl_rs = r["impl"].startswith("nccl") or r["impl"] == "symmem_ag"
            base = free.get("no_all_gather" if nccl_rs else
                            "no_all_gather_symmem_rs" + (f"+b{budget}" if budget else ""))
            if base is not None:
                base_us = next(x for x in results if x["model"] == size and x["impl"] == base.impl)["time_us"]
                r["hidden"] = max(0.0, 1.0 - max(r["time_us"] - base_us, 0.0) / r["all_gather_us"])
        del rows, free
        gc.collect()  # FSDP modules hold reference cycles: collect them so their memory returns
        torch.cuda.empty_cache()
        if rank == 0:  # after every size, so that a size that fails keeps the ones before it
            text = _table(results, args, world, gpu, commit, date)
            print(text, flush=True)
            if args.out:
                fields = ["op", "impl", "world", "model", "params", "bytes_per_rank", "time_us", "time_min_us",
                          "time_max_us", "wrong", "all_gather_us", "hidden", "gpu", "commit", "date"]
                write_results(args.out, f"fsdp_step_{world}", fields, results, text, plot)
    dist.barrier()


if __name__ == "__main__":
    main()
