#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build, and run the main job: symmem-bench on
# every local GPU (default sweep 1 KiB .. 256 MiB per rank, NCCL measured beside symmem).
# Extra arguments go to symmem-bench (e.g. all_reduce --vllm-table). Without a GPU it says so
# and exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
exec build/symmem-bench "$@"
