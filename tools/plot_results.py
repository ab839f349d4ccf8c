#!/usr/bin/env python3
"""Turns symmem-bench CSV files into PNG figures.

usage: plot_results.py results.csv [more.csv ...] --out DIR

Figures (each made when the CSVs hold the rows it needs):
  all_gather_busbw_vs_sms_<size>.png   busbw against the SM (block) budget at one per-rank size:
                                       one line per implementation; the copy engine and NCCL's
                                       own choice are flat lines (NCCL at fixed CTA counts is a line)
  all_gather_latency_vs_size.png       time per call against size, best block count per algorithm; the
                                       bars span the fastest to the slowest batch (time_min_us ..
                                       time_max_us) where the CSV has them
  all_gather_busbw_vs_size.png         busbw against size, same rows
  all_reduce_latency_vs_size.png       likewise for all_reduce / reduce_scatter / all_to_all (one CSV
                                       of one mode and split pattern at a time)
  reduce_scatter_busbw_vs_size.png
  overlap.png                          the overlap benchmark's bars (GEMM alone, sequential, overlapped)
  host_cost_<size>.png                 symmem-bench host_cost: host us per call per layer, min..max whiskers
  chunked_gemm_<dtype>.png             symmem-bench chunked_gemm: each row-block layout over one GEMM, per shape
"""
import argparse
import collections
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def size_label(b):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)


def read_rows(paths):
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(line for line in f if not line.startswith("#")):
                for key in ("bytes_per_rank", "count", "blocks", "world"):
                    row[key] = int(row[key])
                for key in ("time_us", "busbw_gbs", "algbw_gbs"):
                    row[key] = float(row[key])
                for key in ("time_min_us", "time_max_us"):  # the spread; older CSVs lack it
                    row[key] = float(row[key]) if row.get(key) not in (None, "") else None
                rows.append(row)
    return rows


def title_of(rows, what):
    r = rows[0]
    return f"{what}: {r['world']} x {r['gpu']}, {r['dtype']}"


def save(fig, out, name):
    """Writes the figure as out/name and closes it; returns the name."""
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=110)
    plt.close(fig)
    return name


def whiskers(r):
    """How far the fastest and slowest batch lie below and above the row's median (0 if unknown)."""
    return r["time_us"] - (r["time_min_us"] or r["time_us"]), (r["time_max_us"] or r["time_us"]) - r["time_us"]


