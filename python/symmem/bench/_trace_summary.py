"""What one profiled step did on the GPU, from torch.profiler's chrome trace: per stream, the time
its kernels and copies were busy, by kind (GEMM, attention, NCCL, symmem, copy-engine copies,
other), the largest grids the collectives launched, and the compute stream's idle time (the
step's span less the union of its busy intervals): where the step waited."""
import collections
import json

KINDS = [("nccl", ("nccl",)), ("symmem", ("symmem",)),
         ("gemm", ("gemm", "sm90_xmma", "cutlass", "nvjet", "cublas")),
         ("attention", ("flash", "fmha", "attention", "sdpa")),
         ("fsdp_copy", ("split_with_sizes", "chunk_cat", "all_gather_copy")),
         ("optimizer", ("adam", "foreach"))]


def kind_of(event):
    if event.get("cat") == "gpu_memcpy":
        return "memcpy"
    if event.get("cat") == "gpu_memset":
        return "memset"
    name = event.get("name", "").lower()
    for kind, keys in KINDS:
        if any(k in name for k in keys):
            return kind
    return "other"


def _union(intervals):
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def summarize(trace_path, label):
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    if not gpu:
        return f"{label}: no GPU events in the trace"
    start = min(e["ts"] for e in gpu)
    stop = max(e["ts"] + e["dur"] for e in gpu)
    by_stream = collections.defaultdict(list)
    for e in gpu:
        by_stream[e.get("args", {}).get("stream", -1)].append(e)
    compute = max(by_stream, key=lambda s: sum(e["dur"] for e in by_stream[s] if kind_of(e) == "gemm"))
    lines = [f"{label}: GPU span {(stop - start) / 1e3:.2f} ms; compute stream {compute} idle "
             f"{(stop - start - _union([(e['ts'], e['ts'] + e['dur']) for e in by_stream[compute]])) / 1e3:.2f} ms"]
    for stream, evs in sorted(by_stream.items(), key=lambda kv: -sum(e["dur"] for e in kv[1])):
        kinds = collections.Counter()
        counts = collections.Counter()
        grids = {}
        for e in evs:
            k = kind_of(e)
            kinds[k] += e["dur"]
            counts[k] += 1
            if k in ("nccl", "symmem"):
                g = e.get("args", {}).get("grid")
                if g:
                    blocks = g[0] * g[1] * g[2]
                    grids[k] = max(grids.get(k, 0), blocks)
        busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in evs])
        parts = ", ".join(f"{k} {v / 1e3:.2f} ms/{counts[k]}" + (f" (grid <= {grids[k]})" if k in grids else "")
                          for k, v in kinds.most_common())
        lines.append(f"  stream {stream}: busy {busy / 1e3:.2f} ms: {parts}")
    # The compute stream's longest idle gaps, and what ran right after each (what it waited for).
    evs = sorted(by_stream[compute], key=lambda e: e["ts"])
    gaps = [(b["ts"] - (a["ts"] + a["dur"]), a, b) for a, b in zip(evs, evs[1:])]
    gaps = sorted((g for g in gaps if g[0] > 20), key=lambda g: -g[0])[:12]
    for gap, a, b in sorted(gaps, key=lambda g: g[1]["ts"]):
        lines.append(f"  idle {gap / 1e3:.3f} ms at +{(a['ts'] + a['dur'] - start) / 1e3:.2f} ms: "
                     f"after {a['name'][:60]!r}, before {b['name'][:60]!r}")
    return "\n".join(lines)
