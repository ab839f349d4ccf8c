"""FSDP2 training step time: stock FSDP2 (NCCL) against FSDP2 with symmem's comms, in one run on the
same GPUs, at one or more model sizes (a Llama-style decoder, symmem.bench.llama).

    torchrun --nproc-per-node 2 -m symmem.bench.fsdp --out bench/results/h200/fsdp

Rows (impl):
  nccl           stock FSDP2: NCCL all-gather and reduce-scatter
  symmem         copy-engine all-gather (no SMs) + symmem reduce-scatter (symmem.torch.fsdp.enable)
  symmem_sm      SM all-gather (algorithm auto) + symmem reduce-scatter
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
prefetch. After `--warmup` steps per row, one step of every row is timed in turn
(ABAB...) `--steps` times (CUDA events around the step; the slower rank's time). The CSV has the
median step time with the fastest and slowest step; `wrong` counts the steps whose loss differs
from the nccl row's by more than `--loss-rtol` (relative).
"""
import argparse
import datetime
import statistics

import torch
import torch.distributed as dist

from ._results import write_results
from ._torchrun import init_nccl
from .llama import Decoder, loss_of, parameter_count
from .torch import _commit

# dim:layers:hidden (heads = dim / 128)
DEFAULT_SIZES = ["2048:8:5632", "4096:8:11008", "4096:16:11008"]
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
        self.params = parameter_count(args.vocab, dim, layers, hidden)
        torch.manual_seed(0)
        with torch.device("cuda"):
            self.model = Decoder(args.vocab, dim, layers, dim // 128, hidden).to(torch.bfloat16)
        for layer in self.model.layers:
            fully_shard(layer)
        fully_shard(self.model)
        if impl == "symmem":
            sfsdp.enable(self.model, all_gather="copy_engine")
        elif impl == "symmem_sm":
            sfsdp.enable(self.model, all_gather="auto")
        elif impl in ("no_all_gather", "no_all_gather_symmem_rs"):
            if impl == "no_all_gather_symmem_rs":
                sfsdp.enable(self.model, all_gather=None)  # symmem's reduce-scatter, as the symmem rows
            for m in self.model.modules():
                if isinstance(m, FSDPModule):
                    m.set_custom_all_gather(_NoAllGather())
        elif impl == "nccl_symm_mem":
            for m in self.model.modules():
                if isinstance(m, FSDPModule):
                    m.set_symm_mem_for_comm()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
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


def plot(rows, path):
    """Bars: median step time per model size and impl (error bars: fastest..slowest step)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    models = list(dict.fromkeys(r["model"] for r in rows))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 4), squeeze=False)
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
    parser.add_argument("--loss-rtol", type=float, default=1e-2)
    parser.add_argument("--impls", nargs="*", default=["nccl", "symmem", "symmem_sm", "nccl_symm_mem", "no_all_gather",
                                                       "no_all_gather_symmem_rs"])
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
        reference = next(r for r in rows if r.impl == "nccl").losses
        free = {r.impl: r for r in rows if r.impl.startswith("no_all_gather")}
        for row in rows:
            stats = torch.tensor([statistics.median(row.times), min(row.times), max(row.times)], dtype=torch.float64,
                                 device="cuda")
            dist.all_reduce(stats, op=dist.ReduceOp.MAX)
            wrong = sum(abs(a - b) > args.loss_rtol * abs(b) for a, b in zip(row.losses, reference))
            w = torch.tensor([wrong], device="cuda")
            dist.all_reduce(w)
            baseline = row.impl.startswith("no_all_gather")
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
            base = free.get("no_all_gather" if r["impl"] == "nccl" else "no_all_gather_symmem_rs")
            if base is not None:
                base_us = next(x for x in results if x["model"] == size and x["impl"] == base.impl)["time_us"]
                r["hidden"] = max(0.0, 1.0 - max(r["time_us"] - base_us, 0.0) / r["all_gather_us"])
        del rows
        torch.cuda.empty_cache()

    if rank == 0:
        lines = [f"FSDP2 step, world {world}, {gpu}, seq {args.seq} x batch {args.batch}, bf16, "
                 f"{args.steps} interleaved steps after {args.warmup} warm-up (median ms [min, max])"]
        for size in args.sizes:
            sel = [r for r in results if r["model"] == size]
            nccl = next(r for r in sel if r["impl"] == "nccl")["time_us"]
            lines.append(f"model {size} (dim:layers:hidden), {sel[0]['params'] / 1e9:.2f} B parameters")
            for r in sel:
                extra = (f"  all-gathers alone {r['all_gather_us'] / 1e3:.2f} ms, hidden {r['hidden']:.0%}"
                         if "hidden" in r else "")
                lines.append(f"  {r['impl']:14s} {r['time_us'] / 1e3:8.2f} [{r['time_min_us'] / 1e3:.2f}, "
                             f"{r['time_max_us'] / 1e3:.2f}]  nccl/this {nccl / r['time_us']:.3f}  wrong {r['wrong']}"
                             + extra)
        text = "\n".join(lines) + f"\ncommit {commit}, {date}"
        print(text, flush=True)
        if args.out:
            fields = ["op", "impl", "world", "model", "params", "bytes_per_rank", "time_us", "time_min_us",
                      "time_max_us", "wrong", "all_gather_us", "hidden", "gpu", "commit", "date"]
            write_results(args.out, f"fsdp_step_{world}", fields, results, text, plot)
    dist.barrier()


if __name__ == "__main__":
    main()
