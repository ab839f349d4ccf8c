"""symmem.testing, the oracles of every reduction check (tests and benches), on synthetic data:
symmem's order reproduced bit for bit; a sum in another order (a ring that rounds every partial
sum to bf16, as NCCL's) differs from it at 3 ranks and more yet stays within the bound of any
order, which grows with the world size; a wrong value (a rank left out, a stale input, a shifted
element) fails; and the torch bench counts its rows with these oracles."""
import pytest

torch = pytest.importorskip("torch")

from symmem import testing  # noqa: E402
from symmem.testing import ANY, SYMMEM  # noqa: E402


def _parts(world, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed + 1000 * world)
    if dtype.is_floating_point:
        return torch.randn(world, n, generator=g).to(dtype)
    return torch.randint(-(1 << 20), 1 << 20, (world, n), generator=g, dtype=dtype)


def _ring(parts, start=0, premultiply=False):
    """Another library's order: rank `start` first, every partial sum rounded to the type; with
    `premultiply`, NCCL's avg (each input times 1/W rounded to the type, then summed)."""
    world, dtype = parts.shape[0], parts.dtype
    rows = [parts[(start + i) % world] for i in range(world)]
    if premultiply:
        factor = torch.tensor(1.0 / world).to(dtype).float()
        rows = [(r.float() * factor).to(dtype) for r in rows]
    total = rows[0]
    for r in rows[1:]:
        total = (total.float() + r.float()).to(dtype)
    return total


