"""Where the host time of one symmem.torch call goes, per layer, in microseconds per call:

  host   the CPU time to issue one call, measured while the GPU is held busy by a sleep kernel
         (so the launch queue never drains and the host never waits for the GPU): the layer's
         own cost, whatever the GPU time
  wall   back-to-back calls with the GPU running them: max(host, GPU time), what eager code sees

Rows are taken in turn (ABAB...) `--reps` times; per row the slower rank's median.

The cost of ordering a group's calls across streams (docs/torch.md, "Streams"): the drop-in on one
stream against the same call alternating two streams (every call changes stream, so every call
joins the previous one's stream), eager (host and wall) and captured (GPU us per call of a graph of
64 calls, replayed: one stream, and two streams forked from the capture stream).

    torchrun --nproc-per-node 2 -m symmem.bench.overhead
"""
import argparse
import statistics
import time

import torch
import torch.distributed as dist

from ..timing import replay_us
from ._torchrun import init_nccl


def _quiet():
    # Both ranks idle before a sample: a peer still sleeping in its host sample would stall this
    # rank's collectives (and its wall figure) by the length of the sleep.
    torch.cuda.synchronize()
    dist.barrier()
    torch.cuda.synchronize()


def _wall(fn, calls):
    _quiet()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e6 / calls


def _host(fn, calls):
    """Host time per call, or NaN if the GPU caught up with the host (then the figure could include
    waits for the GPU)."""
    _quiet()
    # ~25 ms of GPU sleep at H200 clocks: far longer than issuing `calls` calls.
    torch.cuda._sleep(50_000_000)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - start) * 1e6 / calls
    still_busy = not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    return host if still_busy else float("nan")


class _NoCore:
    def all_reduce(self, *args):
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--elements", type=int, default=32 * 8192)
    args = parser.parse_args()
    init_nccl()
    import symmem.torch as st
    from symmem import _native
    from symmem.torch import _route, functional
    g = dist.group.WORLD.group_name
    comm = st.GroupCommunicator()
    core = comm.core
    h = core._handle
    x = st.empty(args.elements, dtype=torch.bfloat16)
    x.normal_()
    xl = torch.randn(args.elements, device="cuda").bfloat16()
    stream = torch._C._cuda_getCurrentRawStream(comm.device)
    lib = _native.lib
    rows = [
        ("ctypes, no arguments (symmem_comm_rank)", lambda: lib.symmem_comm_rank(h)),
        ("ctypes + C++ entry, count 0 (symmem_all_reduce)",
         lambda: lib.symmem_all_reduce(h, x.data_ptr(), x.data_ptr(), 0, 2, 0, stream, 0, 0, -1)),
        ("torch.empty_like", lambda: torch.empty_like(xl)),
        ("current raw stream", lambda: torch._C._cuda_getCurrentRawStream(comm.device)),
        ("C call, symmetric in place (core.all_reduce)",
         lambda: core.all_reduce(x.data_ptr(), x.data_ptr(), x.numel(), 2, 0, stream)),
        ("the route, symmetric in place (_route.all_reduce)",
         lambda: _route.all_reduce(comm, x, x, "sum")),
        ("drop-in's group lookup alone (_eager_communicator)", lambda: functional._eager_communicator(x, None)),
        ("drop-in, symmetric in place (symmem.torch.all_reduce)", lambda: st.all_reduce(x)),
        ("op through the dispatcher, in place (torch.ops.symmem.all_reduce_)",
         lambda: torch.ops.symmem.all_reduce_(x, "sum", g)),
        ("op through the dispatcher, out of place (torch.ops.symmem.all_reduce)",
         lambda: torch.ops.symmem.all_reduce(x, "sum", g)),
        ("TPAllReduce.all_reduce, caching-allocator tensor", lambda: tp.all_reduce(xl)),
    ]
    tp = st.TPAllReduce(dist.group.WORLD)
    side = torch.cuda.Stream()
    rows.append(("drop-in, symmetric in place, alternating two streams", _alternating(side, lambda: st.all_reduce(x))))
    rows.append(("stream switch alone (torch.cuda.stream, no call)", _alternating(side, lambda: None)))
    # Rows that run without the C call: the stand-in core is swapped in around the whole sample.
    bare = {"the route without the C call", "the drop-in's checks without the C call",
            "dispatcher + Python kernel without the C call"}
    rows.append(("the route without the C call", lambda: _route.all_reduce(comm, x, x, "sum")))
    sum_code = _route.REDUCE_OPS["sum"]
    rows.append(("the drop-in's checks without the C call", lambda: _route.all_reduce_in_place(comm, x, sum_code)))
    rows.append(("dispatcher + Python kernel without the C call", lambda: torch.ops.symmem.all_reduce_(x, "sum", g)))

    def sample(name, fn, measure):
        comm.core = _NoCore() if name in bare else core
        try:
            return measure(fn, args.calls)
        finally:
            comm.core = core
    for name, fn in rows:  # warm-up, also of the caching allocator
        sample(name, fn, lambda f, n: [f() for _ in range(20)])
    torch.cuda.synchronize()
    samples = {name: ([], []) for name, _ in rows}
    for _ in range(args.reps):
        for name, fn in rows:
            samples[name][0].append(sample(name, fn, _host))
            samples[name][1].append(sample(name, fn, _wall))
    # Per row, the slower rank's median (a NaN sample, where the GPU caught up, poisons its row).
    medians = torch.tensor([[statistics.median(h), statistics.median(w)] for h, w in samples.values()],
                           dtype=torch.float64, device="cuda")
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)
    results = [(name, h, w) for name, (h, w) in zip(samples, medians.tolist())]
    graphs = {"one stream": _graph_of(lambda: st.all_reduce(x), None),
              "alternating two streams": _graph_of(_alternating(side, lambda: st.all_reduce(x)), side)}
    graph_samples = {name: [] for name in graphs}
    for _ in range(args.reps):
        for name, graph in graphs.items():
            graph_samples[name].append(_graph_us(graph))
    graph_medians = torch.tensor([statistics.median(v) for v in graph_samples.values()], dtype=torch.float64,
                                 device="cuda")
    dist.all_reduce(graph_medians, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        print(f"{args.elements} bf16 elements, {args.calls} calls per sample, {args.reps} samples (medians), "
              f"world {dist.get_world_size()}")
        print(f"{'host us':>8} {'wall us':>8}  layer")
        for name, host, wall in results:
            print(f"{host:8.2f} {wall:8.2f}  {name}")
        print(f"{'graph us':>8}  drop-in captured, {_GRAPH_CALLS} calls per graph (GPU time per call)")
        for name, us in zip(graphs, graph_medians.tolist()):
            print(f"{us:8.2f}  {name}")
    del graphs
    dist.barrier()


_GRAPH_CALLS = 64


def _alternating(side, fn):
    """fn() on the current stream and on `side` in turn (every call changes stream)."""
    state = [0]

    def call():
        state[0] ^= 1
        with torch.cuda.stream(side if state[0] else torch.cuda.current_stream()):
            fn()
    return call


def _graph_of(fn, forked):
    """A graph of _GRAPH_CALLS calls of fn(); `forked`: a stream joined to the capture stream around them."""
    _quiet()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        capture = torch.cuda.current_stream()
        if forked is not None:
            forked.wait_stream(capture)
        for _ in range(_GRAPH_CALLS):
            fn()
        if forked is not None:
            capture.wait_stream(forked)
    return graph


def _graph_us(graph, replays=5):
    _quiet()
    graph.replay()
    return replay_us(graph, replays, _GRAPH_CALLS)


if __name__ == "__main__":
    main()
