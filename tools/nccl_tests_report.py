#!/usr/bin/env python3
"""nccl-tests' output as CSV rows, and the comparison of plain NCCL with libsymmem_nccl.so.

  nccl_tests_report.py parse LOG --csv OUT.csv --library nccl|symmem_nccl --mode processes|threads \
      --ranks N [--routes DIR] [--meta key=value ...]
      Appends one row per size of each table in LOG (nccl-tests' stdout: out-of-place and in-place
      time, algbw, busbw, #wrong). With --routes (the shim's SYMMEM_NCCL_ROUTE_LOG files of that
      run), each row says where the shim sent it: symmem, nccl, or mixed.
  nccl_tests_report.py compare CSV [--out SUMMARY]
      Side by side per (mode, collective, type, op, size) of one run (commit, buffers, flags, shim
      mode and workspace alike): plain NCCL's and the shim's time (each library's better placement),
      NCCL's time over the shim's out of place and in place, the route, and two speed verdicts: where
      the shim serves, faster in both placements; where it forwards, within noise in both. A run
      repeated (nccl_tests_run.sh REPEATS: rows with a `rep` column; both libraries ran back to back
      in each repetition) is judged by the median of its paired ratios, and its noise is plain NCCL
      against itself: the largest spread of plain NCCL's times over the repetitions (max over min,
      minus 1); a forwarded row is off when a ratio is further from 1 than that noise, with 5 % at
      least and 15 % at most (one repetition: 5 %). Times, not nccl-tests' bandwidths, which it
      rounds to 2 decimals (10-25 % steps below 256 KiB). Exit 1 when a row is wrong, a library or a
      repetition is missing, or the shim logged no route for a row; the speed verdicts are counted,
      not enforced.

Plain Python 3, no dependencies: it runs on the GPU machine beside the binaries.
"""
import argparse
import collections
import csv
import glob
import os
import statistics
import sys

FIELDS = ["date", "commit", "gpu", "nccl_version", "ranks", "mode", "library", "shim_mode", "workspace_mb", "buffers",
          "collective", "type",
          "redop", "size", "count", "route", "oop_time_us", "oop_algbw", "oop_busbw", "oop_wrong", "ip_time_us",
          "ip_algbw", "ip_busbw", "ip_wrong", "flags", "route_buffers", "rep"]

# nccl-tests' type names as the shim's route log numbers them (ncclDataType_t).
NCCL_TYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "half": 6, "float": 7,
              "double": 8, "bfloat16": 9, "f8e4m3": 10, "f8e5m2": 11}
NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
COLLECTIVES = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather",
               "reduce_scatter_perf": "reduce_scatter", "alltoall_perf": "alltoall"}


def parse_table(path):
    """(collective, nccl version, rows): each row a dict of the table's columns."""
    collective, version, rows = "", "", []
    for line in open(path, errors="replace"):
        if line.startswith("# Collective test starting:"):
            collective = COLLECTIVES.get(line.split(":", 1)[1].strip(), line.split(":", 1)[1].strip())
        if "nccl-library=" in line:
            version = line.split("nccl-library=")[1].split()[0]
        fields = line.split()
        if len(fields) != 13 or line.lstrip().startswith("#"):
            continue
        try:
            size, count = int(fields[0]), int(fields[1])
            numbers = [float(x) for x in fields[5:8] + fields[9:12]]
            wrong = [fields[8], fields[12]]
        except ValueError:
            continue
        rows.append({"size": size, "count": count, "type": fields[2], "redop": fields[3],
                     "oop_time_us": numbers[0], "oop_algbw": numbers[1], "oop_busbw": numbers[2],
                     "oop_wrong": wrong[0], "ip_time_us": numbers[3], "ip_algbw": numbers[4],
                     "ip_busbw": numbers[5], "ip_wrong": wrong[1]})
    return collective, version, rows


def read_routes(folder):
    """{(collective, type number, redop number, bytes): set of (route, buffers)} from the shim's
    route logs."""
    routes = collections.defaultdict(set)
    for path in glob.glob(os.path.join(folder, "*.csv")):
        with open(path) as f:
            for r in csv.DictReader(f):
                routes[(r["collective"], int(r["type"]), int(r["redop"]), int(r["bytes"]))].add(
                    (r["route"], r["buffers"]))
    return routes


def route_of(routes, collective, row):
    """(route, buffers the shim logged) of one nccl-tests row."""
    if routes is None:
        return "", ""
    type_number = NCCL_TYPES.get(row["type"], -1)
    # nccl-tests names pre-multiplied sums "mulsum" (dynamic ops: forwarded); all_gather and
    # alltoall have no reduction ("none"): the shim logs ncclSum for them.
    op_number = NCCL_OPS.get(row["redop"], 0 if row["redop"] == "none" else -1)
    found = routes.get((collective, type_number, op_number, row["size"]), set())
    if not found:
        return ("nccl" if op_number < 0 else "unlogged"), ""
    kinds = "+".join(sorted({b for _, b in found}))
    names = {r for r, _ in found}
    return (names.pop() if len(names) == 1 else "mixed"), kinds


