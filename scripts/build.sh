#!/usr/bin/env bash
# Configures and builds symmem into build/ (Release, sm_90). Installs what a fresh machine of
# this project's kind lacks: CMake/Ninja if missing (Debian packages), the Python packages of
# requirements.txt (plots, torch for symmem.torch, pytest). Safe to run again; ccache is used when
# present. Also builds build/libsymmem_capi.so, which python/symmem loads from a source tree.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "symmem: installing ${need_apt[*]}" >&2
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq "${need_apt[@]}"
  else sudo apt-get update -qq && sudo apt-get install -y -qq "${need_apt[@]}"; fi
fi
if ! python3 -c "import matplotlib, torch, pytest, scikit_build_core, cutlass_library" 2>/dev/null; then
  echo "symmem: installing requirements.txt (matplotlib, torch 2.11.0, pytest, scikit-build-core, nvidia-cutlass)" >&2
  python3 -m pip install -q -r requirements.txt ||
    echo "symmem: could not install requirements.txt (plots, symmem.torch and its tests need them)" >&2
fi
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do [ -x "$d/nvcc" ] && export PATH="$d:$PATH" && break; done
fi
command -v nvcc >/dev/null || { echo "symmem: the CUDA toolkit (nvcc) is required to build" >&2; exit 1; }

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSYMMEM_BUILD_TESTS=ON -DSYMMEM_BUILD_BENCH=ON >/dev/null
cmake --build build -j "$(nproc)"
