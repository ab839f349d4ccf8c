"""Oracles for reductions over ranks: what symmem computes, bit for bit, and how far another
library's order of summation may land from the exact result. symmem's tests and benchmarks check
with them (written here once), and so can a user comparing symmem with NCCL. Needs torch.

``parts`` is every rank's input, one row per rank (``[world, ...]``, e.g. from
``all_gather_into_tensor``, which moves bytes exactly), of one dtype; ``op`` is "sum", "avg", "max"
or "min".

- ``SYMMEM``: symmem's documented order (docs/algorithms.md, src/device/reduce.cuh). Every
  algorithm combines the inputs in rank order 0..W-1; 16-bit floats accumulate in float32 and are
  rounded to the type once, float32 adds in float32, int32 in int32, max and min are exact; "avg"
  (floating types) is the float32 sum times 1/W (rounded to float32 once: exact for 2, 4, 8
  ranks), then rounded to the type once. ``in_symmem_order`` computes
  it with the same arithmetic, so a symmem result is compared bit for bit, and every rank holds
  the same bits.
- ``ANY``: any order, where every partial sum may be rounded to the type (NCCL's ring or tree,
  torch symm_mem's kernels). W values summed that way lie within gamma(W - 1) * sum(|x_r|) of the
  exact sum, gamma(k) = k u / (1 - k u), u the type's unit roundoff (Higham, "Accuracy and Stability
  of Numerical Algorithms", 2nd ed., section 4.2); 3 x 2^-8 of the magnitudes for bf16 on 4 ranks,
  which is why two orders of a bf16 sum of 3 or more ranks differ in the last bits.

A bound is ``tolerance(dtype, world, order, op)`` times the magnitude (the sum of |x_r|; for "avg"
divided by W), plus a few units of the type's subnormal step for results near zero; the float64
reference's own rounding is included. Integer sums and max/min have no rounding: tolerance 0.
"""
import functools

import torch

SYMMEM = "symmem"  # symmem's documented order: compared bit for bit
ANY = "any"        # another order, every partial sum possibly rounded to the type: within the bound
ORDERS = (SYMMEM, ANY)
OPS = ("sum", "avg", "max", "min")

_BITS = {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}  # significand precision


def unit_roundoff(dtype):
    """u: the largest relative error of one rounding to nearest in `dtype` (0 for integers)."""
    bits = _BITS.get(dtype)
    if bits is None:
        if dtype.is_floating_point:
            raise TypeError(f"no rounding model for {dtype}")
        return 0.0
    return 2.0 ** -bits


def _gamma(k, u):
    return k * u / (1 - k * u) if k else 0.0


def _check_args(order, op):
    if order not in ORDERS:
        raise ValueError(f"order {order!r} is not one of {ORDERS}")
    if op not in OPS:
        raise ValueError(f"op {op!r} is not one of {OPS}")


def tolerance(dtype, world, order, op="sum"):
    """The factor of the magnitude within which a reduction over `world` ranks in `order` lies from
    the exact result (module docstring). Roundings counted (each at most u of the type):

    - SYMMEM: W - 1 additions in float32, then one rounding to a 16-bit type; "avg" adds the
      division (the collectives multiply the float32 sum by 1/W rounded to float32: two roundings;
      the fused ops divide their result in the type: two, and one more to a 16-bit type; the bound
      counts the latter). symmem results are compared exactly (``in_symmem_order``); this factor is what
      separates them from the float64 reference.
    - ANY: W - 1 additions, each possibly rounded to the type; "avg" adds NCCL's pre-multiplication
      of every input by 1/W (the factor rounded to the type, the product rounded: two).
    """
    _check_args(order, op)
    if op in ("max", "min") or not dtype.is_floating_point:
        return 0.0
    u = unit_roundoff(dtype)
    reference = _gamma(world - 1, unit_roundoff(torch.float64))  # the float64 sum's own rounding
    if order == ANY:
        return _gamma(world - 1 + (2 if op == "avg" else 0), u) + reference
    narrow = dtype in (torch.float16, torch.bfloat16)
    to_type = int(narrow) + ((2 + int(narrow)) if op == "avg" else 0)
    accumulate = _gamma(world - 1, unit_roundoff(torch.float32))
    return _gamma(to_type, u) + accumulate * (1 + _gamma(to_type, u)) + reference


def matmul_tolerance(k):
    """The factor of |A| @ |B| within which a product of k-long rows and columns, accumulated in
    float32 in any order and blocking, lies from the exact product: gamma(k) at float32's machine
    epsilon (2u per addition: room for adders that truncate rather than round; k roundings
    counting the products' for float32 inputs, TF32 off), plus the float64 reference's own. The
    classical worst case of recursive summation (Higham, section 3.1), where sqrt(k) eps (torch's
    _assert_matmul_accuracy) is the typical error; tensor cores that align several addends before
    one truncation may exceed it by a factor near 1 + 1/(addends per step), which the output
    roundings of 16-bit results dwarf. Add one rounding to the output type (unit_roundoff) of the
    result where the op rounds."""
    return _gamma(k, torch.finfo(torch.float32).eps) + _gamma(k, unit_roundoff(torch.float64))


def _subnormal_step(dtype):
    """Half the spacing of `dtype`'s subnormals: a rounding's absolute error near zero."""
    info = torch.finfo(dtype)
    return info.tiny * info.eps / 2


