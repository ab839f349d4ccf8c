"""all_to_all_vdev (row counts on the device, received counts and offsets written on the device):
symmem's op against torch's NVSHMEM op and NCCL, in one run on the same GPUs, bytes per rank swept,
eager and replayed from CUDA graphs, interleaved.

    torchrun --nproc-per-node 2 -m symmem.bench.all_to_all_vdev --out results
    torchrun --nproc-per-node 8 -m symmem.bench.all_to_all_vdev -b 1K -e 64M -f 4 --splits uniform,zipf

Rows (impl), every one on its own buffers, filled alike:
  symmem_vdev   torch.ops.symmem.all_to_all_vdev(input, out, in_splits, out_splits_offsets, group_name)
                on symmetric tensors of symmem's heap (symmem.torch.empty, whole buffers: zero copy)
  torch_vdev    torch.ops.symm_mem.all_to_all_vdev with the same arguments on PyTorch's symmetric
                memory: symm_mem.set_backend("NVSHMEM"), symm_mem.empty and symm_mem.rendezvous of
                all four tensors (as torch's test_nvshmem.py); its input is the prefix each size
                sends (torch sizes its grid by the input tensor). Skipped, with the reason in the
                .txt, where NVSHMEM is missing or fails, at a size where a peer's bytes do not divide
                by torch's blocks per peer (its kernel would assert), and in graph mode where capture fails
  nccl          torch.distributed.all_to_all_single with the same splits as host lists (exact-size
                views of plain buffers): the NCCL reference
Data: rows of --row-bytes (16: two int64); each rank sends `bytes_per_rank` in all (whole rows).
Splits (--splits): uniform (every destination the same number of rows, the first rows % world one
more) or zipf (s = 1.1, the sender's nearest neighbours first, as symmem-bench all_to_all --splits
zipf). The vdev rows receive source after source (torch's layout: offsets the exclusive scan of the
received splits); buffers are allocated once, for the largest size, and reused.

Timing. Eager: `calls` back-to-back calls between two CUDA events. Graph: one CUDA graph of 10 calls,
replayed `replays` times between two events (after one untimed replay). Within each size every
(impl, mode) configuration takes a sample in turn (ABAB...), `reps` samples each, a device barrier
before each; a sample counts as the slowest rank's time (all-reduce MAX); the CSV holds the median
sample per call (time_us) and the fastest and slowest (time_min_us, time_max_us).

Bandwidth as nccl-tests' alltoall: algbw = bytes_per_rank (what each rank sends, its own share
included) / time; busbw = algbw x (world - 1) / world. vs_nccl = nccl's time / the row's time, same
size, splits and mode.

Checks, after timing, for every (impl, mode): inputs hold rank- and index-dependent int64 values
(never 0 or -1), the whole output buffer and out_splits_offsets are poisoned with -1 and, after a
barrier, one call (eager) or one replay of the timed graph runs; `wrong` counts, summed over ranks,
the elements that differ from the expected received rows, from the poison past them, and from the
expected received splits and offsets.
"""
import argparse
import datetime
import gc
import math
import os
import statistics

import torch
import torch.distributed as dist

from ..timing import capture, replay_us, time_us
from ._results import pyplot, write_results
from ._torchrun import init_nccl
from .torch import _commit

FIELDS = ["op", "splits", "impl", "mode", "world", "row_bytes", "bytes_per_rank", "time_us", "time_min_us",
          "time_max_us", "algbw_gbs", "busbw_gbs", "vs_nccl", "wrong", "gpu", "commit", "date"]
IMPLS = ("symmem_vdev", "torch_vdev", "nccl")
GRAPH_CALLS = 10
SLACK_ROWS = 64  # output rows past the largest receive: checked to stay poisoned
POISON = -1
ZIPF_S = 1.1
UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KiB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MiB": 1 << 20,
         "G": 1 << 30, "GB": 1 << 30, "GiB": 1 << 30}


def parse_bytes(text):
    """'64M' -> 67108864 (symmem-bench's units: B, K/KB/KiB, M/MB/MiB, G/GB/GiB, powers of 1024)."""
    text = text.strip()
    digits = len(text) - len(text.lstrip("0123456789."))
    unit = text[digits:]
    if digits == 0 or unit not in UNITS:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (e.g. 1024, 1K, 64M)")
    return int(float(text[:digits]) * UNITS[unit])


