#!/usr/bin/env bash
# Negative control of the shared-GPU tests (tests/gpu/shared_gpu_tests.cpp and
# shared_gpu_moe_tests.cpp): each mutant puts one protocol bug back into the library, and the test
# that guards against it must fail.
#
#   tests/gpu/shared_gpu_mutants.sh build   # here: one test binary per mutant, in build-mutants/
#   tests/gpu/shared_gpu_mutants.sh run     # on a GPU machine: runs each, says caught or NOT CAUGHT
#
# build edits the source tree in place, one mutant at a time, builds the test target
# incrementally, and restores the file (also on failure or interrupt); the last step rebuilds the
# unmutated target. Option mutants are built from a CMake option of their own instead, in a build
# directory per option (build-<option>), which also gives the mutant's
# libsymmem_capi.so (build-mutants/<name>.libsymmem_capi.so: the Python benchmarks on the mutant).
# Exit status of run: 0 when every mutant was caught.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=build-mutants

# name | file | the text the mutant removes or replaces | its replacement | test filter | worlds
# [| test target, symmem_shared_gpu_tests when absent [| environment of the run]]
mutants=(
  # Low latency: a receiver that never clears the lines it took leaves stale lines behind for
  # the call two counted calls later.
  "ll_no_clear|src/device/low_latency.cuh|        st_relaxed_sys_u64(slots + r * slot_words + w, 0);||random|2 4"
  # matmul_reduce_scatter: the owner pulls a piece without waiting for the peer's GEMM to finish it.
  "mrs_no_piece_wait|src/fused/matmul_reduce_scatter.cpp|    detail::enqueue_piece_wait(board, rank, world, peer, piece.chunk - rank * p.pieces.pieces, signature, stream);||matmul_reduce_scatter|2 3"
  # all_gather_matmul: the pulls start without the ready handshake (a peer's slot may still hold
  # the previous call's shard).
  "agm_no_ready|src/fused/piece_gather.cpp|  enqueue_handshake(board, g.rank, g.world, WaitWord::kPhaseReady, signature, control);||all_gather_matmul|2 3"
  # max of floating types back to a comparison: NaN wins or loses depending on the rank
  # that holds it, where NCCL ignores it.
  "nan_by_rank|src/device/reduce.cuh|    if constexpr (std::is_floating_point_v<A>) return fmaxf(a, b);||max_min_ignore_nan|2 4"
  # Pipelined reductions: a step that does not wait for its peers' signal reduces send slots the
  # peers have not filled yet (and gathers results not yet there).
  "pipe_no_wait|src/kernels/reduce_pipelined.cu|if (!device::wait_for_peers(s, epoch + step, kPhase)) return;|||pipelined|2 4"
  # Pipelined reductions with one slot parity: the next round's stores overwrite slots a peer may
  # still be reading. (At world 2 only one rank's results went wrong in the run that caught it at 4,
  # and the run ended at its time limit: world 4 alone.)
  "pipe_one_parity|src/kernels/reduce_pipelined.cu|areas[t & 1u][owner]|areas[0][owner]||pipelined|4"
  # Variable all-to-all: the last block never clears the headers, so the call two counted calls
  # later may read the old call's splits (same signature) before its own arrive.
  "a2a_headers_kept|src/kernels/all_to_all_variable.cu|i < s.world * header; i += blockDim.x)|i < 0; i += blockDim.x)|all_to_all_back_to_back|2 4|symmem_shared_gpu_moe_tests"
  # The reduced MoE combine sums a token's partials without waiting for the peers' lines (and so
  # leaves their lines unconsumed: caught as a mismatch of the line protocol two calls later).
  "moe_reduced_no_wait|src/kernels/moe_combine_reduced.cu|arrived = collect_lines(a, call, kEntryPhase) && collect_lines(a, call, kSecondPhase);|arrived = 1;|moe_|2 3|symmem_shared_gpu_moe_tests|SYMMEM_MOE_COMBINE=reduced"
  # The reduced MoE combine keeps the route lines it took: two calls later, a unit's stale lines
  # (same signature) pass for fresh routes before the peer's new ones arrive. (A mutant with one
  # partial area instead of two halves was not caught: docs/moe.md, Testing.)
  "moe_reduced_routes_kept|src/kernels/moe_combine_reduced.cu|device::st_relaxed_sys_u64(line, 0);|(void)0;|moe_|2 3|symmem_shared_gpu_moe_tests|SYMMEM_MOE_COMBINE=reduced"
  # Variable all-to-all: a block's span of the balanced cut loses its last vector when it is odd.
  "a2a_span_short|src/kernels/all_to_all_variable.cu|end = cut_begin(total, gridDim.x, blockIdx.x + 1);|end = begin + (cut_begin(total, gridDim.x, blockIdx.x + 1) - begin) / 2 * 2;|all_to_all_skewed|2 4|symmem_shared_gpu_moe_tests"
)

