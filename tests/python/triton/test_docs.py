"""The Triton kernels of README.md and docs/kernels.md, as printed: compiled to sm_90 PTX and
checked as symmem.triton's own kernels are, and run under Triton's interpreter with ranks as
processes against exact results."""
import os
import pathlib
import re
import tempfile

import pytest

triton = pytest.importorskip("triton", reason="symmem.triton needs Triton (pip install triton==3.6.0)")
pytest.importorskip("torch")

from ptx_cfg import polling_loop_problems  # noqa: E402
from triton_interpreter_ranks import run_ranks  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[3]
SNIPPETS = {"push_all_gather": ROOT / "README.md", "ring_shift": ROOT / "docs/kernels.md"}


def snippet_module(kernel):
    """The ```python block of its document that defines `kernel`, written to a module file (Triton
    reads a kernel's source from its file)."""
    text = SNIPPETS[kernel].read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if f"def {kernel}(" in b]
    assert len(blocks) == 1, f"{SNIPPETS[kernel]} has {len(blocks)} blocks defining {kernel}"
    path = pathlib.Path(tempfile.mkdtemp(prefix="symmem-doc-")) / f"{kernel}.py"
    path.write_text(blocks[0])
    return path


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="PTX only without the interpreter")
@pytest.mark.parametrize("kernel, signature", [
    ("push_all_gather", {"x": "*fp32", "out": "*fp32", "n": "i32", "heap_stride": "i64", "sync": "*i64",
                         "signature": "i32", "rank": "i32", "WORLD": "constexpr", "BLOCK": "constexpr"}),
    ("ring_shift", {"x": "*fp32", "y": "*fp32", "pad": "*i32", "n": "i32", "heap_stride": "i64", "sync": "*i64",
                    "signature": "i32", "rank": "i32", "WORLD": "constexpr", "BLOCK": "constexpr"})])
def test_doc_kernel_compiles_with_bounded_waits(kernel, signature):
    import importlib.util
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    spec = importlib.util.spec_from_file_location(f"doc_{kernel}", snippet_module(kernel))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    source = ASTSource(fn=getattr(module, kernel), signature=signature, constexprs={"WORLD": 4, "BLOCK": 1024})
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    assert polling_loop_problems(ptx) == []
    assert not re.search(r"\btrap\b", ptx)


@pytest.mark.parametrize("kernel", ["push_all_gather", "ring_shift"])
def test_doc_kernel_runs_on_three_ranks(kernel):
    out = run_ranks(3, f"doc_{kernel}", str(snippet_module(kernel)), 50, 2)
    for rank, result in out.items():
        assert result["wrong"] == [0, 0], (rank, result)
        assert result["record"]["code"] == 0
