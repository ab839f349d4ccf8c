"""A late rank costs a call its lateness, not more. The low-latency waits once read the host abort
word from every waiting thread every 256 spins; while a peer was late, those PCIe reads queued
behind each other and kept every thread milliseconds past the moment the peer's data came
(include/symmem/device.cuh, "Failure"). Measured as symmem.bench.skew does: every rank's call is
queued behind a sleep, the last rank's sleep is longer by the skew, and the excess is what rank 0
waited beyond that skew and the call's time without skew."""
import statistics

import pytest
import torch
import torch.distributed as dist

from conftest import shared_gpu

from symmem.bench import skew

SKEW_US = 3000.0     # past the waits' quiet time (1 ms): the abort word is being read
EXCESS_BOUND_US = 500.0  # the flood cost tens of milliseconds at these sizes; a call costs ~10 us
REPS = 5


@pytest.mark.skipif(shared_gpu(), reason="ranks sharing one GPU take turns on it: a late rank there is the GPU "
                                         "running another rank, not a peer's lateness")
@pytest.mark.parametrize("nbytes", [32 << 10, 256 << 10])
@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_a_late_rank_costs_no_more_than_its_lateness(group, nbytes, mode):
    rank, world = dist.get_rank(), dist.get_world_size()
    late = rank == world - 1
    cycles_per_us = skew._sleep_cycles_per_us()
    rows, expected = skew._rows(nbytes // 2, rank, world)
    rows = [r for r in rows if r.name != "nccl"]
    graphs = {r.name: skew._graph_of(r) if mode == "graph" else None for r in rows}
    excess = {}
    for row in rows:
        times = {}
        for s in [0.0, SKEW_US] * REPS:
            row.output().fill_(float("nan"))
            us, slept = skew._sample(row, graphs[row.name], s, 5000.0, cycles_per_us, late)
            assert torch.equal(row.output(), expected), f"{row.name} {mode}: wrong result at skew {s} us"
            times.setdefault(s, []).append((us, slept))
        # Rank 0's times against the late rank's sleeps, the same on every rank.
        flat = torch.tensor([v for s in (0.0, SKEW_US) for pair in times[s] for v in pair], dtype=torch.float64,
                            device="cuda")
        every = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(every, flat)
        t0 = every[0].reshape(2, REPS, 2)[:, :, 0].tolist()
        slept = every[world - 1].reshape(2, REPS, 2)[1, :, 1].tolist()
        base = statistics.median(t0[0])
        excess[row.name] = statistics.median(t - s - base for t, s in zip(t0[1], slept))
    del graphs
    assert all(e < EXCESS_BOUND_US for e in excess.values()), \
        f"{nbytes} B {mode}: median microseconds past a {SKEW_US:.0f} us skew: {excess}"