def sweep(args):
    """Bytes per rank: --sizes if given, else -b, -b*f, ... up to -e."""
    if args.sizes:
        return [parse_bytes(s) for s in args.sizes.split(",")]
    if args.factor < 2 or args.min_bytes < 1:
        raise SystemExit("all_to_all_vdev: -f must be at least 2 and -b at least 1")
    sizes, n = [], args.min_bytes
    while n <= args.max_bytes:
        sizes.append(n)
        n *= args.factor
    return sizes


def split_matrix(kind, world, rows):
    """m[s][q]: rows rank s sends rank q; every rank sends `rows` in all."""
    m = []
    for s in range(world):
        if kind == "uniform":
            m.append([rows // world + (q < rows % world) for q in range(world)])
            continue
        weights = [1.0 / (1.0 + k) ** ZIPF_S for k in range(world)]  # k: distance after the sender
        row = [0] * world
        for k, w in enumerate(weights):
            row[(s + 1 + k) % world] = math.floor(rows * w / sum(weights))
        row[(s + 1) % world] += rows - sum(row)
        m.append(row)
    return m


def _ceil_div(a, b):
    return -(-a // b)


def _base(rank):
    """Rank r's input element i holds (r + 1) << 40 | (i + 1): never 0 or the poison, unique per rank."""
    return ((rank + 1) << 40) + 1


def expected(m, rank, cols, capacity):
    """(out, out_splits_offsets) this rank should hold: every source's rows for it, source after
    source, then poison up to `capacity` rows; the received splits and their exclusive scan."""
    want = torch.full((capacity * cols,), POISON, dtype=torch.int64, device="cuda")
    at, offsets = 0, []
    for s, row in enumerate(m):
        start, count = sum(row[:rank]), row[rank]
        want[at * cols:(at + count) * cols] = torch.arange(start * cols, (start + count) * cols, dtype=torch.int64,
                                                           device="cuda") + _base(s)
        offsets.append(at)
        at += count
    return want, torch.tensor([[row[rank] for row in m], offsets], dtype=torch.int64, device="cuda")


class _Vdev:
    """A vdev op on four tensors: inp, out (whole buffers), in_splits, oso (received splits, offsets)."""

    def set_splits(self, m, rank):
        self.in_splits.copy_(torch.tensor(m[rank], dtype=torch.int64))

    def why_not(self, m):
        """Why this impl cannot run the split matrix m (None: it can)."""
        return None


class SymmemVdev(_Vdev):
    """symmem's op on whole heap tensors (zero copy; a view would be staged)."""

    def __init__(self, group, in_rows, out_rows, cols):
        import symmem.torch as st
        world, self.group_name = group.size(), group.group_name
        self.inp = st.empty(in_rows, cols, dtype=torch.int64, group=group)
        self.out = st.empty(out_rows, cols, dtype=torch.int64, group=group)
        self.in_splits = st.empty(world, dtype=torch.int64, group=group)
        self.oso = st.empty(2, world, dtype=torch.int64, group=group)

    def call(self):
        torch.ops.symmem.all_to_all_vdev(self.inp, self.out, self.in_splits, self.oso, self.group_name)


class TorchVdev(_Vdev):
    """torch.ops.symm_mem.all_to_all_vdev on NVSHMEM symmetric tensors, set up as torch's own test
    (test_nvshmem.py) does. Its input is the prefix this size sends (a view at offset 0 of the
    rendezvoused buffer): torch sizes its grid by the input tensor's bytes, as for a buffer that fits."""

    def __init__(self, group, in_rows, out_rows, cols):
        import torch.distributed._symmetric_memory as symm_mem
        if not symm_mem.is_nvshmem_available():
            raise RuntimeError("torch.distributed._symmetric_memory.is_nvshmem_available() is False")
        symm_mem.set_backend("NVSHMEM")  # before this process's first symm_mem allocation
        self.world, self.group_name, self.row_bytes = group.size(), group.group_name, cols * 8
        # The device with its index: NVSHMEM's team manager refuses a second device ("cuda" alone is 0).
        device = torch.device("cuda", torch.cuda.current_device())
        self.inp = symm_mem.empty((in_rows, cols), dtype=torch.int64, device=device)
        self.out = symm_mem.empty((out_rows, cols), dtype=torch.int64, device=device)
        self.in_splits = symm_mem.empty(self.world, dtype=torch.int64, device=device)
        self.oso = symm_mem.empty((2, self.world), dtype=torch.int64, device=device)
        for t in (self.inp, self.out, self.in_splits, self.oso):
            symm_mem.rendezvous(t, self.group_name)
        dist.barrier()  # every rank's tensors exist before the first call (torch's test does the same)
        self.in_splits.zero_()  # a first call that moves nothing, on the whole input
        self.sent = self.inp
        self.call()
        torch.cuda.synchronize()

    def set_splits(self, m, rank):
        super().set_splits(m, rank)
        self.sent = self.inp[:sum(m[rank])]

    def why_not(self, m):
        # The receiver pulls each peer's bytes with blocks_per_peer blocks and asserts on the device
        # (killing the process) unless they divide exactly. Its grid (get_a2a_nblocks, torch 2.11
        # nvshmem_extension.cu): TORCH_SYMMMEM_NBLOCKS if set, else min(round_up(ceil(its input's
        # bytes / 64 KiB), world), 64 within a node or 16 across nodes).
        env = int(os.environ.get("TORCH_SYMMMEM_NBLOCKS", "0") or 0)
        for q in range(self.world):
            chunks = _ceil_div(sum(m[q]) * self.row_bytes, 16 * 512 * 8)
            grids = [env] if env > 0 else [min(_ceil_div(chunks, self.world) * self.world, cap) for cap in (64, 16)]
            for s, row in enumerate(m):
                for grid in grids:
                    per_peer = max(grid // self.world, 1)
                    if row[q] * self.row_bytes % per_peer:
                        return (f"rank {q} receives {row[q] * self.row_bytes} B from rank {s}, not a multiple of "
                                f"torch's {per_peer} blocks per peer (a device assert)")
        return None

    def call(self):
        torch.ops.symm_mem.all_to_all_vdev(self.sent, self.out, self.in_splits, self.oso, self.group_name)


class Nccl:
    """all_to_all_single with host splits on exact-size views (it demands sum(splits) == dim 0)."""

    def __init__(self, group, in_rows, out_rows, cols):
        self.group = group
        self.inp = torch.empty(in_rows, cols, dtype=torch.int64, device="cuda")
        self.out = torch.empty(out_rows, cols, dtype=torch.int64, device="cuda")
        self.oso = None

    def set_splits(self, m, rank):
        self.send, self.recv = m[rank], [row[rank] for row in m]
        self.inp_view, self.out_view = self.inp[:sum(self.send)], self.out[:sum(self.recv)]

    def why_not(self, m):
        return None

    def call(self):
        dist.all_to_all_single(self.out_view, self.inp_view, self.recv, self.send, group=self.group)


def _reasons(reason):
    """Every rank's reason (None where it went well), so that all ranks decide alike."""
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, reason)
    return every


def _why(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def _replay_us(graph, replays):
    graph.replay()
    return replay_us(graph, replays, GRAPH_CALLS)


def _lined_up():
    """Every rank's queued work done, then a barrier: no rank's call reaches a peer's buffers early."""
    torch.cuda.synchronize()
    dist.barrier()


def _wrong(impl, run, want, want_oso):
    impl.out.fill_(POISON)
    if impl.oso is not None:
        impl.oso.fill_(POISON)
    _lined_up()  # a peer's call writes into this rank's out: after its poison, not before
    run()
    torch.cuda.synchronize()
    wrong = int((impl.out.view(-1) != want).sum())
    if impl.oso is not None:
        wrong += int((impl.oso != want_oso).sum())
    return wrong


def _capture_all(impls, label, notes):
    """{name: graph} for the impls whose capture succeeded on every rank; the others noted."""
    graphs = {}
    for n, impl in impls.items():
        try:
            graph, reason = capture(impl.call, GRAPH_CALLS), None
        except Exception as e:  # noqa: BLE001 (capture unsupported: the graph row is dropped)
            graph, reason = None, _why(e)
        failed = [(r, why) for r, why in enumerate(_reasons(reason)) if why is not None]
        if failed:
            notes.append(f"{label} {n} graph skipped: " + "; ".join(f"rank {r}: {why}" for r, why in failed))
        else:
            graphs[n] = graph
    return graphs


def _measure(impls, m, kind, capacity, args, meta, notes):
    """The rows of one split matrix (outputs of `capacity` rows): warm-up, graphs, interleaved samples,
    then the checks."""
    world, rank = meta["world"], dist.get_rank()
    cols = args.row_bytes // 8
    sent = sum(m[rank]) * args.row_bytes
    for impl in impls.values():
        impl.set_splits(m, rank)
    _lined_up()  # every rank's new in_splits in place before any call reads them
    for impl in impls.values():
        for _ in range(args.warmup):
            impl.call()
    _lined_up()
    modes = args.modes.split(",")
    graphs = _capture_all(impls, f"{kind} {sent} B", notes) if "graph" in modes else {}
    runs = {(n, "eager"): impl.call for n, impl in impls.items()} if "eager" in modes else {}
    runs.update({(n, "graph"): g.replay for n, g in graphs.items()})
    configs = [(n, mode) for n in impls for mode in modes if (n, mode) in runs]
    samples = {c: [] for c in configs}
    for _ in range(args.reps):
        for n, mode in configs:  # ABAB: drift hits every configuration alike
            dist.barrier()
            samples[(n, mode)].append(time_us(impls[n].call, args.calls) if mode == "eager"
                                      else _replay_us(graphs[n], args.replays))
    want, want_oso = expected(m, rank, cols, capacity)
    found = []
    for n, mode in configs:
        wrong = torch.tensor([_wrong(impls[n], runs[(n, mode)], want, want_oso)], device="cuda")
        dist.all_reduce(wrong)
        times = torch.tensor(samples[(n, mode)], device="cuda")
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # the slowest rank's sample
        times = times.tolist()
        us = statistics.median(times)
        found.append({**meta, "splits": kind, "impl": n, "mode": mode, "bytes_per_rank": sent, "time_us": us,
                      "time_min_us": min(times), "time_max_us": max(times), "algbw_gbs": sent / us / 1e3,
                      "busbw_gbs": sent / us / 1e3 * (world - 1) / world, "wrong": int(wrong.item())})
    for r in found:
        nccl = next((x["time_us"] for x in found if x["impl"] == "nccl" and x["mode"] == r["mode"]), None)
        r["vs_nccl"] = nccl / r["time_us"] if nccl is not None else ""
    del graphs, runs
    torch.cuda.synchronize()
    return found


def _sweep(impls, kinds, sizes, capacity, comm, args, meta, notes):
    """Every (splits, size) of the run, each impl where it can run that split matrix."""
    rank, rows = dist.get_rank(), []
    for kind in kinds:
        for nbytes in sizes:
            m = split_matrix(kind, meta["world"], nbytes // args.row_bytes)
            active = {}
            for n, impl in impls.items():
                why = impl.why_not(m)  # from m alone: every rank decides alike
                if why is None:
                    active[n] = impl
                else:
                    notes.append(f"{kind} {sum(m[rank]) * args.row_bytes} B {n} skipped: {why}")
            rows += _measure(active, m, kind, capacity, args, meta, notes)
            if comm is not None:
                comm.check()
    return rows


def _release(impls):
    """Every impl's tensors freed on every rank alike while the group lives: NVSHMEM frees
    collectively, and a rank freeing torch's symmetric tensors alone at exit hung (2 x H100)."""
    for impl in impls.values():
        impl.__dict__.clear()
    impls.clear()
    gc.collect()
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.empty_cache()  # the symm_mem pool's segments, freed now, in step on every rank
    torch.cuda.synchronize()
    dist.barrier()


def _line(r):
    vs = "" if r["vs_nccl"] == "" else f"{r['vs_nccl']:.2f}"
    return (f"{r['splits']:>7} {r['bytes_per_rank']:>10} {r['impl']:>11} {r['mode']:>5} {r['time_us']:10.1f} us "
            f"[{r['time_min_us']:.1f}, {r['time_max_us']:.1f}] busbw {r['busbw_gbs']:7.1f} GB/s vs_nccl {vs:>5} "
            f"wrong {r['wrong']}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="all_to_all_vdev_results")
    p.add_argument("-b", "--minbytes", dest="min_bytes", type=parse_bytes, default=1 << 10)
    p.add_argument("-e", "--maxbytes", dest="max_bytes", type=parse_bytes, default=64 << 20)
    p.add_argument("-f", "--stepfactor", dest="factor", type=int, default=4)
    p.add_argument("--sizes", default="", help="bytes per rank, comma-separated (overrides -b/-e/-f)")
    p.add_argument("--splits", default="uniform", help="uniform,zipf")
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--modes", default="eager,graph")
    p.add_argument("--row-bytes", type=int, default=16, help="bytes per row, a multiple of 8 (int64 elements)")
    p.add_argument("-n", "--calls", type=int, default=20, help="eager calls per sample")
    p.add_argument("--replays", type=int, default=5, help="graph replays (of 10 calls) per sample")
    p.add_argument("-w", "--warmup", type=int, default=5, help="eager calls before each size's samples")
    p.add_argument("--reps", type=int, default=5, help="interleaved samples per configuration")
    args = p.parse_args()
    kinds, modes, names = args.splits.split(","), args.modes.split(","), args.impls.split(",")
    for given, allowed, flag in ((kinds, ("uniform", "zipf"), "--splits"), (modes, ("eager", "graph"), "--modes"),
                                 (names, IMPLS, "--impls")):
        if any(g not in allowed for g in given):
            raise SystemExit(f"all_to_all_vdev: {flag} takes {', '.join(allowed)}, not {','.join(given)}")
    if args.row_bytes < 8 or args.row_bytes % 8:
        raise SystemExit(f"all_to_all_vdev: --row-bytes must be a positive multiple of 8, not {args.row_bytes}")
    sizes = [s for s in sweep(args) if s >= args.row_bytes]
    init_nccl()
    import symmem.torch as st  # registers torch.ops.symmem.*
    group = dist.group.WORLD
    world, rank = group.size(), group.rank()
    cols = args.row_bytes // 8
    meta = {"op": "all_to_all_vdev", "world": world, "row_bytes": args.row_bytes, "gpu": torch.cuda.get_device_name(),
            "commit": _commit(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}

    # One set of buffers per impl, for the largest send and the largest receive of the sweep.
    in_rows = max(s // args.row_bytes for s in sizes)
    out_rows = SLACK_ROWS + max(sum(row[q] for row in split_matrix(k, world, s // args.row_bytes))
                                for k in kinds for s in sizes for q in range(world))
    makers = {"symmem_vdev": SymmemVdev, "torch_vdev": TorchVdev, "nccl": Nccl}
    impls, notes = {}, []
    for name in names:
        try:
            impl, reason = makers[name](group, in_rows, out_rows, cols), None
        except Exception as e:  # noqa: BLE001 (a reference that cannot run is reported, not fatal)
            impl, reason = None, _why(e)
        failed = [(r, why) for r, why in enumerate(_reasons(reason)) if why is not None]
        if failed:
            notes.append(f"{name} skipped: " + "; ".join(f"rank {r}: {why}" for r, why in failed))
            continue
        impl.inp.view(-1).copy_(torch.arange(impl.inp.numel(), dtype=torch.int64, device="cuda") + _base(rank))
        impls[name] = impl
    comm = st.GroupCommunicator(group) if "symmem_vdev" in impls else None

    rows = _sweep(impls, kinds, sizes, out_rows, comm, args, meta, notes)

    text = [f"# all_to_all_vdev: world {world}, {meta['gpu']}, commit {meta['commit']}, {meta['date']}, rows of "
            f"{args.row_bytes} B (int64), us per call (slowest rank, median of {args.reps}) [min, max]"]
    text += [_line(r) for r in rows]
    text += [f"# {n}" for n in notes]
    if rank == 0:
        print("\n".join(text), flush=True)
        write_results(args.out, f"all_to_all_vdev_{world}", FIELDS, rows, "\n".join(text), _plot)
    _release(impls)
    st.close_all()
    dist.destroy_process_group()


def _plot(rows, path):
    """Time against bytes per rank, one line per (impl, mode), one panel per splits kind."""
    plt = pyplot()
    if plt is None or not rows:
        return
    kinds = list(dict.fromkeys(r["splits"] for r in rows))
    fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.5), squeeze=False)
    colors = {impl: f"C{i}" for i, impl in enumerate(dict.fromkeys(r["impl"] for r in rows))}
    for ax, kind in zip(axes[0], kinds):
        for impl, mode in dict.fromkeys((r["impl"], r["mode"]) for r in rows):
            points = sorted((r["bytes_per_rank"], r["time_us"]) for r in rows
                            if (r["splits"], r["impl"], r["mode"]) == (kind, impl, mode))
            if points:
                ax.plot(*zip(*points), marker="o", color=colors[impl], linestyle="-" if mode == "eager" else "--",
                        label=f"{impl} {mode}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("us per call (slowest rank)")
        ax.set_title(f"{kind} splits")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"all_to_all_vdev, {rows[0]['world']} x {rows[0]['gpu']}, rows of {rows[0]['row_bytes']} B")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