def parse(args):
    collective, version, rows = parse_table(args.log)
    meta = dict(kv.split("=", 1) for kv in args.meta)
    routes = read_routes(args.routes) if args.routes else None
    new_file = not os.path.exists(args.csv) or os.path.getsize(args.csv) == 0
    with open(args.csv, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        if new_file:
            w.writeheader()
        for row in rows:
            out = {k: meta.get(k, "") for k in FIELDS}
            out.update(row)
            route, route_buffers = route_of(routes, collective, row) if args.library == "symmem_nccl" else ("nccl", "")
            out.update({"nccl_version": version, "ranks": args.ranks, "mode": args.mode, "library": args.library,
                        "collective": collective, "route": route, "route_buffers": route_buffers})
            w.writerow(out)
    print(f"{args.log}: {len(rows)} rows ({collective})")
    return 0 if rows else 1


PLACEMENTS = ("oop", "ip")


def time_of(row, placement):
    """A row's time in microseconds in one placement, or None where nccl-tests printed none."""
    try:
        t = float(row[placement + "_time_us"])
    except (KeyError, ValueError):
        return None
    return t if t > 0 else None


def best_time(row):
    times = [t for t in (time_of(row, p) for p in PLACEMENTS) if t is not None]
    return min(times) if times else None


def median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def paired_ratio(pairs, time):
    """Median over the repetitions (plain row, shim row) of plain NCCL's time over the shim's (> 1:
    the shim is faster); None without a time on both sides in any of them."""
    return median_or_none(time(a) / time(b) if time(a) is not None and time(b) is not None else None
                          for a, b in pairs)


def rep_of(row):
    """A row's repetition (rows of a run made before repetitions: 1)."""
    return int(row.get("rep") or 1)


def spread(rows):
    """Plain NCCL against itself: the largest max / min - 1 of a placement's times over the
    repetitions (0 for one)."""
    worst = 0.0
    for placement in PLACEMENTS:
        times = [t for t in (time_of(r, placement) for r in rows) if t is not None]
        if len(times) > 1:
            worst = max(worst, max(times) / min(times) - 1)
    return worst


def fmt(x, spec=".3f"):
    return format(x, spec) if x is not None else "-"


def compare(args):
    rows = list(csv.DictReader(open(args.csv)))
    run = lambda r: tuple(r.get(k, "") for k in ("commit", "buffers", "flags", "shim_mode", "workspace_mb"))
    key = lambda r: (r["mode"], r["ranks"], r["collective"], r["type"], r["redop"], int(r["size"]), run(r))
    plain, shim = collections.defaultdict(list), collections.defaultdict(list)
    for r in rows:
        (plain if r["library"] == "nccl" else shim)[key(r)].append(r)
    reps = lambda rs: [rep_of(r) for r in rs]
    lines, wrong, slower_served, off_forwarded, unmatched, unlogged, mixed = [], 0, 0, 0, 0, 0, 0
    header = f"{'mode':9} {'N':>2} {'collective':14} {'type':8} {'op':6} {'size':>10} {'NCCL us':>9} " \
             f"{'shim us':>9} {'ratio':>6} {'oop':>6} {'ip':>6} {'reps':>4} {'noise':>6} {'route':8} verdict"
    lines.append(header)
    for k in sorted(set(plain) | set(shim)):
        a, b = plain.get(k, []), shim.get(k, [])
        bad = [r for r in a + b if is_wrong(r)]
        wrong += len(bad)
        # Every repetition of both libraries, once each: a run that crashed, timed out or printed
        # less than its twin, or a log parsed twice, leaves the row without its twin.
        if not a or not b or sorted(reps(a)) != sorted(reps(b)) or len(set(reps(a))) != len(a):
            lines.append(f"{k[:6]}: plain repetitions {sorted(reps(a))}, shim repetitions {sorted(reps(b))}")
            unmatched += 1
            continue
        shim_of = {rep_of(r): r for r in b}
        pairs = [(r, shim_of[rep_of(r)]) for r in a]
        routes = {r["route"] for r in b}
        # The shim saw no such call in some repetition (no communicator of its own there: nothing
        # was compared).
        if "unlogged" in routes:
            unlogged += 1
            lines.append(f"{k[:6]}: the shim logged no route in a repetition")
            continue
        route = routes.pop() if len(routes) == 1 else "mixed"
        ratio = paired_ratio(pairs, best_time)
        placements = [paired_ratio(pairs, lambda r, p=p: time_of(r, p)) for p in PLACEMENTS]
        if ratio is None:
            # nccl-tests printed no time for this row (0 or missing) in any repetition.
            lines.append(f"{k[:6]}: no time on both sides")
            unmatched += 1
            continue
        noise = spread(a)
        tolerance = min(0.15, max(0.05, noise))
        measured = [x for x in placements if x is not None]
        verdict = ""
        if bad:
            verdict = "WRONG"
        elif route == "mixed":
            verdict, mixed = "routed both ways", mixed + 1
        elif route == "symmem" and any(x <= 1.0 for x in measured):
            slower = [name for name, x in zip(("out of place", "in place"), placements) if x is not None and x <= 1.0]
            verdict, slower_served = "served, not faster " + " and ".join(slower), slower_served + 1
        elif route == "nccl" and any(abs(x - 1.0) > tolerance for x in measured):
            verdict, off_forwarded = f"forwarded, off by > {tolerance:.0%}", off_forwarded + 1
        lines.append(f"{k[0]:9} {k[1]:>2} {k[2]:14} {k[3]:8} {k[4]:6} {k[5]:>10} "
                     f"{fmt(median_or_none(best_time(r) for r in a), '9.2f')} "
                     f"{fmt(median_or_none(best_time(r) for r in b), '9.2f')} "
                     f"{fmt(ratio, '6.3f')} {fmt(placements[0], '6.3f')} {fmt(placements[1], '6.3f')} {len(a):>4} "
                     f"{noise:>6.3f} {route:8} {verdict}")
    lines.append(f"rows with #wrong > 0: {wrong}; rows without a twin in every repetition: {unmatched}; shim rows "
                 f"it never routed (unlogged): {unlogged}; rows routed both ways: {mixed}; served rows not faster: "
                 f"{slower_served}; forwarded rows off by more than the noise: {off_forwarded}")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        open(args.out, "w").write(text)
    return 1 if wrong or unmatched or unlogged or not rows else 0


def is_wrong(row):
    return row["oop_wrong"] not in ("0", "N/A") or row["ip_wrong"] not in ("0", "N/A")


def unchecked(row):
    """Why nccl-tests did not check a row's data, or "". Only alltoall has no in-place form."""
    if row["oop_wrong"] != "0":
        return "out of place unchecked"
    if row["ip_wrong"] != ("N/A" if row["collective"] == "alltoall" else "0"):
        return "in place unchecked"
    return ""


def served(args):
    """Every row served by symmem, on the buffers its run was labelled with, checked and exact, and
    every run with the sizes of the others (a row nccl-tests printed but the parser missed): the same
    sizes as every run of its world, collective and type (nccl-tests rounds sizes to whole counts of
    those), and as many as any run."""
    if not os.path.exists(args.csv):
        sys.stdout.write(f"no results: {args.csv} does not exist\n")
        return 1
    rows = list(csv.DictReader(open(args.csv)))
    run_key = lambda r: (r["ranks"], r["buffers"], r.get("flags", ""), r["collective"], r["type"], r["redop"])
    sizes = collections.defaultdict(set)
    for r in rows:
        sizes[run_key(r)].add(int(r["size"]))
    most = max((len(v) for v in sizes.values()), default=0)
    rounded_alike = lambda k: (k[0], k[3], k[4])  # ranks, collective, type
    group_sizes = collections.defaultdict(set)
    for k, v in sizes.items():
        group_sizes[rounded_alike(k)] |= v
    lines, failed = [], 0
    for r in rows:
        verdict = "WRONG" if is_wrong(r) else unchecked(r)
        if not verdict and r["route"] != "symmem":
            verdict = "not served: " + (r["route"] or "no route")
        if not verdict and r.get("route_buffers", "") != r["buffers"]:
            verdict = f"{r['buffers']} run logged {r.get('route_buffers') or 'nothing'}"
        failed += bool(verdict)
        lines.append(f"{r['ranks']:>2} {r['buffers']:7} {r.get('flags', ''):9} {r['collective']:14} {r['type']:8} "
                     f"{r['redop']:6} {int(r['size']):>10} #wrong {r['oop_wrong']}/{r['ip_wrong']} {verdict}")
    short = [k for k, v in sizes.items() if len(v) < most or v != group_sizes[rounded_alike(k)]]
    for k in short:
        missing = sorted(group_sizes[rounded_alike(k)] - sizes[k])
        lines.append(f"run {' '.join(k)}: {len(sizes[k])} of {most} sizes" + (f", {missing} missing" if missing else ""))
    lines.append(f"rows: {len(rows)}; failed: {failed}; runs missing sizes: {len(short)}")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        open(args.out, "w").write(text)
    return 1 if failed or short or not rows else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("parse")
    a.add_argument("log")
    a.add_argument("--csv", required=True)
    a.add_argument("--library", required=True, choices=["nccl", "symmem_nccl"])
    a.add_argument("--mode", required=True, choices=["processes", "threads"])
    a.add_argument("--ranks", required=True, type=int)
    a.add_argument("--routes")
    a.add_argument("--meta", nargs="*", default=[])
    for name in ("compare", "served"):
        c = sub.add_parser(name)
        c.add_argument("csv")
        c.add_argument("--out")
    args = p.parse_args()
    return {"parse": parse, "compare": compare, "served": served}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
