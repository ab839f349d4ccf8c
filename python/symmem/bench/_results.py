"""How the torchrun benchmarks write their results: <stem>.csv, <stem>.txt and <stem>.png in one folder.
Every CSV row ends with the command that reproduces it (bench/results/README.md)."""
import csv
import os
import shlex
import sys

# Settings of symmem that change what a run measures: recorded in its command when set (the same
# list as symmem-bench's, tools/bench/args.cpp).
SETTINGS_THAT_CHANGE_A_RUN = ("SYMMEM_TUNING_FILE", "SYMMEM_ALGO", "SYMMEM_BLOCKS", "SYMMEM_PUSH_BULK", "SYMMEM_PDL",
                              "SYMMEM_CE_DIRECTION", "SYMMEM_CE_BATCH", "SYMMEM_CE_STREAMS", "SYMMEM_CE_PIECE_KB",
                              "SYMMEM_MOE_COMBINE", "SYMMEM_WORKSPACE_MB")
# Options that say where results go, not what is measured: left out of the command.
_OUTPUT_OPTIONS = ("--out", "--stem", "--csv")


def reproducing_command(argv=None, environ=None):
    """`[SETTING=value ...] torchrun --nproc-per-node W -m symmem.bench.<name> ARGS` for this process
    (argv[0] is the module's file under `python -m` and torchrun), output options left out."""
    argv = sys.argv if argv is None else argv
    environ = os.environ if environ is None else environ
    module = "symmem.bench." + os.path.splitext(os.path.basename(argv[0]))[0]
    args, skip = [], False
    for a in argv[1:]:
        if skip:
            skip = False
        elif a in _OUTPUT_OPTIONS:
            skip = True
        elif not a.split("=", 1)[0] in _OUTPUT_OPTIONS:
            args.append(shlex.quote(a))
    settings = [f"{k}={shlex.quote(environ[k])}" for k in SETTINGS_THAT_CHANGE_A_RUN if environ.get(k)]
    world = environ.get("WORLD_SIZE", "1")
    return " ".join(settings + ["torchrun", "--nproc-per-node", world, "-m", module] + args)


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
    command = reproducing_command()
    fields = [k for k in fields if k != "command"] + ["command"]
    with open(os.path.join(out, f"{stem}.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="",
                                extrasaction="ignore" if ignore_extra_keys else "raise")
        writer.writeheader()
        for r in rows:
            writer.writerow({"command": command, **{k: (f"{v:.3f}" if isinstance(v, float) else v)
                                                     for k, v in r.items()}})
    with open(os.path.join(out, f"{stem}.txt"), "w") as f:
        f.write(text + "\n")
    plot(rows, os.path.join(out, f"{stem}.png"))
