"""docs/vllm.md's snippets, on this job's group, where symmem serves them."""
import pathlib
import sys

import torch.distributed as dist

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "python"))
import doc_snippets  # noqa: E402


def test_vllm_page_snippets_run_on_symmem(group, capsys):
    page = ROOT / "docs" / "vllm.md"
    exec(compile("\n".join(doc_snippets.blocks(page)), str(page), "exec"), {"__name__": "doc"})
    assert "served by symmem: True" in capsys.readouterr().out
    dist.barrier()
