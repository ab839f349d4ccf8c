"""The GPU time of back-to-back calls, as every benchmark here measures it."""
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
