#!/usr/bin/env python3
"""Writes the README's results section from the CSVs under bench/results/<machine>/.

usage: results_table.py [--check] [--results DIR] [--readme FILE]

One Markdown table per machine (h200x2/, h200x4/, h100x2/, ...): for each headline row, symmem's
time and the fastest reference of the same run (NCCL, PyTorch, vLLM's path: whichever the CSV
measured beside it), their ratio, and the CSV it comes from. Rows whose CSV is missing are left
out, so a machine shows what was measured on it. The section lies between the markers
`<!-- results:begin -->` and `<!-- results:end -->` of the README; everything else is kept.

  --check   write nothing; exit 1 (and say so) when the README's section differs from what the
            CSVs give: the README always shows the committed data (a CPU test runs this)
"""
import argparse
import csv
import os
import re
import sys

BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

KiB, MiB = 1 << 10, 1 << 20
NCCL = ("nccl", "nccl_symmetric", "nccl_ce")
TORCH = ("nccl", "torch_symm_mem_one_shot", "torch_symm_mem_two_shot")
MOE_REFERENCES = ("vllm_ag_rs", "nccl_host_sync")

# What a reference row is called in the table.
REFERENCE_NAMES = {
    "nccl": "NCCL", "nccl_symmetric": "NCCL symmetric", "nccl_ce": "NCCL zero-CTA",
    "torch_symm_mem_one_shot": "torch symm_mem one-shot", "torch_symm_mem_two_shot": "torch symm_mem two-shot",
    "torch_fused": "torch fused op", "nccl_then_gemm": "NCCL, then GEMM", "gemm_then_nccl": "GEMM, then NCCL",
    "vllm_ag_rs": "vLLM all-gather + reduce-scatter", "nccl_host_sync": "NCCL all-to-all (host sync)",
    "torch_vdev": "torch all_to_all_vdev",
}


def size(b):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << shift:
            value = b / (1 << shift)
            return f"{value:g} {unit}"
    return f"{b} B"


def tokens(t):
    return f"T = {t} ({size(t * 8192 * 2)})"


class Spec:
    """One headline row: in CSV `stem` (`{w}` is the world size), the rows matching `where`; symmem's
    figure is the row of impl `symmem`, the reference the fastest row among `references`."""

    def __init__(self, operation, label, stem, where, symmem, references, mode=None, show_blocks=False):
        self.operation, self.label, self.stem, self.where = operation, label, stem, where
        self.symmem, self.references, self.mode = symmem, references, mode
        self.show_blocks = show_blocks  # the operation names the blocks symmem's row took (its CSV's column)


def vllm_rows(mode):
    return [Spec("all-reduce, vLLM table (bf16)", tokens(t), "all_reduce_vllm_" + mode + "_{w}",
                 {"bytes_per_rank": t * 8192 * 2}, "symmem_auto", ("nccl", "nccl_symmetric"), mode)
            for t in (32, 128, 4096)]


def sweep(operation, stem, sizes, mode, references=NCCL, symmem="symmem_auto", per_rank=True):
    return [Spec(operation, size(b) + (" per rank" if per_rank else ""), stem, {"bytes_per_rank": b}, symmem,
                 references, mode) for b in sizes]


def moe(label, shape, payload, op, mode, symmem="symmem_rank_major", stem="moe_{w}"):
    return Spec("MoE " + op + (", expert-major" if symmem.startswith("symmem_expert_major") else ""),
                f"{label}, {payload.replace('float8_e4m3', 'fp8').replace('bfloat16', 'bf16')}", stem,
                {"shape": shape, "payload": payload, "op": op}, symmem, MOE_REFERENCES, mode, show_blocks=True)


def fused(op, m, references):
    return Spec(op.replace("_", " ").replace("all gather", "all-gather").replace("reduce scatter", "reduce-scatter"),
                f"M = {m}, K = 16384, N = 6656, fp16", op + "_{w}", {"dtype": "fp16", "m": m}, "symmem_fused",
                references)


