"""What the GPU tests of the fused ops (test_fused_gpu.py, test_matmul_reduce_scatter_gpu.py) share:
their shapes and types, seeded inputs, and the tolerance of a float32-accumulated result."""
import zlib

import torch
import torch.distributed as dist

# (rows per rank, n, k): whole tiles; shards that are not whole 128-row tiles with n and k not
# multiples of the 256 x 64 tile; tiny; a tensor-parallel layer.
SHAPES = [(256, 512, 1024), (200, 264, 520), (8, 8, 8), (1024, 6656, 2048)]
DTYPES = [torch.float16, torch.bfloat16]
# Half a unit in the last place of the output type, plus slack for float32 accumulation order.
RTOL = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def _seeded(shape, dtype, seed, integers):
    g = torch.Generator(device="cuda").manual_seed(seed)
    if integers:
        return torch.randint(-3, 4, shape, generator=g, device="cuda").to(dtype)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def random_tensor(shape, dtype, case, integers=False):
    """This rank's tensor of `case`: random normal, or small integers (exact in any sum order)."""
    return _seeded(shape, dtype, zlib.crc32(repr((case, dist.get_rank())).encode()) & 0x7FFFFFFF, integers)


def shared_random(shape, dtype, case, integers=False):
    """The same tensor on every rank (b is replicated in tensor parallelism)."""
    return _seeded(shape, dtype, zlib.crc32(repr(case).encode()), integers)


def check_close(c, ref, dtype, terms):
    """c within the output type's rounding of the float32 reference, plus slack for the order of
    a float32 sum of `terms` products."""
    err = (c.float() - ref).abs()
    bound = RTOL[dtype] * ref.abs() + 1e-3 * (terms ** 0.5)
    bad = (err > bound).sum().item()
    assert bad == 0, f"{bad} of {c.numel()} elements out of tolerance, worst {err.max().item():.4g}"
