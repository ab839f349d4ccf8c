"""CI check of tools/results_table.py: the README's results section is what the committed CSVs
under bench/results/ give, byte for byte; and the tool finds a stale section and the missing markers."""
import os
import shutil
import subprocess
import sys
import tempfile

root = sys.argv[1]
tool = os.path.join(root, "tools", "results_table.py")


def run(*args):
    return subprocess.run([sys.executable, tool, *args], capture_output=True, text=True)


# 1. The repository: README.md regenerates byte-identical from bench/results.
r = run("--check")
assert r.returncode == 0, "README.md's results section is stale: run tools/results_table.py\n" + r.stderr

header = ("op,impl,mode,world,nodes,dtype,bytes_per_rank,count,blocks,time_us,time_min_us,time_max_us,algbw_gbs,"
          "busbw_gbs,wrong,vs_best_nccl,gpu,commit,date,command\n")


def row(impl, us):
    return (f"all_gather,{impl},eager,2,1,float16,16384,8192,-1,{us},{us},{us},1,1,0,1,NVIDIA H200,abc1234,"
            f"2026-11-21T00:00:00Z,symmem-bench all_gather --gpus 2\n")


with tempfile.TemporaryDirectory() as tmp:
    results = os.path.join(tmp, "results")
    os.makedirs(os.path.join(results, "h200x2"))
    csv_path = os.path.join(results, "h200x2", "all_gather_2.csv")
    with open(csv_path, "w") as f:
        f.write(header + row("nccl", 6.0) + row("nccl_symmetric", 5.0) + row("symmem_auto", 4.0))
    readme = os.path.join(tmp, "README.md")
    with open(readme, "w") as f:
        f.write("# x\n\n<!-- results:begin -->\nold\n<!-- results:end -->\n\nafter\n")
    # 2. A stale section is found; writing fixes it; a second write changes nothing.
    assert run("--check", "--results", results, "--readme", readme).returncode == 1
    assert run("--results", results, "--readme", readme).returncode == 0
    first = open(readme, "rb").read()
    assert run("--results", results, "--readme", readme).returncode == 0
    assert open(readme, "rb").read() == first, "not deterministic"
    text = first.decode()
    assert text.startswith("# x\n") and text.endswith("<!-- results:end -->\n\nafter\n")
    assert "| all-gather | 16 KiB per rank | 2 | eager | 4.00 | 5.00 | NCCL symmetric | **1.25×** |" in text, text
    assert run("--check", "--results", results, "--readme", readme).returncode == 0
    # 3. A changed figure makes the section stale.
    with open(csv_path, "a") as f:
        f.write(row("nccl_ce", 3.0))
    assert run("--check", "--results", results, "--readme", readme).returncode == 1
    # 4. No markers: an error, not a silent rewrite.
    with open(readme, "w") as f:
        f.write("# no markers\n")
    r = run("--results", results, "--readme", readme)
    assert r.returncode != 0 and "markers" in r.stderr, r.stderr
    shutil.rmtree(results)
print("4 passed, 0 failed")
