#!/usr/bin/env bash
# Quick start, command 2: build and run the tests. CPU tests always run; GPU tests (label gpu)
# run on a machine with GPUs and are reported as skipped without them.
#   scripts/test.sh             every test
#   scripts/test.sh -L gpu      GPU tests only (1, 2, 3 and 4 ranks through symmem-run)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd build
ctest --output-on-failure "$@"
