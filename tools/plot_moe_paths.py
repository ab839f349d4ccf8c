"""symmem.bench.moe runs side by side, each with its own reference rows: the combine's two pulls
(SYMMEM_MOE_COMBINE=registers and =bulk, session step moe_paths), or two libraries (step moe_ab,
`--op dispatch`). Merged into one CSV (column `path`: the run's label) and one bar plot of one op's
rows (median, with min-max whiskers).

    python3 tools/plot_moe_paths.py OUT_DIR registers=moe_registers_2/moe_2.csv bulk=moe_bulk_2/moe_2.csv
    python3 tools/plot_moe_paths.py OUT_DIR --op dispatch old_1=moe_ab_old_1/moe_2.csv new_1=moe_ab_new_1/moe_2.csv
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    args = sys.argv[2:]
    op = "combine"
    if args[:1] == ["--op"]:
        op, args = args[1], args[2:]
    out_dir, sources = sys.argv[1], [a.split("=", 1) for a in args]
    rows = []
    for path, csv_path in sources:
        with open(csv_path) as f:
            for r in csv.DictReader(f):
                rows.append({"path": path, **r})
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"moe_{op}_paths.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    combine = [r for r in rows if r["op"] == op]
    if not combine:
        sys.exit(f"no rows of op {op!r} in the CSVs")
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
        ax.set_ylabel(f"{op}, us (median, min-max)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7)
    gpu = combine[0]["gpu"]
    runs = " vs ".join(dict.fromkeys(r["path"] for r in rows))
    commits = ", ".join(dict.fromkeys(r["commit"] for r in combine))
    fig.suptitle(f"MoE {op}, {runs}: world {combine[0]['world']}, {gpu}, commits {commits}", fontsize=9)
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    fig.savefig(os.path.join(out_dir, f"moe_{op}_paths.png"), dpi=110)


if __name__ == "__main__":
    main()
