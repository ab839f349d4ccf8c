#!/usr/bin/env python3
"""A/B figure from interleaved symmem-bench runs: the median time of one implementation per size
for configuration A and B (each a set of CSVs, one per repetition), and B / A.

usage: plot_ab.py --impl symmem_auto --a 'pdl on' 'dir/vllm_graph_pdl1_*.csv' --b 'pdl off' 'dir/vllm_graph_pdl0_*.csv' --out ab.png
"""
import argparse
import collections
import csv
import glob
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def medians(pattern, impl):
    times = collections.defaultdict(list)
    for path in sorted(glob.glob(pattern)):
        for row in csv.DictReader(open(path)):
            if row["impl"] == impl and int(row["wrong"]) == 0:
                times[int(row["bytes_per_rank"])].append(float(row["time_us"]))
    return {b: (statistics.median(t), min(t), max(t)) for b, t in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", required=True)
    parser.add_argument("--a", nargs=2, required=True, metavar=("LABEL", "GLOB"))
    parser.add_argument("--b", nargs=2, required=True, metavar=("LABEL", "GLOB"))
    parser.add_argument("--title", default="")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    a, b = medians(args.a[1], args.impl), medians(args.b[1], args.impl)
    sizes = sorted(set(a) & set(b))
    if not sizes:
        raise SystemExit("no size is in both sets")
    mib = [s / 2**20 for s in sizes]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    for label, data in ((args.a[0], a), (args.b[0], b)):
        med = [data[s][0] for s in sizes]
        err = [[data[s][0] - data[s][1] for s in sizes], [data[s][2] - data[s][0] for s in sizes]]
        top.errorbar(mib, med, yerr=err, marker="o", capsize=3, label=label)
    top.set_xscale("log", base=2)
    top.set_yscale("log")
    top.set_ylabel("us per call (median; bars: min..max)")
    top.set_title(args.title or f"{args.impl}: {args.a[0]} vs {args.b[0]}")
    top.grid(True, which="both", alpha=0.3)
    top.legend()
    bottom.plot(mib, [a[s][0] / b[s][0] for s in sizes], marker="o")
    bottom.axhline(1.0, color="gray", lw=0.8)
    bottom.set_ylabel(f"{args.a[0]} / {args.b[0]}")
    bottom.set_xlabel("MiB per rank")
    bottom.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    for s in sizes:
        print(f"{s / 2**20:8.2f} MiB  {args.a[0]} {a[s][0]:8.2f}  {args.b[0]} {b[s][0]:8.2f}  ratio {a[s][0] / b[s][0]:.3f}")


if __name__ == "__main__":
    main()
