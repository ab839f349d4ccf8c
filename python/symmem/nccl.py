"""libsymmem_nccl.so: symmem behind NCCL's C API, for unchanged programs (docs/nccl.md).

    LD_PRELOAD=$(python3 -m symmem.nccl) torchrun --nproc-per-node 8 train.py   # in front of libnccl.so.2
    VLLM_NCCL_SO_PATH=$(python3 -m symmem.nccl) vllm serve ...                  # loaded by path instead of it
"""
import os
import sys

_LIBRARY_NAME = "libsymmem_nccl.so"


def library_path():
    """SYMMEM_NCCL_SHIM, else the library installed beside this file, else a source tree's build/."""
    explicit = os.environ.get("SYMMEM_NCCL_SHIM")
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, _LIBRARY_NAME), os.path.join(here, "..", "..", "build", _LIBRARY_NAME)):
        if os.path.exists(candidate):
            return os.path.normpath(candidate)
    raise FileNotFoundError(f"symmem: {_LIBRARY_NAME} not found beside {here} nor in the source tree's build/; "
                            "install the package (pip install .) or set SYMMEM_NCCL_SHIM")


if __name__ == "__main__":
    try:
        print(library_path())
    except FileNotFoundError as e:
        sys.exit(str(e))
