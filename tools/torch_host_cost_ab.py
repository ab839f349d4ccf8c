"""Host cost per call of symmem.torch at world 1, two or more trees interleaved in one run: how a
change to the Python layer or the C ABI moves the CPU time of a call (the figure to check is that
the new tree stays within the old one's spread).

    python3 tools/torch_host_cost_ab.py --tree old=/path/old --tree new=. --reps 7 --out results.csv --plot

Each tree is a source checkout with build/libsymmem_capi.so (or `LABEL=DIR:LIBRARY`; a COMMIT file
beside the library names the commit it was built from). Every rep
runs one measuring process per tree, in turn (ABAB...), so that clock and load drift cancel. A
measuring process (``--measure``) makes a one-rank NCCL group on GPU 0 and reports, per row, the
median over `--samples` samples of:

  host_us    CPU time to issue one call while the GPU is held busy by a sleep kernel (the launch
             queue never drains: the layer's own cost, whatever the GPU time)
  graph_us   GPU time per call of a CUDA graph of 64 calls, replayed (rows *_graph)

Rows: the C ABI's symmem_all_reduce called directly (ctypes and the C++ path, no Python layer) and
through the package's communicator (ctypes, or symmem._fastcall where the tree has it);
eager st.all_reduce in place on a symmetric 0.5 MiB bf16 tensor and on a plain one, on one
stream, and alternating two streams (every call changes stream: the join's cost, where the tree
has one), and that alternation alone (torch.cuda.stream's own cost, in both rows); NCCL's
all_reduce of the plain tensor through torch.distributed (the reference); the same calls captured
in a graph, on one stream and alternating two streams forked from the capture stream. One tree
alone (one --tree) measures this tree's rows against NCCL's. The CSV has date, commit, gpu, tree,
row, rep, host_us, graph_us, command; `--plot` draws every sample and the medians per row and
tree (OUT_host.png, OUT_graph.png). Pin the measuring processes to one idle CPU (`--cpu`): host
times move with the CPU's clock and load.
"""
import argparse
import csv
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _measure(args):
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(0)
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    import symmem.torch as st
    n = args.elements
    sym = st.empty(n, dtype=torch.bfloat16)
    sym.normal_()
    local = torch.randn(n, device="cuda").bfloat16()
    streams = [torch.cuda.current_stream(), torch.cuda.Stream()]

    def one_stream(t):
        return lambda: st.all_reduce(t)

    def two_streams_of(body):
        state = [0]

        def call():
            state[0] ^= 1
            with torch.cuda.stream(streams[state[0]]):
                body()
        return call

    def two_streams(t):
        return two_streams_of(lambda: st.all_reduce(t))

    def host(fn):
        torch.cuda.synchronize()
        torch.cuda._sleep(100_000_000)  # ~50 ms of GPU sleep: far longer than issuing the calls
        start = time.perf_counter()
        for _ in range(args.calls):
            fn()
        elapsed = (time.perf_counter() - start) * 1e6 / args.calls
        busy = not torch.cuda.current_stream().query()
        torch.cuda.synchronize()
        return elapsed if busy else float("nan")

    def graph_of(fn, forked):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            capture = torch.cuda.current_stream()
            if forked:
                streams[1].wait_stream(capture)
            for _ in range(64):
                fn()
            if forked:
                capture.wait_stream(streams[1])
        return graph

    def graph_time(graph):
        graph.replay()
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(5):
            graph.replay()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) * 1e3 / (5 * 64)

    def graph_two_streams(t):
        # Under capture the forked stream and the capture stream alternate.
        state = [0]

        def call():
            state[0] ^= 1
            stream = streams[1] if state[0] else torch.cuda.current_stream()
            with torch.cuda.stream(stream):
                st.all_reduce(t)
        return call

    from symmem.torch.device import core_of  # the world group's core communicator, by a name every tree has
    core = core_of()
    handle, stream = core._handle, torch._C._cuda_getCurrentRawStream(0)
    lib = __import__("symmem._native", fromlist=["lib"]).lib
    ptr, count = sym.data_ptr(), sym.numel()
    rows = {
        # The C ABI alone (ctypes + the C++ call path), the same call in both trees.
        "c_abi_symmetric_one_stream": lambda: lib.symmem_all_reduce(handle, ptr, ptr, count, 2, 0, stream, 0, 0, -1),
        # The package's call of it (symmem.Communicator.all_reduce: ctypes, or symmem._fastcall where it loads).
        "core_call_symmetric_one_stream": lambda: core.all_reduce(ptr, ptr, count, 2, 0, stream),
        "eager_symmetric_one_stream": one_stream(sym),
        "eager_symmetric_two_streams": two_streams(sym),
        "eager_local_one_stream": one_stream(local),
        "eager_local_two_streams": two_streams(local),
        # torch.cuda.stream alternating with nothing inside: what the *_two_streams rows pay to
        # torch itself (their difference to it is the call and symmem's join).
        "torch_stream_switch_only": two_streams_of(lambda: None),
        # The reference: torch.distributed's all_reduce (NCCL) of the plain tensor, in place.
        "nccl_local_one_stream": lambda: dist.all_reduce(local),
    }
    for fn in rows.values():  # warm-up (the communicator, the caching allocator)
        for _ in range(50):
            fn()
    torch.cuda.synchronize()
    graphs = {"graph_symmetric_one_stream": graph_of(one_stream(sym), False),
              "graph_symmetric_two_streams": graph_of(graph_two_streams(sym), True)}
    out = {}
    for name, fn in rows.items():
        out[name] = {"host_us": statistics.median(host(fn) for _ in range(args.samples)), "graph_us": ""}
    for name, graph in graphs.items():
        out[name] = {"host_us": "", "graph_us": statistics.median(graph_time(graph) for _ in range(args.samples))}
    print("RESULT " + json.dumps(out), flush=True)
    del graphs
    dist.destroy_process_group()


