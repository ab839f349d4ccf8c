"""CI check of tools/plot_results.py: a small CSV in, PNG figures out."""
import os
import subprocess
import sys
import tempfile

root = sys.argv[1]
header = "op,impl,mode,world,dtype,bytes_per_rank,count,blocks,time_us,algbw_gbs,busbw_gbs,wrong,vs_best_nccl,gpu,commit,date\n"
rows = []
for size in (16777216, 67108864, 536870912 // 2):
    for impl, blocks, busbw in (("nccl", -1, 300), ("nccl_ce", 0, 320), ("symmem_push", 8, 250),
                                ("symmem_push", 32, 340), ("symmem_copy_engine", 0, 360), ("symmem_auto", 32, 345)):
        rows.append(f"all_gather,{impl},eager,4,float16,{size},{size // 2},{blocks},{size * 3 / busbw / 1e3:.2f},"
                    f"{busbw * 4 / 3:.1f},{busbw},0,1.0,NVIDIA H200,abc,2026-11-21T00:00:00Z\n")
for impl, us in (("gemm_alone", 1436), ("overlap_nccl", 1787), ("overlap_symmem_copy_engine", 1450),
                 ("sequential_nccl", 1824), ("allgather_alone_nccl", 210)):
    rows.append(f"overlap,{impl},eager,4,float16,16777216,8388608,0,{us},0,0,-1,0,NVIDIA H200,abc,2026-11-21T00:00:00Z\n")
for size in (1024, 1048576):
    for impl, us in (("nccl", 20.0), ("symmem_two_shot", 9.0), ("symmem_auto", 8.5)):
        rows.append(f"all_reduce,{impl},eager,4,bfloat16,{size},{size // 2},32,{us},1,1,0,1,NVIDIA H200,abc,2026-11-21T00:00:00Z\n")

with tempfile.TemporaryDirectory() as tmp:
    csv_path = os.path.join(tmp, "results.csv")
    with open(csv_path, "w") as f:
        f.write(header + "".join(rows))
    out = os.path.join(tmp, "png")
    subprocess.run([sys.executable, os.path.join(root, "tools", "plot_results.py"), csv_path, "--out", out], check=True)
    made = sorted(os.listdir(out))
    print("figures:", made)
    expected = {"all_gather_busbw_vs_sms_16M.png", "all_gather_latency_vs_size.png", "overlap.png",
                "all_reduce_latency_vs_size.png"}
    missing = expected - set(made)
    assert not missing, f"missing figures: {missing}"
    for name in made:
        with open(os.path.join(out, name), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n", f"{name} is not a PNG"
print("1 passed, 0 failed")