SPECS = (
    vllm_rows("eager") + vllm_rows("graph")
    + sweep("all-reduce, small (bf16)", "all_reduce_graph_small_{w}", [64 * KiB], "graph", ("nccl", "nccl_symmetric"),
            per_rank=False)
    + sweep("all-gather", "all_gather_{w}", [16 * KiB, MiB, 16 * MiB, 256 * MiB], "eager")
    + sweep("all-gather", "all_gather_graph_{w}", [16 * KiB, MiB], "graph")
    + sweep("reduce-scatter", "reduce_scatter_{w}", [16 * KiB, MiB, 16 * MiB, 256 * MiB], "eager")
    + sweep("all-to-all", "all_to_all_{w}", [64 * KiB, 16 * MiB], "eager", ("nccl",))
    + sweep("all-to-all", "all_to_all_graph_{w}", [64 * KiB], "graph", ("nccl",))
    + [Spec("all-to-all, device splits", size(b) + " per rank, uniform", "all_to_all_vdev_{w}",
            {"bytes_per_rank": b, "splits": "uniform"}, "symmem_vdev", ("torch_vdev", "nccl"), "graph")
       for b in (64 * KiB, 16 * MiB)]
    + [Spec("all-gather, 2 simulated nodes", "64 MiB per rank", "all_gather_hierarchical_2x{n}_{w}",
            {"bytes_per_rank": 64 * MiB}, "symmem_hierarchical", ("nccl",), "eager")]
    + [moe("decode 128 tokens", "decode_128", "bfloat16", "dispatch", "graph"),
       moe("decode 128 tokens", "decode_128", "float8_e4m3", "dispatch", "graph"),
       moe("decode 128 tokens", "decode_128", "bfloat16", "combine", "graph"),
       moe("decode 128 tokens", "decode_128", "bfloat16", "combine", "graph", "symmem_expert_major"),
       moe("decode 128 tokens", "decode_128", "bfloat16", "combine", "graph", "symmem_expert_major_b64",
           "moe_sm_budget_{w}"),
       moe("prefill 4096 tokens", "prefill_4096", "bfloat16", "dispatch", "graph"),
       moe("prefill 4096 tokens", "prefill_4096", "float8_e4m3", "dispatch", "eager"),
       moe("prefill 4096 tokens", "prefill_4096", "float8_e4m3", "dispatch", "graph"),
       moe("prefill 4096 tokens", "prefill_4096", "bfloat16", "combine", "graph")]
    + [fused("all_gather_matmul", m, ("torch_fused", "nccl_then_gemm")) for m in (4096, 16384)]
    + [fused("matmul_reduce_scatter", m, ("torch_fused", "gemm_then_nccl")) for m in (4096, 16384)]
    + [Spec("PyTorch all_reduce (drop-in)", tokens(t), "torch_collectives_{w}",
            {"op": "all_reduce", "bytes_per_rank": t * 8192 * 2}, "symmem_torch", TORCH, mode)
       for t, mode in ((32, "eager"), (32, "graph"), (4096, "graph"))]
    + [Spec("FSDP2 training step", "3.5 B parameters, " + prefetch + " prefetch", "fsdp_step_" + prefetch + "_prefetch_{w}",
            {"model": "4096:16:11008"}, "symmem", ("nccl",)) for prefetch in ("implicit", "explicit")]
)

# Machines in the order the README shows them; others follow by name.
MACHINE_ORDER = ("h200x2", "h200x4", "h100x2", "h100x4", "h200x1")


def machine_title(name, gpus):
    m = re.fullmatch(r"([a-z]+\d+)x(\d+)", name)
    gpu = sorted(gpus)[0] if gpus else name
    return f"{m.group(2)} × {gpu}" if m else name


def read_csvs(folder):
    tables = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".csv"):
            with open(os.path.join(folder, name), newline="") as f:
                tables[name[:-4]] = list(csv.DictReader(f))
    return tables


def matches(row, spec):
    if spec.mode is not None and row.get("mode", spec.mode) != spec.mode:
        return False
    return all(str(row.get(k)) == str(v) for k, v in spec.where.items())