def _commit(tree, library):
    """The commit a tree's library was built from: COMMIT beside the library, else the tree's HEAD."""
    beside = os.path.join(os.path.dirname(library), "COMMIT")
    if os.path.exists(beside):
        return open(beside).read().strip()
    try:
        return subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = os.path.join(tree, "COMMIT")
        return open(commit).read().strip() if os.path.exists(commit) else "unknown"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--tree", action="append", default=[], help="LABEL=DIR[:LIBRARY]")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--elements", type=int, default=32 * 8192)  # 0.5 MiB bf16
    parser.add_argument("--gpu", default=os.environ.get("SYMMEM_GPU_KIND", "unknown"))
    parser.add_argument("--out", default="torch_host_cost_ab.csv")
    parser.add_argument("--cpu", type=int, default=None, help="pin every measuring process to this CPU (taskset)")
    parser.add_argument("--plot", action="store_true", help="also draw OUT_host.png and OUT_graph.png")
    args = parser.parse_args()
    if args.measure:
        return _measure(args)
    command = " ".join(["python3", "tools/torch_host_cost_ab.py"] + [a for a in sys.argv[1:]])
    trees = []
    for spec in args.tree:
        label, rest = spec.split("=", 1)
        folder, _, library = rest.partition(":")
        trees.append((label, os.path.abspath(folder), library or os.path.join(folder, "build", "libsymmem_capi.so")))
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    with open(args.out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["date", "commit", "gpu", "tree", "row", "rep", "host_us", "graph_us", "command"])
        for rep in range(args.reps):
            for label, folder, library in trees:
                env = dict(os.environ, PYTHONPATH=os.path.join(folder, "python"), SYMMEM_LIBRARY=library,
                           NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
                for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
                    env.pop(k, None)
                cmd = [sys.executable, os.path.abspath(__file__), "--measure", "--samples", str(args.samples),
                       "--calls", str(args.calls), "--elements", str(args.elements)]
                if args.cpu is not None:
                    cmd = ["taskset", "-c", str(args.cpu)] + cmd
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
                line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
                if line is None:
                    print(f"{label} rep {rep} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}", file=sys.stderr)
                    continue
                for row, values in json.loads(line[len("RESULT "):]).items():
                    writer.writerow([date, _commit(folder, library), args.gpu, label, row, rep, values["host_us"],
                                     values["graph_us"], command])
                f.flush()
    _summarise(args.out)
    if args.plot:
        for metric in ("host_us", "graph_us"):
            _plot(args.out, metric, os.path.splitext(args.out)[0] + f"_{metric[:-3]}.png")


def _summarise(path):
    rows = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            for metric in ("host_us", "graph_us"):
                if r[metric] not in ("", "nan"):
                    rows.setdefault((r["row"], metric, r["tree"]), []).append(float(r[metric]))
    print(f"{'row':34} {'metric':8} " + " ".join(f"{t:>24}" for t in sorted({k[2] for k in rows})))
    for row, metric in sorted({(k[0], k[1]) for k in rows}):
        cells = []
        for tree in sorted({k[2] for k in rows}):
            v = rows.get((row, metric, tree), [])
            cells.append(f"{statistics.median(v):8.2f} [{min(v):.2f}-{max(v):.2f}]" if v else " " * 24)
        print(f"{row:34} {metric:8} " + " ".join(f"{c:>24}" for c in cells))


def _plot(path, metric, png):
    """Every sample of `metric` per row and tree as points, the median as a bar."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    samples = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            if r[metric] not in ("", "nan"):
                samples.setdefault(r["row"], {}).setdefault(r["tree"], []).append(float(r[metric]))
    if not samples:
        return
    rows = sorted(samples)
    trees = sorted({t for by in samples.values() for t in by})
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 1.5))
    for j, tree in enumerate(trees):
        for i, row in enumerate(rows):
            v = samples[row].get(tree, [])
            y = i + (j - (len(trees) - 1) / 2) * 0.3
            ax.scatter(v, [y] * len(v), s=10, alpha=0.5, color=f"C{j}", label=tree if i == 0 else None)
            if v:
                ax.plot([statistics.median(v)] * 2, [y - 0.12, y + 0.12], color=f"C{j}", linewidth=3)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=8)
    ax.set_xlabel(f"{metric} per call (points: samples; bars: medians)")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
