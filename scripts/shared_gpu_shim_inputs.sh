#!/usr/bin/env bash
# Sourced by scripts/nccl_tests_shared_gpu.sh, scripts/nccl_torch_shared_gpu.sh and
# tests/python/gpu/run.sh (not run on its own): makes SHIM (default build/libsymmem_nccl.so) and
# FAKE_NCCL (default build/tests/libsymmem_fake_nccl.so) absolute, and ends the sourcing script when
# either is missing (exit 2) or when there is no GPU (exit 77, saying that WHAT needs one).
#
#   shared_gpu_shim_inputs WHAT
shared_gpu_shim_inputs() {
  SHIM=$(realpath "${SHIM:-build/libsymmem_nccl.so}")
  FAKE_NCCL=$(realpath "${FAKE_NCCL:-build/tests/libsymmem_fake_nccl.so}")
  if [ ! -f "$SHIM" ] || [ ! -f "$FAKE_NCCL" ]; then
    echo "no shim or stand-in NCCL (set SHIM, FAKE_NCCL)" >&2
    exit 2
  fi
  if ! nvidia-smi -L > /dev/null 2>&1; then
    echo "SKIPPED: $1 on the shared GPU needs a GPU"
    exit 77
  fi
}