def test_symmem_order_is_float32_in_rank_order_rounded_once():
    # Three bf16 values whose float32 sum rounds differently from a sum rounded at every step:
    # 1 + 2^-8 + 2^-8 is 1 + 2^-7 in float32 (representable in bf16), while (1 + 2^-8) rounds to 1
    # in bf16 (a tie, to even), and 1 + 2^-8 to 1 again.
    parts = torch.tensor([[1.0], [2.0 ** -8], [2.0 ** -8]], dtype=torch.bfloat16)
    assert testing.in_symmem_order(parts).item() == 1 + 2.0 ** -7
    assert _ring(parts).item() == 1.0
    assert testing.wrong_elements(_ring(parts), parts, SYMMEM).all()
    assert not testing.wrong_elements(_ring(parts), parts, ANY).any()  # within 2 bf16 roundings
    # avg scales the float32 sum by 1/W, then rounds once; int32 wraps; max/min ignore NaN.
    assert testing.in_symmem_order(parts, "avg").item() == ((1 + 2.0 ** -7) / 3.0)
    ints = torch.tensor([[2 ** 31 - 1], [1]], dtype=torch.int32)
    assert testing.in_symmem_order(ints).item() == -(2 ** 31)
    nan = torch.tensor([[float("nan"), float("nan")], [1.0, float("nan")]])
    got = testing.in_symmem_order(nan, "max")
    assert got[0].item() == 1.0 and got[1].isnan()
    # A NaN result matches a NaN of other bits (CUDA's conversion writes 0x7fff, torch's 0x7fc0).
    nans = torch.tensor([[1.0], [float("nan")]], dtype=torch.bfloat16)
    other_nan = torch.tensor([0x7FFF], dtype=torch.int16).view(torch.bfloat16)
    assert not testing.wrong_elements(other_nan, nans, SYMMEM).any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_another_order_passes_the_bound_and_differs_from_symmems_at_three_ranks(dtype, world):
    parts = _parts(world, 200_000, dtype)
    ours = testing.in_symmem_order(parts)
    assert not testing.wrong_elements(ours, parts, SYMMEM).any()
    assert not testing.wrong_elements(ours, parts, ANY).any()  # symmem's order is one of them
    differs = 0
    for start in (0, world // 2):  # (float32 from rank 0 is symmem's order: no partial sum rounds differently)
        ring = _ring(parts, start)
        assert not testing.wrong_elements(ring, parts, ANY).any(), testing.describe_wrong(ring, parts, ANY)
        differs += int(testing.wrong_elements(ring, parts, SYMMEM).sum())
    if world == 2:  # a + b either way, rounded once: the same bits
        assert differs == 0
    else:
        assert differs > 0, f"a {dtype} sum of {world} ranks in other orders never differed from symmem's"
    premultiplied = _ring(parts, 0, premultiply=True)
    assert not testing.wrong_elements(premultiplied, parts, ANY, "avg").any(), \
        testing.describe_wrong(premultiplied, parts, ANY, "avg")
    assert not testing.wrong_elements(testing.in_symmem_order(parts, "avg"), parts, ANY, "avg").any()


def test_the_bound_grows_with_the_world_size():
    # The 2-rank bound does not hold at 8 ranks: what a 2-rank tolerance would have called wrong.
    parts = _parts(8, 200_000, torch.bfloat16, seed=5)
    ring = _ring(parts)
    error = (ring.double() - testing.exact(parts)).abs()
    magnitude = parts.double().abs().sum(0)
    assert bool((error > testing.tolerance(torch.bfloat16, 2, ANY) * magnitude).any())
    assert bool((error <= testing.tolerance(torch.bfloat16, 8, ANY) * magnitude).all())
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        values = [testing.tolerance(dtype, w, ANY) for w in (2, 3, 4, 8)]
        assert values == sorted(values) and values[0] > 0
        assert testing.tolerance(dtype, 4, SYMMEM) <= testing.tolerance(dtype, 4, ANY)
    assert testing.tolerance(torch.bfloat16, 4, ANY) == pytest.approx(3 * 2.0 ** -8, rel=2e-2)  # gamma(3)
    for op in ("max", "min"):
        assert testing.tolerance(torch.bfloat16, 8, ANY, op) == 0.0
    assert testing.tolerance(torch.int32, 8, ANY) == 0.0


@pytest.mark.parametrize("world", [3, 4])
def test_wrong_values_fail(world):
    parts = _parts(world, 50_000, torch.bfloat16, seed=7)
    right = testing.in_symmem_order(parts)
    one_rank_missing = testing.in_symmem_order(parts[1:])
    assert testing.wrong_elements(one_rank_missing, parts, ANY).float().mean() > 0.9
    stale = testing.in_symmem_order(_parts(world, 50_000, torch.bfloat16, seed=8))
    assert testing.wrong_elements(stale, parts, ANY).float().mean() > 0.9
    # One element moved by twice its bound: that element, and only it, is wrong.
    shifted = right.clone()
    bound = testing.error_bound(parts, ANY)
    shifted[123] = (testing.exact(parts)[123] + 2 * bound[123]).to(torch.bfloat16)
    wrong = testing.wrong_elements(shifted, parts, ANY)
    assert wrong.nonzero().flatten().tolist() == [123]
    with pytest.raises(AssertionError, match="1 of 50000 elements"):
        testing.assert_reduction(shifted, parts, ANY)
    # A NaN where the result is a number is wrong in either order.
    poisoned = right.clone()
    poisoned[7] = float("nan")
    assert testing.wrong_elements(poisoned, parts, ANY)[7] and testing.wrong_elements(poisoned, parts, SYMMEM)[7]
    # max/min and int32 sums are exact in any order.
    for op in ("max", "min"):
        got = testing.in_symmem_order(parts, op)
        assert not testing.wrong_elements(got, parts, ANY, op).any()
        got[3] = got[3] + 1
        assert testing.wrong_elements(got, parts, ANY, op).nonzero().flatten().tolist() == [3]
    ints = _parts(world, 1000, torch.int32)
    got = testing.in_symmem_order(ints)
    assert not testing.wrong_elements(got, ints, ANY).any()
    got[0] += 1
    assert testing.wrong_elements(got, ints, ANY).sum() == 1


def test_results_near_zero_take_the_subnormal_step():
    # float16 inputs around 1e-6 sum in the subnormal range, where a rounding's error is absolute.
    g = torch.Generator().manual_seed(3)
    parts = (torch.randn(4, 10_000, generator=g) * 1e-6).to(torch.float16)
    assert not testing.wrong_elements(_ring(parts), parts, ANY).any()


@pytest.mark.parametrize("world", [2, 4])
def test_repeated_in_place_calls(world):
    # The bench's timed graph: 10 in-place all-reduces in a row, each summing the previous result
    # (the same on every rank): world^9 x the sum.
    parts = _parts(world, 20_000, torch.bfloat16, seed=11)
    ours, ring = testing.in_symmem_order(parts), _ring(parts)
    for _ in range(9):
        ours = testing.in_symmem_order(ours.expand(world, -1))
        ring = _ring(ring.expand(world, -1).contiguous())
    assert not testing.wrong_elements(ours, parts, SYMMEM, calls=10).any()
    assert not testing.wrong_elements(ours, parts, ANY, calls=10).any()
    assert not testing.wrong_elements(ring, parts, ANY, calls=10).any(), testing.describe_wrong(ring, parts, ANY,
                                                                                                   calls=10)
    nine = testing.in_symmem_order(parts)
    for _ in range(8):
        nine = testing.in_symmem_order(nine.expand(world, -1))
    # One call short (1/W of the result): wrong wherever the sum does not nearly cancel.
    assert testing.wrong_elements(nine, parts, ANY, calls=10).float().mean() > 0.5


def test_arguments_are_checked():
    parts = _parts(2, 10, torch.bfloat16)
    with pytest.raises(ValueError, match="order"):
        testing.tolerance(torch.bfloat16, 2, "nccl")
    with pytest.raises(ValueError, match="op"):
        testing.in_symmem_order(parts, "prod")
    with pytest.raises(TypeError, match="float32"):
        testing.wrong_elements(parts[0].float(), parts, ANY)


def test_the_torch_bench_counts_with_these_oracles():
    # symmem.bench.torch's rows: symmem's exact, the others' within the bound (at 4 ranks the
    # bench had counted NCCL's and torch symm_mem's differently ordered bf16 sums as wrong).
    from symmem.bench import torch as bench
    world = 4
    parts = _parts(world, 30_000, torch.bfloat16, seed=13)
    nccl = bench.Case("all_reduce", "nccl", 1, None, None, [], "sum")
    ours = bench.Case("all_reduce", "symmem_torch", 1, None, None, [], "sum")
    gather = bench.Case("all_gather", "symmem_torch", 1, None, None, [], "gather")
    assert (nccl.order, ours.order) == (ANY, SYMMEM)
    ring = _ring(parts, start=1)
    assert bench.count_wrong(nccl, ring, parts) == 0
    assert bench.count_wrong(ours, ring, parts) > 0
    assert bench.count_wrong(ours, testing.in_symmem_order(parts), parts) == 0
    assert bench.count_wrong(nccl, testing.in_symmem_order(parts[1:]), parts) > 0
    assert bench.count_wrong(gather, parts.reshape(-1).clone(), parts) == 0
    moved = parts.reshape(-1).clone()
    moved[5] += 1
    assert bench.count_wrong(gather, moved, parts) == 1


def test_symmem_average_scales_the_float32_sum_before_rounding():
    # float16 40000 + 40000 overflows float16 (65504) but not float32: the average is 40000.
    big = torch.tensor([[40000.0], [40000.0]], dtype=torch.float16)
    assert testing.in_symmem_order(big, "avg").item() == 40000.0
    # At 3 ranks: float32 inputs summed in rank order, times float32(1/3), rounded once. A division
    # by 3 (or the average in float64) differs from that product at many elements, and so does
    # bf16's sum rounded and then divided in the type; computed here with numpy's float32
    # arithmetic, independently of torch.
    np = pytest.importorskip("numpy")
    parts = _parts(3, 4096, torch.float32, seed=11)
    rows = parts.numpy()
    total = (rows[0] + rows[1]) + rows[2]
    assert total.dtype == np.float32
    product = total * (np.float32(1.0) / np.float32(3.0))
    got = testing.in_symmem_order(parts, "avg")
    assert torch.equal(got, torch.from_numpy(product))
    assert not torch.equal(got, torch.from_numpy(total / np.float32(3.0)))
    halves = parts.to(torch.bfloat16)
    twice_rounded = (halves.float().sum(0).to(torch.bfloat16).float() / 3).to(torch.bfloat16)
    assert not torch.equal(testing.in_symmem_order(halves, "avg"), twice_rounded)
    with pytest.raises(ValueError, match="floating types only"):
        testing.in_symmem_order(torch.ones(2, 3, dtype=torch.int32), "avg")
