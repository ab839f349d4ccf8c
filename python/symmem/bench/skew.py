"""What a late rank costs an all-reduce beyond its lateness, in microseconds: NCCL against symmem.

Every sample: every rank queues a sleep of `--lead-ms` on its stream (so its call is queued on the
GPU before anything runs, whatever its host does), the last rank sleeps `skew` longer, then each
rank issues the call (eagerly, or as the replay of a graph holding it). Rank 0 times from the end of
its sleep to the end of its call: the wait for the late rank plus the call. The excess is that time
less the skew the last rank measured around its extra sleep and less the row's median at skew 0:
what waiting itself cost. The GPUs share no clock: each rank's sleep starts when its host leaves the
barrier, so a sample also holds that start jitter (tens of microseconds, either sign; the skew-0
median removes only its typical value), NCCL's rows as much as symmem's. A wait that costs more
than the lateness it waits for shows up as hundreds of microseconds no row of NCCL's has.

Rows: nccl (torch.distributed on NCCL), symmem_torch (the drop-in on a symmetric tensor, zero
copy), symmem_torch_staged (TPAllReduce on a caching-allocator tensor, staged). Inputs are small
integers (exact bf16 sums in any order); every sample's output is checked, a wrong one fails the run.
Skews and rows are interleaved, `--reps` samples each; rank 0 reports medians with min and max.

    torchrun --nproc-per-node 2 -m symmem.bench.skew --out bench/results/h200x2 --stem skew_2
"""
import argparse
import csv
import datetime
import os
import statistics
import sys

import torch
import torch.distributed as dist

from ._results import pyplot, write_results
from ._torchrun import init_nccl
from .torch import _commit

DTYPE = torch.bfloat16
FIELDS = ["date", "commit", "gpu", "world", "row", "mode", "bytes", "skew_us", "reps", "us_median", "us_min",
          "us_max", "excess_us_median", "excess_us_max"]


def sleep_cycles_per_us():
    """torch.cuda._sleep's cycles per microsecond on this GPU, measured (clocks vary)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / (start.elapsed_time(end) * 1000.0)


def _sleep_us(us, cycles_per_us):
    if us > 0:
        torch.cuda._sleep(int(us * cycles_per_us))


class Row:
    """One implementation at one size: `call()` issues it, `refill()` restores its input (queued on
    the stream; in-place rows overwrite it), `output()` is the result to check."""

    def __init__(self, name, call, refill, output):
        self.name, self.call, self.refill, self.output = name, call, refill, output


def rows_at(n, rank, world):
    """The rows at `n` bf16 elements per rank and the exact result every row must give."""
    import symmem.torch as st
    base = (torch.arange(n, device="cuda") % 7).to(DTYPE)
    mine = base * (rank + 1)
    expected = base * (world * (world + 1) // 2)
    x_nccl = torch.empty(n, dtype=DTYPE, device="cuda")
    x_sym = st.empty(n, dtype=DTYPE)
    x_staged = mine.clone()
    y_staged = torch.empty(n, dtype=DTYPE, device="cuda")
    tp = st.TPAllReduce(dist.group.WORLD, max_size=n * 2)

    def staged():
        if tp.all_reduce(x_staged, out=y_staged) is None:
            raise RuntimeError(f"TPAllReduce does not take {n} bf16 elements: nothing of symmem to measure")
    rows = [Row("nccl", lambda: dist.all_reduce(x_nccl), lambda: x_nccl.copy_(mine), lambda: x_nccl),
            Row("symmem_torch", lambda: st.all_reduce(x_sym), lambda: x_sym.copy_(mine), lambda: x_sym),
            Row("symmem_torch_staged", staged, lambda: None, lambda: y_staged)]
    return rows, expected


def graph_of(row):
    """A CUDA graph of one call of the row, warmed up outside capture first."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        row.refill()
        row.call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        row.call()
    torch.cuda.synchronize()
    return graph


