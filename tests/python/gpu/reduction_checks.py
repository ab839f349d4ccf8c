"""The reductions' oracles on the job's ranks (symmem.testing, the one place they are written):
every rank's inputs gathered by NCCL (it moves bytes, exactly), then symmem's results compared
bit for bit with its documented order (fp32 sums in rank order, rounded once: the same bits on
every rank) and another library's (NCCL's) within the rounding bound of any order, from the float64
result, the world size and the dtype. A tolerance that holds at 2 ranks does not at 4: NCCL's ring
rounds each of its W - 1 partial sums.

Every check is collective and fails on every rank together (each rank reports its own problems),
so that no rank leaves a test while its peers still wait in one of its collectives."""
import torch
import torch.distributed as dist

from symmem import testing
from symmem.testing import ANY, SYMMEM  # noqa: F401  (re-exported for the tests)


def gathered(x, group=None):
    """Every rank's x, [world, *x.shape], bit-exact (collective)."""
    world = dist.get_world_size(group)
    parts = torch.empty(world * x.numel(), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(parts, x.contiguous().view(-1), group=group)
    return parts.view(world, *x.shape)


def scattered_parts(parts, group=None):
    """This rank's slice of every rank's reduce-scatter input ([world, world * n] -> [world, n])."""
    world, rank = parts.shape[0], dist.get_rank(group)
    return parts.reshape(world, world, -1)[:, rank]


def problems(got, parts, order, op="sum", what="", calls=1):
    """[] or a one-line description of what is wrong with got (local)."""
    problem = testing.describe_wrong(got, parts, order, op, calls)
    return [] if problem is None else [f"{what}: {problem}" if what else problem]


def fail_together(found, group=None):
    """Fails on every rank when any rank found a problem, each listing its own (collective)."""
    count = torch.tensor([len(found)], device="cuda")
    dist.all_reduce(count, group=group)
    assert count.item() == 0, (f"{count.item()} problems over the ranks; rank {dist.get_rank()}'s: "
                               + "; ".join(found[:6]))


def check_reduction(got, inp, op="sum", order=SYMMEM, what="all_reduce", group=None):
    """got is the all-reduce of every rank's `inp` in `order` (collective)."""
    fail_together(problems(got, gathered(inp, group), order, op, what), group)


def check_reduce_scatter(got, inp, op="sum", order=SYMMEM, what="reduce_scatter", group=None):
    """got is this rank's slice of the reduce-scatter of every rank's `inp` (collective)."""
    parts = scattered_parts(gathered(inp.reshape(-1), group).reshape(dist.get_world_size(group), -1), group)
    fail_together(problems(got.reshape(-1), parts, order, op, what), group)
