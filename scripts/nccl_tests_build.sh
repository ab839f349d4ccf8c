#!/usr/bin/env bash
# Builds NVIDIA's nccl-tests at a pinned commit, on this machine (no GPU and no network needed),
# into a folder that a GPU machine runs from without building anything (scripts/nccl_tests_run.sh):
#
#   scripts/nccl_tests_build.sh SOURCE [OUT]
#
# SOURCE: a checkout of https://github.com/NVIDIA/nccl-tests or its git directory (such as the
#   mirror the fetch tool makes, /work/.mirror/NVIDIA+nccl-tests/repo). The pinned commit below is
#   taken from it with git archive; a SOURCE without it is an error. None of nccl-tests' code is in
#   this repository.
# OUT (default build-nccl-tests): bin/{all_reduce,all_gather,reduce_scatter,alltoall}_perf, and
#   COMMIT (nccl-tests' commit and the nccl.h version they were built against).
#
# Built against this CUDA toolkit's nccl.h (NCCL_HOME, default the toolkit: include/nccl.h and
# lib/libnccl.so), for sm_90 only, the CUDA runtime linked statically (the GPU machine needs only
# the driver and a libnccl.so.2), and with tools/nccl_tests' minimal MPI, so that they run one
# process per GPU on machines without an MPI installation. They load libnccl.so.2 at run time:
# the real one, or libsymmem_nccl.so preloaded in front of it.
set -euo pipefail
NCCL_TESTS_COMMIT=a0b82b2260cf5152b9f8c061bbf7eaf0ba096432  # nccl-tests v2.19.6
COLLECTIVES="all_reduce all_gather reduce_scatter alltoall"

cd "$(dirname "$0")/.."
REPO=$PWD
SOURCE=${1:?usage: scripts/nccl_tests_build.sh SOURCE [OUT]}
OUT=$(mkdir -p "${2:-build-nccl-tests}" && cd "${2:-build-nccl-tests}" && pwd)
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NCCL_HOME=${NCCL_HOME:-$CUDA_HOME}
[ -f "$NCCL_HOME/include/nccl.h" ] || { echo "no nccl.h under NCCL_HOME=$NCCL_HOME/include" >&2; exit 1; }

# The pinned sources, from a work tree or a bare git directory alike.
if git -C "$SOURCE" rev-parse --git-dir > /dev/null 2>&1; then
  GIT_DIR_OF_SOURCE=$(cd "$SOURCE" && cd "$(git rev-parse --git-dir)" && pwd)
else
  echo "$SOURCE is not a git checkout or git directory of nccl-tests" >&2
  exit 1
fi
git --git-dir="$GIT_DIR_OF_SOURCE" cat-file -e "$NCCL_TESTS_COMMIT^{commit}" 2> /dev/null || {
  echo "$SOURCE does not hold nccl-tests commit $NCCL_TESTS_COMMIT (fetch it first)" >&2
  exit 1
}
WORK="$OUT/src"
rm -rf "$WORK" && mkdir -p "$WORK"
git --git-dir="$GIT_DIR_OF_SOURCE" archive "$NCCL_TESTS_COMMIT" | tar -x -C "$WORK"

# The minimal MPI (tools/nccl_tests/mpi.h): a static library, so that the binaries need no libmpi.
MPI_HOME="$OUT/mini_mpi"
mkdir -p "$MPI_HOME/include" "$MPI_HOME/lib"
cp "$REPO/tools/nccl_tests/mpi.h" "$MPI_HOME/include/mpi.h"
${CXX:-g++} -std=c++17 -O2 -Wall -Wextra -I"$MPI_HOME/include" -c "$REPO/tools/nccl_tests/mini_mpi.cpp" \
  -o "$MPI_HOME/mini_mpi.o"
ar rcs "$MPI_HOME/lib/libmpi.a" "$MPI_HOME/mini_mpi.o"

BUILD="$OUT/build"
MAKE_ARGS=(-C "$WORK/src" MPI=1 "MPI_HOME=$MPI_HOME" "NCCL_HOME=$NCCL_HOME" "CUDA_HOME=$CUDA_HOME"
  "NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90" CUDARTLIB=cudart_static "BUILDDIR=$BUILD")
nice make "${MAKE_ARGS[@]}" os.build
targets=()
for c in $COLLECTIVES; do targets+=("$BUILD/${c}_perf"); done
nice make -j"${JOBS:-2}" "${MAKE_ARGS[@]}" "${targets[@]}"

mkdir -p "$OUT/bin"
for c in $COLLECTIVES; do cp "$BUILD/${c}_perf" "$OUT/bin/"; done
NCCL_H_VERSION=$(sed -n 's/^#define NCCL_VERSION_CODE \([0-9]*\)/\1/p' "$NCCL_HOME/include/nccl.h")
printf 'nccl-tests %s\nnccl.h %s\n' "$NCCL_TESTS_COMMIT" "$NCCL_H_VERSION" > "$OUT/COMMIT"
rm -rf "$WORK" "$BUILD"
echo "nccl-tests $NCCL_TESTS_COMMIT (nccl.h $NCCL_H_VERSION) in $OUT/bin:"
ls "$OUT/bin"
