"""Triton kernels on symmem's heap, each with a Python function and a torch op (shipped and
tested: tests/python/triton, and on GPUs tests/python/triton_gpu).

  one_shot_all_reduce  every rank reads every peer's input and sums in fp32, in rank order
  all_gather           a persistent grid of `programs` (the SM budget), pull or push
"""
from .all_gather import all_gather
from .one_shot_all_reduce import one_shot_all_reduce

__all__ = ["all_gather", "one_shot_all_reduce"]
