"""libsymmem_nccl.so: symmem behind NCCL's C API, for unchanged programs (docs/nccl.md).

    LD_PRELOAD=$(python3 -m symmem.nccl) torchrun --nproc-per-node 8 train.py   # in front of libnccl.so.2
    VLLM_NCCL_SO_PATH=$(python3 -m symmem.nccl) vllm serve ...                  # loaded by path instead of it
"""
import sys

from . import _library


def library_path():
    """SYMMEM_NCCL_SHIM, else the library installed beside this file, else a source tree's build/."""
    return _library.locate("libsymmem_nccl.so", "SYMMEM_NCCL_SHIM", FileNotFoundError)


if __name__ == "__main__":
    try:
        print(library_path())
    except FileNotFoundError as e:
        sys.exit(str(e))
