"""symmem.bench.skew's arithmetic: the excess of a sample is its time less the late rank's measured
sleep and less its row's median without skew."""
import argparse
import csv

import pytest

pytest.importorskip("torch", reason="symmem.bench needs torch")
from symmem.bench import skew  # noqa: E402


def test_excess_is_time_less_sleep_less_the_unskewed_median(tmp_path):
    by_key = {("symmem_torch", "eager", 32768, 0.0): ([10.0, 12.0, 11.0], [0.0, 0.0, 0.0]),
              ("symmem_torch", "eager", 32768, 2000.0): ([2015.0, 2900.0, 2011.0], [1999.0, 2001.0, 2000.0])}
    args = argparse.Namespace(lead_ms=5.0, reps=3, out=str(tmp_path), stem="skew_2")
    skew.report(by_key, args, 2, 0, "NVIDIA H200")
    rows = {float(r["skew_us"]): r for r in csv.DictReader(open(tmp_path / "skew_2.csv"))}
    assert float(rows[0.0]["excess_us_median"]) == pytest.approx(0.0)
    # 2015 - 1999 - 11, 2900 - 2001 - 11, 2011 - 2000 - 11
    assert float(rows[2000.0]["excess_us_median"]) == pytest.approx(5.0)
    assert float(rows[2000.0]["excess_us_max"]) == pytest.approx(888.0)
    assert rows[2000.0]["gpu"] == "NVIDIA H200" and rows[2000.0]["command"].startswith("torchrun")


def test_gathered_pairs_rank_0s_times_with_the_late_ranks_sleeps(tmp_path):
    # One rank over gloo: it is rank 0 and the late rank, so each key's pairs come back split.
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        samples = {2000.0: [(2015.0, 1999.0), (2900.0, 2001.0)], 0.0: [(10.0, 0.0), (12.0, 0.0)]}
        assert skew.gathered(samples, device="cpu") == {0.0: ([10.0, 12.0], [0.0, 0.0]),
                                                        2000.0: ([2015.0, 2900.0], [1999.0, 2001.0])}
    finally:
        dist.destroy_process_group()
    assert skew.excess_us([2015.0, 2900.0], [1999.0, 2001.0], 11.0) == [5.0, 888.0]