def micros(t):
    return f"{t:.2f}" if t < 10 else f"{t:.1f}" if t < 1000 else f"{t:.0f}"


def world_of(stem):
    return int(stem.rsplit("_", 1)[1])


def stems_of(spec, tables):
    """The CSVs a spec reads: its stem at any world size (and node count)."""
    pattern = "".join({"{w}": r"\d+", "{n}": r"\d+"}.get(part, re.escape(part))
                      for part in re.split(r"(\{w\}|\{n\})", spec.stem))
    return sorted((s for s in tables if re.fullmatch(pattern, s)), key=world_of)


def table_rows(machine, tables):
    out = []
    for spec in SPECS:
        for stem in stems_of(spec, tables):
            rows = [r for r in tables[stem] if matches(r, spec)]
            mine = [r for r in rows if r["impl"] == spec.symmem and r.get("wrong", "0") in ("0", "")]
            refs = [r for r in rows if r["impl"] in spec.references and r.get("wrong", "0") in ("0", "")]
            if not mine or not refs:
                continue
            me = min(mine, key=lambda r: float(r["time_us"]))
            ref = min(refs, key=lambda r: (float(r["time_us"]), r["impl"]))
            mode = spec.mode or "–"
            t_me, t_ref = float(me["time_us"]), float(ref["time_us"])
            ratio = t_ref / t_me
            operation = spec.operation + (f", {me['blocks']} blocks" if spec.show_blocks and me.get("blocks") else "")
            out.append(f"| {operation} | {spec.label} | {world_of(stem)} | {mode} | {micros(t_me)} | "
                       f"{micros(t_ref)} | {REFERENCE_NAMES.get(ref['impl'], ref['impl'])} | "
                       f"{'**' if ratio >= 1 else ''}{ratio:.2f}×{'**' if ratio >= 1 else ''} | "
                       f"[{stem}.csv](bench/results/{machine}/{stem}.csv) |")
    return out


def section(results):
    machines = [d for d in os.listdir(results) if os.path.isdir(os.path.join(results, d)) and
                re.fullmatch(r"[a-z]+\d+x\d+", d)]
    machines.sort(key=lambda d: (MACHINE_ORDER.index(d) if d in MACHINE_ORDER else len(MACHINE_ORDER), d))
    lines = ["<!-- Generated by tools/results_table.py from bench/results/*/*.csv: edit those, then run it. -->",
             ""]
    for machine in machines:
        tables = read_csvs(os.path.join(results, machine))
        rows = table_rows(machine, tables)
        if not rows:
            continue
        every = [r for t in tables.values() for r in t]
        gpus = {r["gpu"] for r in every if r.get("gpu")}
        dates = sorted(r["date"][:10] for r in every if r.get("date"))
        when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
        lines += [f"### {machine_title(machine, gpus)}", "",
                  f"Measured {when}. Each figure is a median time per call (per step for FSDP2) in µs, "
                  "of the slowest rank; its reference ran in the same run on the same buffers, and "
                  "speed-up = reference / symmem.", "",
                  "| operation | size | ranks | mode | symmem (µs) | fastest reference (µs) | reference | speed-up | data |",
                  "| --- | --- | ---: | --- | ---: | ---: | --- | ---: | --- |"] + rows + [""]
    return "\n".join(lines)


def splice(readme_text, body):
    start, end = readme_text.find(BEGIN), readme_text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the README lacks the markers {BEGIN} ... {END}")
    return readme_text[:start + len(BEGIN)] + "\n" + body + "\n" + readme_text[end:]


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    parser.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    args = parser.parse_args(argv)
    with open(args.readme, encoding="utf-8") as f:
        old = f.read()
    try:
        new = splice(old, section(args.results))
    except ValueError as e:
        print(f"{args.readme}: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != old:
            print(f"{args.readme}: the results section differs from {args.results}; "
                  "run tools/results_table.py and commit the README", file=sys.stderr)
            return 1
        print(f"{args.readme}: the results section matches {args.results}")
        return 0
    if new != old:
        with open(args.readme, "w", encoding="utf-8") as f:
            f.write(new)
    print(f"{args.readme}: results section written from {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
