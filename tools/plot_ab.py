"""An A/B plot: per row, the samples of each side (two binaries or trees interleaved in one run) as
points with their median, from a CSV with one sample per line.

    python3 tools/plot_ab.py CSV OUT.png --row row --side tree --value host_us [--title ...]
    python3 tools/plot_ab.py host_cost_ab.csv out.png --row impl --side binary --value time_us \\
        --filter bytes_per_rank=1024
"""
import argparse
import csv
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("csv")
    p.add_argument("png")
    p.add_argument("--row", required=True)
    p.add_argument("--side", required=True)
    p.add_argument("--value", required=True)
    p.add_argument("--filter", action="append", default=[], help="COLUMN=VALUE: keep only these lines")
    p.add_argument("--title", default="")
    a = p.parse_args()
    keep = [f.split("=", 1) for f in a.filter]
    samples = {}
    with open(a.csv) as f:
        for r in csv.DictReader(f):
            if any(r.get(k) != v for k, v in keep) or r.get(a.value) in ("", None, "nan"):
                continue
            samples.setdefault(r[a.row], {}).setdefault(r[a.side], []).append(float(r[a.value]))
    rows = sorted(samples)
    sides = sorted({s for by in samples.values() for s in by})
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 1.5))
    for j, side in enumerate(sides):
        for i, row in enumerate(rows):
            v = samples[row].get(side, [])
            y = i + (j - (len(sides) - 1) / 2) * 0.3
            ax.scatter(v, [y] * len(v), s=10, alpha=0.5, color=f"C{j}", label=side if i == 0 else None)
            if v:
                ax.plot([statistics.median(v)] * 2, [y - 0.12, y + 0.12], color=f"C{j}", linewidth=3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=8)
    ax.set_xlabel(f"{a.value} (points: samples; bars: medians)")
    ax.set_title(a.title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(a.png, dpi=120)


if __name__ == "__main__":
    main()
