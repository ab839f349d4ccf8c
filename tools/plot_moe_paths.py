"""The MoE combine's two pulls side by side: symmem.bench.moe CSVs of runs with SYMMEM_MOE_COMBINE=registers
and =bulk (session step moe_paths), each with its reference rows, merged into one CSV (column `path`)
and one bar plot of the combine rows (median, with min-max whiskers).

    python3 tools/plot_moe_paths.py OUT_DIR registers=moe_registers_2/moe_2.csv bulk=moe_bulk_2/moe_2.csv
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    out_dir, sources = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
    rows = []
    for path, csv_path in sources:
        with open(csv_path) as f:
            for r in csv.DictReader(f):
                rows.append({"path": path, **r})
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "moe_combine_paths.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    combine = [r for r in rows if r["op"] == "combine"]
    groups = list(dict.fromkeys((r["shape"], r["payload"], r["mode"]) for r in combine))
    bars = list(dict.fromkeys((r["impl"], r["path"]) for r in combine))
    fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups), 4.5), squeeze=False)
    for ax, (shape, payload, mode) in zip(axes[0], groups):
        for i, (impl, path) in enumerate(bars):
            got = [r for r in combine if (r["shape"], r["payload"], r["mode"], r["impl"], r["path"]) ==
                   (shape, payload, mode, impl, path)]
            if not got:
                continue
            t, lo, hi = (float(got[0][k]) for k in ("time_us", "time_min_us", "time_max_us"))
            ax.bar(i, t, yerr=[[t - lo], [hi - t]], label=f"{impl} ({path} run)", color=f"C{i}")
        ax.set_title(f"{shape} {payload}\n{mode}", fontsize=8)
        ax.set_xticks([])
        ax.set_ylabel("combine, us (median, min-max)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7)
    gpu, commit = combine[0]["gpu"], combine[0]["commit"]
    fig.suptitle(f"MoE combine, registers vs bulk pull: world {combine[0]['world']}, {gpu}, commit {commit}")
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    fig.savefig(os.path.join(out_dir, "moe_combine_paths.png"), dpi=110)


if __name__ == "__main__":
    main()
