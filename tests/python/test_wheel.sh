#!/usr/bin/env bash
# `pip install .` works: builds the wheel through scikit-build-core and this project's CMake,
# checks that it carries the native libraries and is tagged py3-none (one wheel for every Python 3:
# _fastcall, for CPython >= 3.10, is loaded only there),
# installs it into a scratch directory and imports it there, away from the source tree.
set -euo pipefail
python=${1:-python3}
cd "$(dirname "$0")/../.."
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$python" -m pip wheel . --no-build-isolation --no-deps -q -w "$scratch/wheel"
wheel=$(ls "$scratch"/wheel/symmem-*.whl)
case "$wheel" in *-py3-none-linux_x86_64.whl) ;; *) echo "unexpected wheel tag: $wheel"; exit 1 ;; esac
# Read the listing in Python: `zipfile -l | grep -q` fails under pipefail when grep exits before
# the listing is written (BrokenPipeError), which failed CI once.
"$python" -c 'import sys, zipfile; sys.exit("symmem/libsymmem_capi.so" not in zipfile.ZipFile(sys.argv[1]).namelist())' "$wheel" \
    || { echo "the wheel lacks libsymmem_capi.so"; exit 1; }
"$python" -c 'import sys, zipfile; sys.exit("symmem/libsymmem_nccl.so" not in zipfile.ZipFile(sys.argv[1]).namelist())' "$wheel" \
    || { echo "the wheel lacks libsymmem_nccl.so (symmem behind NCCL's API)"; exit 1; }
# _fastcall where CMake builds it: a CPython of 3.10 on that is not free-threaded (as this one is, in CI).
fastcall=$("$python" -c 'import sys, sysconfig; print(int(sys.version_info >= (3, 10) and not sysconfig.get_config_var("Py_GIL_DISABLED")))')
if [ "$fastcall" = 1 ]; then
  "$python" -c 'import sys, zipfile; sys.exit("symmem/_fastcall.abi3.so" not in zipfile.ZipFile(sys.argv[1]).namelist())' "$wheel" \
      || { echo "the wheel lacks _fastcall.abi3.so (the collectives without ctypes)"; exit 1; }
fi
"$python" -m pip install --no-deps -q --target "$scratch/site" "$wheel"
cd "$scratch"
env -u SYMMEM_LIBRARY PYTHONPATH="$scratch/site" "$python" -c "
import symmem, symmem._native as n
assert n.library_path().startswith('$scratch/site'), n.library_path()
assert $fastcall == 0 or (n.fastcall is not None and n.fastcall.__file__.startswith('$scratch/site')), n.fastcall
import symmem.nccl
assert symmem.nccl.library_path().startswith('$scratch/site'), symmem.nccl.library_path()
print('symmem', symmem.library_version(), 'from', n.library_path())"