def sample(row, graph, skew_us, lead_us, cycles_per_us, late):
    """(rank 0's microseconds from the end of its lead to the end of its call, the skew the late rank
    slept); the output is left for the caller to check."""
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    skew_start, skew_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    row.refill()
    _sleep_us(lead_us, cycles_per_us)
    start.record()
    if late:
        skew_start.record()
        _sleep_us(skew_us, cycles_per_us)
        skew_end.record()
    if graph is not None:
        graph.replay()
    else:
        row.call()
    end.record()
    end.synchronize()
    slept = skew_start.elapsed_time(skew_end) * 1000.0 if late and skew_us > 0 else 0.0
    return start.elapsed_time(end) * 1000.0, slept


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="32K,128K,512K,4M", help="bytes per rank (K, M suffixes)")
    p.add_argument("--skews-us", default="0,500,2000,5000")
    p.add_argument("--lead-ms", type=float, default=5.0)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", default=".")
    p.add_argument("--stem", default=None)
    p.add_argument("--replot", nargs="+", metavar="CSV",
                   help="no measurement: the figure of these CSVs (e.g. runs of two commits) as OUT/STEM.png")
    args = p.parse_args()
    if args.replot:
        _plot([r for path in args.replot for r in csv.DictReader(open(path))],
              os.path.join(args.out, f"{args.stem or 'skew'}.png"))
        return
    init_nccl()
    rank, world = dist.get_rank(), dist.get_world_size()
    late = rank == world - 1
    sizes = [int(s[:-1]) * {"K": 1 << 10, "M": 1 << 20}[s[-1]] if s[-1] in "KM" else int(s)
             for s in args.sizes.split(",")]
    skews = [float(s) for s in args.skews_us.split(",")]
    if 0.0 not in skews:
        skews = [0.0] + skews  # the baseline the excess is measured from
    cycles_per_us = sleep_cycles_per_us()
    lead_us = args.lead_ms * 1000.0
    samples = {}  # (row, mode, bytes, skew) -> [(us, slept)]
    wrong = 0
    for nbytes in sizes:
        rows, expected = rows_at(nbytes // 2, rank, world)
        graphs = {row.name: graph_of(row) for row in rows}
        for rep in range(args.reps):
            for skew in (skews if rep % 2 == 0 else list(reversed(skews))):
                for mode in ("eager", "graph"):
                    for row in (rows if rep % 2 == 0 else list(reversed(rows))):
                        row.output().fill_(float("nan"))
                        us, slept = sample(row, graphs[row.name] if mode == "graph" else None, skew, lead_us,
                                            cycles_per_us, late)
                        if not torch.equal(row.output(), expected):
                            wrong += 1
                            print(f"rank {rank}: {row.name} {mode} {nbytes} B skew {skew} us: wrong result",
                                  file=sys.stderr)
                        samples.setdefault((row.name, mode, nbytes, skew), []).append((us, slept))
        del graphs
    by_key = gathered(samples)
    wrong_all = torch.tensor([wrong], device="cuda")
    dist.all_reduce(wrong_all)
    if rank == 0:
        report(by_key, args, world, int(wrong_all.item()), torch.cuda.get_device_name())
    dist.barrier()
    dist.destroy_process_group()
    if int(wrong_all.item()):
        sys.exit(1)


def gathered(samples, device="cuda"):
    """{key: ([rank 0's us], [the late rank's slept us])} from every rank's {key: [(us, slept)]}: rank
    0 times the calls, the last rank sleeps the skew. Collective: every rank passes the same keys,
    each with as many samples."""
    world = dist.get_world_size()
    keys = sorted(samples)
    flat = torch.tensor([[v for pair in samples[k] for v in pair] for k in keys], dtype=torch.float64, device=device)
    every = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(every, flat)
    times = every[0].cpu().reshape(len(keys), -1, 2)[:, :, 0]
    slept = every[world - 1].cpu().reshape(len(keys), -1, 2)[:, :, 1]
    return {k: (times[i].tolist(), slept[i].tolist()) for i, k in enumerate(keys)}


def excess_us(times, slept, base):
    """What each sample waited beyond the late rank's sleep and the unskewed median `base`."""
    return [t - s - base for t, s in zip(times, slept)]


def report(by_key, args, world, wrong, gpu):
    """The table, CSV and figure of {(row, mode, bytes, skew_us): ([rank 0's us], [late rank's slept us])}."""
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    commit = _commit()
    rows = []
    for (name, mode, nbytes, skew), (us, slept) in sorted(by_key.items()):
        base = statistics.median(by_key[(name, mode, nbytes, 0.0)][0])
        excess = excess_us(us, slept, base)
        rows.append({"date": date, "commit": commit, "gpu": gpu, "world": world, "row": name, "mode": mode,
                     "bytes": nbytes, "skew_us": skew, "reps": len(us), "us_median": statistics.median(us),
                     "us_min": min(us), "us_max": max(us), "excess_us_median": statistics.median(excess),
                     "excess_us_max": max(excess)})
    lines = [f"# {date} {gpu} x {world}, commit {commit or 'unknown'}, lead {args.lead_ms} ms, {args.reps} reps; "
             f"excess = us - late rank's measured sleep - median at skew 0",
             f"{'row':22} {'mode':6} {'bytes':>8} {'skew us':>8} {'us med':>9} {'us max':>9} {'excess med':>11} "
             f"{'excess max':>11}"]
    for r in rows:
        lines.append(f"{r['row']:22} {r['mode']:6} {r['bytes']:>8} {r['skew_us']:>8.0f} {r['us_median']:>9.1f} "
                     f"{r['us_max']:>9.1f} {r['excess_us_median']:>11.1f} {r['excess_us_max']:>11.1f}")
    lines.append(f"wrong results: {wrong}")
    text = "\n".join(lines)
    print(text)
    write_results(args.out, args.stem or f"skew_{world}", FIELDS, rows, text, _plot)


def _plot(rows, path):
    """Median excess against skew, one panel per mode and size, one line per row (per row and commit
    when the rows come from several commits; repeated runs: the median of their medians)."""
    plt = pyplot()
    if plt is None:
        return
    several = len({r["commit"] for r in rows}) > 1
    points = {}  # (line, mode, bytes) -> {skew: [excess medians]}
    for r in rows:
        line = f"{r['row']} @ {r['commit']}" if several else r["row"]
        points.setdefault((line, r["mode"], int(r["bytes"])), {}).setdefault(float(r["skew_us"]), []).append(
            float(r["excess_us_median"]))
    sizes = sorted({k[2] for k in points})
    fig, axes = plt.subplots(2, len(sizes), figsize=(4.5 * len(sizes), 7.5), squeeze=False)
    for i, mode in enumerate(("eager", "graph")):
        for j, nbytes in enumerate(sizes):
            ax = axes[i][j]
            for (line, m, b), by_skew in sorted(points.items()):
                if m == mode and b == nbytes:
                    skews = sorted(by_skew)
                    ax.plot(skews, [statistics.median(by_skew[k]) for k in skews], marker="o", label=line)
            ax.set_title(f"{mode}, {nbytes // 1024} KiB, world {rows[0]['world']}")
            ax.set_xlabel("skew of the last rank (us)")
            ax.set_ylabel("excess (us, median)")
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    main()
