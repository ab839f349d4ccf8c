"""symmem.bench.kernels without a GPU: its CSV fields and plot from rows shaped as the benchmark
writes them (on GPUs: scripts/gpu_run.sh's kernels steps), and the command every bench's rows carry."""
import csv
import os

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from symmem.bench import kernels  # noqa: E402
from symmem.bench._results import reproducing_command, write_results  # noqa: E402


def test_results_and_plot(tmp_path):
    rows = [{"shape": shape, "bytes_per_rank": 2 * 8192 * 8192, "impl": impl, "sms": sms, "time_us": 100.0 + sms,
             "time_min_us": 99.0, "time_max_us": 130.0, "algbw_gbs": 300.0, "busbw_gbs": 150.0 + sms, "wrong": 0,
             "world": 2, "gpu": "NVIDIA H100 80GB HBM3", "commit": "abc1234", "date": "2026-11-25T00:00:00Z"}
            for shape in ("2048x4096", "8192x8192") for impl in ("symmem_cuda_pull", "nccl") for sms in (4, 16, 132)]
    write_results(str(tmp_path), "kernels_2", kernels.FIELDS, rows, "text", kernels._plot)
    with open(tmp_path / "kernels_2.csv") as f:
        read = list(csv.DictReader(f))
    assert len(read) == len(rows) and {"date", "commit", "gpu", "command"} <= set(read[0])
    assert all(r["command"].startswith("torchrun --nproc-per-node ") for r in read)
    assert os.path.getsize(tmp_path / "kernels_2.png") > 10000


def test_the_command_reproduces_the_run_without_saying_where_results_went():
    argv = ["/x/python/symmem/bench/moe.py", "--reps", "5", "--out", "/tmp/r", "--impls", "a,b", "--stem=s",
            "--shapes", "decode 1"]
    environ = {"WORLD_SIZE": "2", "SYMMEM_MOE_COMBINE": "bulk", "SYMMEM_TOKEN": "secret", "SYMMEM_LIBRARY": "/x.so"}
    assert reproducing_command(argv, environ) == (
        "SYMMEM_MOE_COMBINE=bulk torchrun --nproc-per-node 2 -m symmem.bench.moe --reps 5 --impls a,b "
        "--shapes 'decode 1'")
