"""docs/vllm.md's snippets run (here on a one-rank gloo group without GPU: TPAllReduce disabled,
every call falling back; tests/python/gpu/test_docs_gpu.py runs them where symmem serves)."""
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
ROOT = pathlib.Path(__file__).resolve().parents[3]

RUN = textwrap.dedent("""
    import os, sys, tempfile
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method="file://" + os.path.join(tempfile.mkdtemp(), "s"), rank=0,
                            world_size=1)
    sys.path.insert(0, sys.argv[2])
    import doc_snippets
    exec(compile("\\n".join(doc_snippets.blocks(sys.argv[1])), sys.argv[1], "exec"), {"__name__": "doc"})
    print("snippets ok")
""")


def test_vllm_page_snippets_run():
    page = ROOT / "docs" / "vllm.md"
    assert len(__import__("re").findall("```python", page.read_text())) >= 4
    out = subprocess.run([sys.executable, "-c", RUN, str(page), str(ROOT / "tests" / "python")],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert out.returncode == 0 and "snippets ok" in out.stdout, out.stdout + out.stderr
    assert "served by symmem: False" in out.stdout  # no GPU here: disabled, and said why
