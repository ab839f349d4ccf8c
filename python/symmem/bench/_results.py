"""How the torchrun benchmarks write their results: <stem>.csv, <stem>.txt and <stem>.png in one folder."""
import csv
import os


def pyplot():
    """matplotlib.pyplot drawing to files (the Agg backend), or None where matplotlib is missing:
    the benchmarks then write no figure."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def write_results(out, stem, fields, rows, text, plot, ignore_extra_keys=False):
    """CSV of `rows` (dicts; floats with 3 decimals) in `fields` order, the printed `text`, and the
    figure `plot(rows, path)` draws. A key outside `fields` is an error unless ignore_extra_keys."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{stem}.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="",
                                extrasaction="ignore" if ignore_extra_keys else "raise")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()})
    with open(os.path.join(out, f"{stem}.txt"), "w") as f:
        f.write(text + "\n")
    plot(rows, os.path.join(out, f"{stem}.png"))