def exact(parts, op="sum"):
    """The float64 result of reducing parts over dim 0 (max/min as NCCL and symmem: NaN only where
    every rank holds NaN)."""
    _check_args(SYMMEM, op)
    p = parts.double()
    if op == "sum":
        return p.sum(0)
    if op == "avg":
        return p.sum(0) / p.shape[0]
    return functools.reduce(torch.fmax if op == "max" else torch.fmin, p.unbind(0))


def in_symmem_order(parts, op="sum"):
    """What symmem computes from parts, in parts' dtype and bit for bit (module docstring)."""
    _check_args(SYMMEM, op)
    world, dtype = parts.shape[0], parts.dtype
    if op in ("max", "min"):  # fmaxf / fminf in rank order: exact, NaN ignored
        return functools.reduce(torch.fmax if op == "max" else torch.fmin, parts.unbind(0))
    accumulate = torch.float32 if dtype.is_floating_point else dtype
    total = parts[0].to(accumulate, copy=True)
    for part in parts[1:]:
        total += part.to(accumulate)
    if op == "avg":
        if not dtype.is_floating_point:
            raise ValueError(f"symmem averages floating types only, not {dtype}")
        # The kernels multiply the float32 sum by 1/W rounded to float32 (float64's 1/W rounds to
        # the same float32 for every W up to 8), one product rounded once.
        total = total * torch.tensor(1.0 / world, dtype=accumulate, device=total.device)
    return total.to(dtype)


def error_bound(parts, order, op="sum", calls=1):
    """Per element, float64: how far a reduction of parts in `order` may lie from ``exact``.

    ``calls`` > 1: the result of that many in-place all-reduces ("sum") in a row, each taking the
    previous result (the same on every rank) as every rank's input; the exact result is then
    W^(calls-1) x the sum. Each call adds its own rounding to the error the previous ones made,
    times W: E_k+1 = W (1 + t) E_k + t W^k M + a."""
    world = parts.shape[0]
    t = tolerance(parts.dtype, world, order, op)
    if t == 0.0:
        return torch.zeros(parts.shape[1:], dtype=torch.float64, device=parts.device)
    magnitude = parts.double().abs().sum(0)
    if op == "avg":
        magnitude = magnitude / world
    absolute = (world + 2) * _subnormal_step(parts.dtype)
    bound = t * magnitude + absolute
    if calls > 1 and op != "sum":
        raise ValueError("repeated calls are modelled for sums only")
    for k in range(1, calls):
        bound = world * (1 + t) * bound + t * world ** k * magnitude + absolute
    return bound


def repeated_in_symmem_order(parts, calls):
    """What symmem holds after `calls` in-place all-reduces (sum) of parts in a row."""
    result = in_symmem_order(parts)
    for _ in range(calls - 1):
        result = in_symmem_order(result.expand(parts.shape[0], *result.shape))
    return result


def _bits(t):
    integer = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(integer)


def wrong_elements(got, parts, order, op="sum", calls=1):
    """A bool tensor of got's shape: True where got is not what a reduction of parts in `order`
    may give (SYMMEM: other bits than ``in_symmem_order``; ANY: farther than ``error_bound`` from
    ``exact``, or NaN where the exact result is not). ``calls``: see ``error_bound``."""
    _check_args(order, op)
    if got.dtype != parts.dtype:
        raise TypeError(f"the result is {got.dtype}, the inputs {parts.dtype}")
    got = got.reshape(parts.shape[1:])
    if order == SYMMEM:  # (any NaN matches any NaN: torch and CUDA's conversions spell NaN differently)
        want = repeated_in_symmem_order(parts, calls) if calls > 1 else in_symmem_order(parts, op)
        return (_bits(got) != _bits(want)) & ~(got.isnan() & want.isnan())
    reference = exact(parts, op) * float(parts.shape[0]) ** (calls - 1)
    value = got.double()
    fine = ((value - reference).abs() <= error_bound(parts, order, op, calls)) | (value == reference)
    fine |= value.isnan() & reference.isnan()
    return ~fine


def describe_wrong(got, parts, order, op="sum", calls=1):
    """None when every element of got is right, else a sentence: how many are wrong, where the
    first are, and the worst error against its bound."""
    wrong = wrong_elements(got, parts, order, op, calls)
    count = int(wrong.sum().item())
    if count == 0:
        return None
    flat = wrong.reshape(-1)
    first = flat.nonzero()[:4].flatten().tolist()
    values = got.reshape(-1)[first].tolist()
    reference = exact(parts, op).reshape(-1) * float(parts.shape[0]) ** (calls - 1)
    bound = error_bound(parts, order, op, calls).reshape(-1)
    excess = ((got.reshape(-1).double() - reference).abs() / bound.clamp_min(1e-300))[flat]
    worst = excess.max().item() if order == ANY and excess.numel() else float("nan")
    what = "differ from symmem's order" if order == SYMMEM else "lie outside the rounding bound of any order"
    return (f"{count} of {wrong.numel()} elements ({parts.dtype}, {op}, {parts.shape[0]} ranks) {what}: "
            f"first at {first}, got {values}, exact {reference[first].tolist()}"
            + (f"; worst error {worst:.3g} x the bound" if order == ANY else ""))


def assert_reduction(got, parts, order, op="sum", calls=1, what="reduction"):
    """Raises AssertionError (describe_wrong) unless got is a right reduction of parts in `order`."""
    problem = describe_wrong(got, parts, order, op, calls)
    assert problem is None, f"{what}: {problem}"