# name | CMake option | test target | test filter | worlds | environment of the run
option_mutants=(
  # The MoE combine without its exit guard (kernels/moe_combine.cu): a rank ahead overwrites its
  # combine area (the next combine's staging copy, the caller's next outputs) while a peer still
  # pulls from it. Both pulls.
  "moe_no_exit_guard_registers|SYMMEM_MUTANT_NO_COMBINE_EXIT_GUARD|symmem_shared_gpu_moe_tests|back_to_back_combines|2 3|SYMMEM_MOE_COMBINE=registers"
  "moe_no_exit_guard_bulk|SYMMEM_MUTANT_NO_COMBINE_EXIT_GUARD|symmem_shared_gpu_moe_tests|back_to_back_combines|2 3|SYMMEM_MOE_COMBINE=bulk"
)

mutate() {  # file old new: replaces the one occurrence of old (fails if it is not there once)
  python3 - "$@" <<'EOF'
import sys
path, old, new = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(path).read()
if text.count(old) != 1:
    sys.exit(f"mutant: {path} holds the text {text.count(old)} times, not once")
open(path, "w").write(text.replace(old, new))
EOF
}

case "${1:-}" in
  build)
    mkdir -p "$out"
    for m in "${mutants[@]}"; do
      IFS='|' read -r name file old new filter worlds target _env <<<"$m"
      target=${target:-symmem_shared_gpu_tests}
      cp "$file" "$out/$name.orig"
      trap 'cp "$out/'"$name"'.orig" "'"$file"'"' EXIT
      trap 'cp "$out/'"$name"'.orig" "'"$file"'"; exit 130' INT TERM
      mutate "$file" "$old" "$new"
      cmake --build build --target "$target" >/dev/null
      cp "build/tests/$target" "$out/$name"
      cp "$out/$name.orig" "$file" && rm "$out/$name.orig"
      trap - EXIT INT TERM
      echo "built mutant $name"
    done
    cmake --build build --target symmem_shared_gpu_tests symmem_shared_gpu_moe_tests >/dev/null
    for m in "${option_mutants[@]}"; do
      IFS='|' read -r name option target filter worlds env <<<"$m"
      dir="build-$option"  # beside build/: ccache finds the unchanged files
      cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSYMMEM_BUILD_TESTS=ON -DSYMMEM_BUILD_BENCH=ON \
        "-D$option=ON" >/dev/null
      cmake --build "$dir" --target "$target" symmem_capi >/dev/null
      cp "$dir/tests/$target" "$out/$name"
      cp "$dir/libsymmem_capi.so" "$out/$name.libsymmem_capi.so"
      echo "built mutant $name"
    done
    ;;
  run)
    dir=${MUTANTS_DIR:-$out}
    missed=0
    runs=()
    for m in "${mutants[@]}"; do
      IFS='|' read -r name file old new filter worlds target env <<<"$m"
      runs+=("$name|$filter|$worlds|$env")
    done
    for m in "${option_mutants[@]}"; do
      IFS='|' read -r name option target filter worlds env <<<"$m"
      runs+=("$name|$filter|$worlds|$env")
    done
    for m in "${runs[@]}"; do
      IFS='|' read -r name filter worlds env <<<"$m"
      rc=0
      env SYMMEM_SHARED_GPU_WORLDS="$worlds" $env timeout 300 "$dir/$name" "$filter" >"$dir/$name.log" 2>&1 || rc=$?
      # Caught: the test ran and failed (exit 1 with a FAIL line), not skipped (77), timed out (124)
      # or missing (127).
      if [[ $rc == 1 ]] && grep -q '\[ FAIL \]' "$dir/$name.log"; then
        echo "mutant $name: caught ($(grep -m1 -o 'FAIL.*' "$dir/$name.log" | cut -c1-300))"
      else
        echo "mutant $name: NOT CAUGHT (test '$filter' exit $rc)"; missed=1
      fi
    done
    exit $missed
    ;;
  *) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
