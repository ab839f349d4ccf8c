"""A client in the shape of vLLM's PyNccl, against plain NCCL and libsymmem_nccl.so in one run.

vLLM (and SGLang) load an NCCL library by path with ctypes (VLLM_NCCL_SO_PATH), make a
communicator from a unique id they broadcast themselves, warm it up with one all-reduce and then
call ncclAllReduce on the current stream, eagerly and inside CUDA graphs. This does the same with
both libraries side by side (two communicators, one per library), at vLLM's all-reduce sizes
(T x 8192 bf16, T = 1 ... 4096), interleaving the libraries, and checks every result exactly
(integer-valued inputs: their sums are exact in bf16 whatever the order).

  torchrun --nproc-per-node 2 tests/nccl/pynccl_client.py --shim build/libsymmem_nccl.so \
      --nccl /path/libnccl.so.2 --csv out.csv

Rank 0 prints a table (microseconds per call, median of interleaved repetitions, and the route the
shim took) and "faster at every size: yes/no" for eager calls and graph replays. Exit 1 on a wrong
result, or with --require-faster when the shim is slower anywhere.

--windows puts input and output in memory from ncclMemAlloc, registered with ncclCommWindowRegister
(NCCL_WIN_COLL_SYMMETRIC) on each library's communicator, as vLLM's VLLM_USE_NCCL_SYMM_MEM registers
its pool: both libraries get registered buffers, and the shim must serve every size on them without
staging (zero copy).

--shim-only loads the shim alone, by path, for ranks that share GPU 0 (SYMMEM_TEST_SHARED_GPU=1)
behind the stand-in NCCL (SYMMEM_NCCL_LIBRARY, tests/nccl/fake_nccl.cpp), where plain NCCL cannot
run: every result must then come from symmem (SYMMEM_NCCL=all), and its times say nothing.
"""
import argparse
import csv
import ctypes
import datetime
import glob
import os
import statistics
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist

NCCL_BFLOAT16 = 9
NCCL_SUM = 0
NCCL_WIN_COLL_SYMMETRIC = 0x01
HIDDEN = 8192


class NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


class NcclLibrary:
    """The few functions vLLM's PyNccl binds, with its types."""

    def __init__(self, path):
        self.path = path
        self.lib = ctypes.CDLL(path)
        self.lib.ncclGetErrorString.restype = ctypes.c_char_p
        self.lib.ncclGetLastError.restype = ctypes.c_char_p
        self.lib.ncclGetLastError.argtypes = [ctypes.c_void_p]
        self.lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(NcclUniqueId)]
        self.lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, NcclUniqueId,
                                              ctypes.c_int]
        self.lib.ncclAllReduce.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                           ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        self.lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
        self.lib.ncclMemAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.lib.ncclMemFree.argtypes = [ctypes.c_void_p]
        self.lib.ncclCommWindowRegister.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                                    ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        self.lib.ncclCommWindowDeregister.argtypes = [ctypes.c_void_p, ctypes.c_void_p]

    def check(self, result, what):
        if result != 0:
            raise RuntimeError(f"{self.path}: {what}: {self.lib.ncclGetErrorString(result).decode()}: "
                               f"{(self.lib.ncclGetLastError(None) or b'').decode()}")

    def unique_id(self):
        uid = NcclUniqueId()
        self.check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return uid

    def init_rank(self, world, uid, rank):
        comm = ctypes.c_void_p()
        self.check(self.lib.ncclCommInitRank(ctypes.byref(comm), world, uid, rank), "ncclCommInitRank")
        return comm

    def window_tensor(self, comm, elements):
        """A bf16 tensor of `elements` in memory from ncclMemAlloc, registered as a symmetric window
        on `comm` (collective: every rank registers its own); with what releases it."""
        nbytes = elements * 2
        ptr = ctypes.c_void_p()
        self.check(self.lib.ncclMemAlloc(ctypes.byref(ptr), nbytes), "ncclMemAlloc")
        win = ctypes.c_void_p()
        self.check(self.lib.ncclCommWindowRegister(comm, ptr, nbytes, ctypes.byref(win), NCCL_WIN_COLL_SYMMETRIC),
                   "ncclCommWindowRegister")

        class Memory:  # the CUDA array interface: torch wraps the memory without a copy
            __cuda_array_interface__ = {"shape": (elements,), "typestr": "<i2", "data": (ptr.value, False),
                                        "version": 3, "strides": None}

        tensor = torch.as_tensor(Memory(), device="cuda").view(torch.bfloat16)

        def release():
            self.check(self.lib.ncclCommWindowDeregister(comm, win), "ncclCommWindowDeregister")
            self.check(self.lib.ncclMemFree(ptr), "ncclMemFree")
        return tensor, release

    def all_reduce(self, out, inp, comm):
        stream = torch.cuda.current_stream().cuda_stream
        self.check(self.lib.ncclAllReduce(inp.data_ptr(), out.data_ptr(), inp.numel(), NCCL_BFLOAT16, NCCL_SUM,
                                          comm, stream), "ncclAllReduce")


