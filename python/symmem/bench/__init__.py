"""Benchmarks of the Python package: ``python -m symmem.bench.torch`` (under torchrun)."""