def busbw_vs_sms(rows, out):
    made = []
    by_size = collections.defaultdict(list)
    for r in rows:
        by_size[r["bytes_per_rank"]].append(r)
    for size, rs in sorted(by_size.items()):
        lines = collections.defaultdict(dict)  # impl -> blocks -> best busbw
        flat = {}
        for r in rs:
            impl = r["impl"]
            if impl == "symmem_auto":
                continue
            if impl in ("symmem_copy_engine", "nccl_ce") or (impl.startswith("nccl") and r["blocks"] < 0):
                flat[impl] = max(flat.get(impl, 0), r["busbw_gbs"])
            elif r["blocks"] > 0:
                b = lines[impl]
                b[r["blocks"]] = max(b.get(r["blocks"], 0), r["busbw_gbs"])
        if not any(len(v) > 1 for v in lines.values()):
            continue  # no SM sweep at this size
        fig, ax = plt.subplots(figsize=(7, 4.5))
        xmax = max(max(v) for v in lines.values())
        for impl, points in sorted(lines.items()):
            xs = sorted(points)
            ax.plot(xs, [points[x] for x in xs], marker="o", label=impl)
        for impl, value in sorted(flat.items()):
            style = "-" if impl.startswith("symmem") else "--"
            label = f"{impl} (0 SMs)" if impl in ("symmem_copy_engine", "nccl_ce") else f"{impl} (own choice)"
            ax.plot([0, xmax], [value, value], style, label=label)  # next colour of the cycle
        ax.set_xlabel("SMs (thread blocks) used by the all-gather")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(title_of(rs, f"all_gather {size_label(size)} per rank"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        made.append(save(fig, out, f"all_gather_busbw_vs_sms_{size_label(size)}.png"))
    return made


def by_size_plot(rows, op, metric, out):
    best = collections.defaultdict(dict)  # impl -> size -> best row
    for r in rows:
        impl = r["impl"] if r["mode"] == "eager" else f"{r['impl']} (graph)"
        cur = best[impl].get(r["bytes_per_rank"])
        value = r[metric]
        better = cur is None or (value < cur[metric] if metric == "time_us" else value > cur[metric])
        if better:
            best[impl][r["bytes_per_rank"]] = r
    if not best:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for impl, points in sorted(best.items()):
        xs = sorted(points)
        ys = [points[x][metric] for x in xs]
        style = "--" if impl.startswith("nccl") else "-"
        spread = metric == "time_us" and all(points[x]["time_min_us"] is not None for x in xs)
        if spread:
            yerr = [[y - points[x]["time_min_us"] for x, y in zip(xs, ys)],
                    [points[x]["time_max_us"] - y for x, y in zip(xs, ys)]]
            ax.errorbar(xs, ys, yerr=yerr, fmt=style, marker=".", capsize=2, label=impl)
        else:
            ax.plot(xs, ys, style, marker=".", label=impl)
    ax.set_xscale("log", base=2)
    if metric == "time_us":
        ax.set_yscale("log")
    ax.set_xlabel("bytes per rank" if op != "all_reduce" else "bytes")
    ax.set_ylabel("time per call (us)" if metric == "time_us" else "bus bandwidth (GB/s)")
    ax.set_title(title_of(rows, op))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return [save(fig, out, f"{op}_{'latency' if metric == 'time_us' else 'busbw'}_vs_size.png")]


def overlap_bars(rows, out):
    rows = [r for r in rows if not r["impl"].startswith("allgather_alone")] + \
           [r for r in rows if r["impl"].startswith("allgather_alone")]
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.5))
    names = [r["impl"] for r in rows]
    values = [r["time_us"] / 1000 for r in rows]
    colors = ["tab:gray" if n == "gemm_alone" else "tab:blue" if "symmem" in n else "tab:orange" for n in names]
    ax.barh(names, values, color=colors)
    gemm = next((r["time_us"] for r in rows if r["impl"] == "gemm_alone"), None)
    for i, r in enumerate(rows):
        text = f"{r['time_us'] / 1000:.3f} ms" + (f"  ({r['time_us'] / gemm:.3f}x GEMM)" if gemm else "")
        ax.text(values[i], i, " " + text, va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_xlim(0, max(values) * 1.45)
    ax.set_title(title_of(rows, "GEMM + all-gather overlap"))
    return [save(fig, out, "overlap.png")]


def host_cost_bars(rows, out):
    """One figure per size: host microseconds per call, bars from the median, whiskers min..max."""
    made = []
    for size in sorted({r["bytes_per_rank"] for r in rows}):
        sized = [r for r in rows if r["bytes_per_rank"] == size]
        names = [f"{r['op'].removeprefix('host_cost_')}: {r['impl']}" for r in sized]
        values = [r["time_us"] for r in sized]
        low, high = zip(*(whiskers(r) for r in sized))
        colors = ["tab:gray" if r["impl"].startswith("empty") else "tab:blue" if "symmem" in r["impl"] else "tab:orange"
                  for r in sized]
        fig, ax = plt.subplots(figsize=(8, 0.32 * len(sized) + 1.5))
        ax.barh(names, values, xerr=[low, high], color=colors, capsize=2)
        for i, v in enumerate(values):
            ax.text(v, i, f"  {v:.2f}", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("host time to issue one call (us), GPU held busy")
        ax.set_title(title_of(sized, f"host cost per call, {size_label(size)} per rank"))
        made.append(save(fig, out, f"host_cost_{size_label(size)}.png"))
    return made


def chunked_gemm_bars(rows, out):
    """Per type: time of each chunked layout over gemm_alone, grouped by shape, min..max whiskers."""
    made = []
    for dtype in sorted({r["dtype"] for r in rows}):
        typed = [r for r in rows if r["dtype"] == dtype]
        shapes = sorted({r["op"].removeprefix("chunked_gemm_") for r in typed}, key=lambda s: int(s.split("x")[0]))
        layouts = [i for i in dict.fromkeys(r["impl"] for r in typed) if i != "gemm_alone"]
        fig, ax = plt.subplots(figsize=(9, 4))
        width = 0.8 / max(1, len(layouts))
        for j, layout in enumerate(layouts):
            xs, ys, lo, hi = [], [], [], []
            for i, shape in enumerate(shapes):
                base = next(r for r in typed if r["op"].endswith(shape) and r["impl"] == "gemm_alone")["time_us"]
                r = next((r for r in typed if r["op"].endswith(shape) and r["impl"] == layout), None)
                if r is None:
                    continue
                xs.append(i + (j - len(layouts) / 2 + 0.5) * width)
                ys.append(r["time_us"] / base)
                below, above = whiskers(r)
                lo.append(below / base)
                hi.append(above / base)
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=layout)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(shapes)
        ax.set_ylim(0.9, None)
        ax.set_ylabel("time / one GEMM (gemm_alone)")
        ax.set_xlabel("MxNxK (row-major C = A B)")
        ax.legend(fontsize=7, ncol=3)
        ax.set_title(title_of(typed, "GEMM in row blocks vs one GEMM"))
        made.append(save(fig, out, f"chunked_gemm_{dtype}.png"))
    return made


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+")
    parser.add_argument("--out", default=".")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rows = read_rows(args.csv)
    ops = collections.defaultdict(list)
    for r in rows:
        ops[r["op"]].append(r)
    made = []
    if ops["all_gather"]:
        made += busbw_vs_sms(ops["all_gather"], args.out)
        made += by_size_plot(ops["all_gather"], "all_gather", "time_us", args.out)
        made += by_size_plot(ops["all_gather"], "all_gather", "busbw_gbs", args.out)
    for op in ("all_reduce", "reduce_scatter", "all_to_all"):
        if ops[op]:
            made += by_size_plot(ops[op], op, "time_us", args.out)
            made += by_size_plot(ops[op], op, "busbw_gbs", args.out)
    if ops["overlap"]:
        made += overlap_bars(ops["overlap"], args.out)
    chunked = [r for r in rows if r["op"].startswith("chunked_gemm_")]
    if chunked:
        made += chunked_gemm_bars(chunked, args.out)
    host_cost = [r for r in rows if r["op"].startswith("host_cost_")]
    if host_cost:
        made += host_cost_bars(host_cost, args.out)
    for name in made:
        print(os.path.join(args.out, name))
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