def exact_input(rows, rank):
    """Small integers: every sum over ranks is exact in bf16, whatever the order."""
    base = (torch.arange(rows * HIDDEN, device="cuda") % 7).to(torch.bfloat16)
    return (base * (rank + 1)).reshape(rows, HIDDEN), base


def time_eager(lib, comm, out, inp, calls):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        lib.all_reduce(out, inp, comm)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / calls


def capture(lib, comm, out, inp, calls):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            lib.all_reduce(out, inp, comm)
    return graph


def time_graph(graph, calls):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / calls


def build_commit(shim):
    """The commit the shim was built from: the COMMIT file beside it (scripts/bundle.sh), else git."""
    try:
        return open(os.path.join(os.path.dirname(os.path.realpath(shim)), "COMMIT")).read().strip()
    except OSError:
        pass
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def routes_of(prefix, buffers):
    """{bytes: route} the shim logged for this process's all-reduces on `buffers` ("staged" or
    "window") (SYMMEM_NCCL_ROUTE_LOG)."""
    found = {}
    for path in glob.glob(f"{prefix}.{os.getpid()}.csv"):
        for r in csv.DictReader(open(path)):
            if r["collective"] == "all_reduce" and r["buffers"] == buffers:
                b = int(r["bytes"])
                found[b] = r["route"] if found.get(b, r["route"]) == r["route"] else "mixed"
    return found


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shim", required=True, help="libsymmem_nccl.so")
    p.add_argument("--nccl", help="the real libnccl.so.2 (default: the one torch loaded)")
    p.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256,512,1024,2048,4096")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--csv")
    p.add_argument("--require-faster", action="store_true")
    p.add_argument("--shim-only", action="store_true", help="the shim alone (ranks sharing one GPU)")
    p.add_argument("--windows", action="store_true",
                   help="input and output in ncclMemAlloc memory registered as symmetric windows (vLLM's "
                        "VLLM_USE_NCCL_SYMM_MEM)")
    args = p.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = 0 if os.environ.get("SYMMEM_TEST_SHARED_GPU") == "1" else int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("gloo")  # only to share the unique ids, as vLLM does over its CPU group
    route_prefix = os.path.join(tempfile.gettempdir(), f"pynccl_client_routes_{os.environ.get('MASTER_PORT', '0')}")
    os.environ["SYMMEM_NCCL_ROUTE_LOG"] = route_prefix  # read by the shim when it loads below
    # --shim-only: what the shim forwards to (for the report line only).
    real_path = (args.nccl or os.environ.get("SYMMEM_NCCL_LIBRARY") or "the shim's choice") if args.shim_only \
        else args.nccl
    if not real_path:
        # The libnccl.so.2 torch loaded (the shim, loaded by path, forwards to that one as well).
        maps = open("/proc/self/maps").read().split()
        real_path = next(m for m in maps if m.endswith("libnccl.so.2"))
    libs = {"symmem_nccl": NcclLibrary(args.shim)} if args.shim_only else {
        "nccl": NcclLibrary(real_path), "symmem_nccl": NcclLibrary(args.shim)}
    comms = {}
    for name, lib in libs.items():
        uid = [lib.unique_id() if rank == 0 else None]
        dist.broadcast_object_list(uid, src=0)
        comms[name] = lib.init_rank(world, uid[0], rank)
        # vLLM's warm-up: one all-reduce at creation (the shim makes its symmem side here).
        warm = torch.zeros(1, HIDDEN, dtype=torch.bfloat16, device="cuda")
        lib.all_reduce(warm, warm, comms[name])
    torch.cuda.synchronize()

    tokens = [int(t) for t in args.tokens.split(",")]
    # --windows: each library's registered input and output, of the largest size; every size uses
    # their first elements (vLLM allocates from a pool of such memory).
    windows, releases = {}, []
    if args.windows:
        for name, lib in libs.items():
            pair = []
            for _ in range(2):
                tensor, release = lib.window_tensor(comms[name], max(tokens) * HIDDEN)
                pair.append(tensor)
                releases.append(release)
            windows[name] = pair
    results, wrong = [], 0
    for t in tokens:
        inp, base = exact_input(t, rank)
        expected = base * (world * (world + 1) // 2)
        outs = {name: torch.empty_like(inp) for name in libs}
        inps = {name: inp for name in libs}
        if args.windows:
            for name in libs:
                inps[name] = windows[name][0][:inp.numel()].view(inp.shape)
                inps[name].copy_(inp)
                outs[name] = windows[name][1][:inp.numel()].view(inp.shape)
        calls = max(5, min(50, (4 << 20) // max(1, inp.numel() * 2) * 5))
        for name, lib in libs.items():  # correctness, eager, poisoned output first
            outs[name].fill_(float("nan"))
            lib.all_reduce(outs[name], inps[name], comms[name])
            torch.cuda.synchronize()
            if not torch.equal(outs[name].reshape(-1), expected):
                wrong += 1
                print(f"rank {rank}: {name} T={t}: wrong result", file=sys.stderr)
        graphs = {name: capture(lib, comms[name], outs[name], inps[name], calls) for name, lib in libs.items()}
        for name, lib in libs.items():  # correctness of a replay after the input changed in place
            outs[name].fill_(float("nan"))
            inps[name].mul_(2)
            graphs[name].replay()
            torch.cuda.synchronize()
            inps[name].div_(2)
            if not torch.equal(outs[name].reshape(-1), expected * 2):
                wrong += 1
                print(f"rank {rank}: {name} T={t}: wrong result from a graph replay", file=sys.stderr)
        for mode in ("eager", "graph"):
            samples = {name: [] for name in libs}
            for rep in range(args.reps):
                order = list(libs) if rep % 2 == 0 else list(reversed(list(libs)))  # interleaved, ABBA
                for name in order:
                    dist.barrier()
                    if mode == "eager":
                        samples[name].append(time_eager(libs[name], comms[name], outs[name], inps[name], calls))
                    else:
                        samples[name].append(time_graph(graphs[name], calls))
            for name in libs:
                results.append({"library": name, "mode": mode, "tokens": t, "bytes": inp.numel() * 2,
                                "us_median": statistics.median(samples[name]), "us_min": min(samples[name]),
                                "us_max": max(samples[name]), "reps": args.reps, "calls": calls})
        del graphs
    # The timed calls' routes: on windows when --windows (the warm-up's staged call is another row).
    routes = routes_of(route_prefix, "window" if args.windows else "staged")
    # Every rank's calls on the windows have finished before any rank deregisters and frees them.
    torch.cuda.synchronize()
    dist.barrier()
    for release in releases:
        release()
    for name, lib in libs.items():
        lib.check(lib.lib.ncclCommDestroy(comms[name]), "ncclCommDestroy")

    counts = [None] * world
    dist.all_gather_object(counts, wrong)
    total_wrong = sum(counts)
    slower = []
    if rank == 0:
        gpu = torch.cuda.get_device_name()
        commit = build_commit(args.shim)
        date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        machine = f"{world} ranks sharing one {gpu}" if os.environ.get("SYMMEM_TEST_SHARED_GPU") == "1" \
            else f"{gpu} x {world}"
        print(f"# {date} {machine}, shim {args.shim} (commit {commit or 'unknown'}), NCCL {real_path}")
        print(f"{'mode':6} {'T':>5} {'MiB':>7} {'NCCL us':>9} {'shim us':>9} {'speedup':>8} route")
        for mode in ("eager", "graph"):
            for t in tokens:
                a = next((r for r in results if r["library"] == "nccl" and r["mode"] == mode and r["tokens"] == t),
                         None)
                b = next(r for r in results if r["library"] == "symmem_nccl" and r["mode"] == mode and r["tokens"] == t)
                route = routes.get(b["bytes"], "?")
                if a is None:  # --shim-only
                    print(f"{mode:6} {t:>5} {b['bytes'] / 2**20:>7.2f} {'-':>9} {b['us_median']:>9.2f} {'-':>8} "
                          f"{route}")
                    continue
                speedup = a["us_median"] / b["us_median"]
                if speedup <= 1.0:
                    slower.append((mode, t))
                print(f"{mode:6} {t:>5} {a['bytes'] / 2**20:>7.2f} {a['us_median']:>9.2f} {b['us_median']:>9.2f} "
                      f"{speedup:>8.3f} {route}")
            if "nccl" in libs:
                faster = not any(m == mode for m, _ in slower)
                print(f"{mode}: faster at every size: {'yes' if faster else 'no'}")
        print(f"wrong results: {total_wrong}")
        served = sorted(b for b, r in routes.items() if r == "symmem")
        print(f"sizes the shim served{' on windows (zero copy)' if args.windows else ''}: "
              f"{len(served)} of {len(tokens)}")
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=["date", "commit", "gpu", "world", "library", "mode", "tokens", "bytes",
                                                  "us_median", "us_min", "us_max", "reps", "calls", "route"])
                w.writeheader()
                for r in results:
                    w.writerow(dict(r, date=date, commit=commit, gpu=gpu, world=world,
                                    route=routes.get(r["bytes"], "") if r["library"] == "symmem_nccl" else "nccl"))
    # Every rank routes alike (the shim's rule), so rank 0's log speaks for all: a shim that served
    # nothing compared NCCL with itself.
    # --windows: every size must have been served on its windows (the shim's rule for window
    # all-reduces at these sizes), none staged.
    verdict = [any(r == "symmem" for r in routes.values()),
               len(routes) == len(tokens) and all(r == "symmem" for r in routes.values())]
    dist.broadcast_object_list(verdict, src=0)
    served_anything, served_every_size = verdict
    dist.destroy_process_group()
    if total_wrong:
        sys.exit(1)
    if not served_anything:
        print("the shim served no all-reduce (see its warnings above): nothing of symmem was measured", file=sys.stderr)
        sys.exit(1)
    if args.windows and not served_every_size:
        print("--windows: the shim did not serve every size on its windows (zero copy)", file=sys.stderr)
        sys.exit(1)
    if args.require_faster and slower:
        sys.exit(1)


if __name__ == "__main__":
    main()
