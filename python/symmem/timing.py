"""The GPU time of back-to-back calls, as symmem's benchmarks (symmem.bench) and the examples'
measurements (symmem.triton.examples.all_gather_matmul --world1-vs-mm) take it: written here once,
for them and for a user timing symmem beside another library. Needs torch and a GPU."""
import torch


def time_us(call, calls):
    """Microseconds per call of `calls` back-to-back calls of `call()` on the current stream, between
    two CUDA events: the GPU's time where the host enqueues faster than the GPU runs the calls; a
    call whose host cost is the larger (small eager calls) is timed at its host cost."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / calls


def replay_us(graph, replays, calls_per_graph):
    """Microseconds per captured call of `replays` back-to-back replays of `graph`, which holds
    `calls_per_graph` calls (warm it up first: its first replay uploads it)."""
    return time_us(graph.replay, replays) / calls_per_graph


def capture(fn, calls, warmups=1):
    """A CUDA graph of `calls` calls of fn(), after `warmups` calls on a side stream outside capture
    (what a first call makes, a workspace or a compiled kernel, exists before the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return graph
