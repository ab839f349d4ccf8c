#!/usr/bin/env python3
"""Merges tuning tables written by `symmem-bench --tune` into the one table a GPU ships with.

usage: merge_tuning.py OUT.json TABLE.json [TABLE.json ...]

Rows of later tables replace rows of earlier ones with the same (op, world). For every
(op, world) a last row repeats the choice of the largest measured size with an unbounded
max_bytes, so that sizes beyond the sweep keep the measured choice instead of the built-in rule.
"""
import json
import sys

UNBOUNDED = 1 << 62


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out_path, paths = argv[0], argv[1:]
    by_key = {}
    meta = {"gpu": "", "command": [], "date": ""}
    for path in paths:
        with open(path) as f:
            table = json.load(f)
        meta["gpu"] = table.get("gpu") or meta["gpu"]
        meta["date"] = max(meta["date"], table.get("date", ""))
        meta["command"].append(table.get("command", path))
        rows = [e for e in table.get("entries", []) if e.get("max_bytes", 0) < UNBOUNDED]
        for key in {(e["op"], e["world"]) for e in rows}:
            by_key[key] = sorted((e for e in rows if (e["op"], e["world"]) == key), key=lambda e: e["max_bytes"])
    entries = []
    for key in sorted(by_key):
        rows = by_key[key]
        entries += rows
        entries.append(dict(rows[-1], max_bytes=UNBOUNDED))
    merged = {"gpu": meta["gpu"], "command": " ; ".join(meta["command"]), "date": meta["date"], "entries": entries}
    with open(out_path, "w") as f:
        f.write("{\n")
        for k in ("gpu", "command", "date"):
            f.write(f"  {json.dumps(k)}: {json.dumps(merged[k])},\n")
        f.write('  "entries": [\n')
        for i, e in enumerate(entries):
            row = {k: e[k] for k in ("op", "world", "max_bytes", "algo", "blocks")}
            f.write("    " + json.dumps(row) + ("," if i + 1 < len(entries) else "") + "\n")
        f.write("  ]\n}\n")
    print(f"{out_path}: {len(entries)} rows for {len(by_key)} (op, world) pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
