#!/usr/bin/env python3
"""Sets one entry of a tuning table from a symmem-bench sweep: the fastest symmem algorithm and
block count (no wrong elements) at one size becomes the table's choice up to that size.

usage: tune_entry.py SWEEP.csv BASE.json OP WORLD MAX_BYTES OUT.json
"""
import csv
import json
import sys


def main(sweep, base, op, world, max_bytes, out):
    world, max_bytes = int(world), int(max_bytes)
    rows = [r for r in csv.DictReader(open(sweep)) if r["op"] == op and r["impl"].startswith("symmem_")
            and r["impl"] != "symmem_auto" and int(r["wrong"]) == 0]
    best = min(rows, key=lambda r: float(r["time_us"]))
    table = json.load(open(base))
    entries = [e for e in table["entries"] if not (e["op"] == op and e["world"] == world and e["max_bytes"] == max_bytes)]
    entries.append({"op": op, "world": world, "max_bytes": max_bytes, "algo": best["impl"][len("symmem_"):],
                    "blocks": int(best["blocks"])})
    entries.sort(key=lambda e: (e["op"], e["world"], e["max_bytes"]))
    table["entries"] = entries
    json.dump(table, open(out, "w"), indent=1)
    print(f"{op} world {world} up to {max_bytes} bytes: {best['impl']} "
          f"blocks {best['blocks']} at {float(best['time_us']):.2f} us")


if __name__ == "__main__":
    main(*sys.argv[1:])
