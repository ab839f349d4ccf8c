#!/usr/bin/env bash
# The multi-GPU measurement run (issue 31) on a device machine of 2 or 4 GPUs, from binaries built
# here and carried (scripts/bundle.sh, then `tar cJf .device/bundle.tar.xz build-bundle`); it
# builds nothing. Run from the repository root:
#
#   scripts/multi_gpu_session.sh TAG LANE... [-- LANE...]...
#
# A LANE is "DEVICES:STEP STEP ...": its steps run one after the other on those GPUs
# (CUDA_VISIBLE_DEVICES=DEVICES; a step uses every GPU of its lane). The lanes of one phase run
# at the same time, on disjoint GPUs (a lane may chain groups of its own: run_group); `--` starts
# the next phase once every lane of this one has finished. Example (4 GPUs): tests on GPUs 0-1 while the one-GPU suites run on GPUs 2 and 3, then
# the 4-rank tests on all four:
#   scripts/multi_gpu_session.sh checks "0,1:gpu_tests kill torch_tests" "2:shared" "3:triton_shared" \
#     -- "0,1,2,3:gpu_tests"
#
# Every step runs under `timeout`, never past BUDGET_S (default 540) from the start; what is left
# when the budget is spent is skipped and said so. Its output goes to $W/logs_TAG/<step>_<ranks>.log,
# CSVs and plots beside it; after every step $OUT/TAG_logs.tgz is rewritten (a device returns at
# most 8 files), and $OUT/TAG_summary.txt holds one line per step: rc, seconds, the last line
# saying what passed or failed.
#
# Benchmarks of two lanes that run at once share the host and the NVSwitch fabric (each pair of
# GPUs its own links): every bench interleaves symmem with its references within its own run, so
# a comparison within a CSV holds; absolute figures of such a phase say "concurrent" in the log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
TAG=${1:?usage: scripts/multi_gpu_session.sh TAG LANE... [-- LANE...]...}
shift
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
START=$SECONDS  # the budget counts from here: unpacking too
OUT=${OUT:-$PWD/session-out}
W=${SESSION_WORK:-/tmp/symmem-session}
# A warm machine keeps /tmp: a bundle is unpacked once per content, logs are kept per TAG.
BUNDLE_ID=$(md5sum .device/bundle.tar.xz | cut -c1-12)
mkdir -p "$OUT" "$W/logs_$TAG"
if [ ! -d "$W/bundle_$BUNDLE_ID" ]; then
  rm -rf "$W/unpack" && mkdir -p "$W/unpack" && tar xJf .device/bundle.tar.xz -C "$W/unpack" &&
    mv "$W/unpack/build-bundle" "$W/bundle_$BUNDLE_ID"
fi
B=$W/bundle_$BUNDLE_ID
export SYMMEM_LIBRARY="$B/libsymmem_capi.so" PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
SYMMEM_COMMIT=$(cat "$B/COMMIT" 2>/dev/null || echo unknown)
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
export SYMMEM_COMMIT SYMMEM_GPU_KIND="$GPU"
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$W/triton-cache}
# torch's NVSHMEM heap must hold the torch_vdev rows' buffers (symmem.bench.moe, all_to_all_vdev).
export NVSHMEM_SYMMETRIC_SIZE=${NVSHMEM_SYMMETRIC_SIZE:-8G}
BUDGET=${BUDGET_S:-540}
SUMMARY=$OUT/${TAG}_summary.txt
L=$W/logs_$TAG

say() {
  # shellcheck disable=SC2016  # $1 and $2 are the inner shell's arguments
  flock "$W/lock" bash -c 'echo "$1" >> "$2"' _ "$*" "$SUMMARY"
  echo "$*"
}
# Written beside and renamed: a pack cut short leaves the previous archive whole.
pack() {
  # shellcheck disable=SC2016  # the inner shell's arguments
  flock "$W/lock" bash -c 'tar czf "$1.part" -C "$2" . 2>/dev/null && mv "$1.part" "$1"' _ "$OUT/${TAG}_logs.tgz" "$L"
}

# step NAME LIMIT_S COMMAND...: COMMAND on this lane's GPUs under the limit and what is left of
# the budget, its output in $L/NAME.log.
step() {
  local name=$1 limit=$2 left t0 rc
  shift 2
  left=$((BUDGET - (SECONDS - START)))
  if [ "$left" -lt 15 ]; then
    say "$name [$DEV]: not run (budget spent)"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  t0=$SECONDS
  echo "== $name on GPUs $DEV ($GPU, ${NG} ranks, commit $SYMMEM_COMMIT, $(date -u +%FT%TZ), limit ${limit} s${CONCURRENT:+, concurrent with other lanes})" > "$L/$name.log"
  timeout -k 10 "$limit" "$@" >> "$L/$name.log" 2>&1
  rc=$?
  say "$name [$DEV]: rc=$rc in $((SECONDS - t0)) s: $(grep -aE 'passed|failed|FAIL|wrong|SKIPPED' "$L/$name.log" | tail -1 | cut -c1-200)"
  pack
}

# A bench's CSV and text into $L/bench/ (bench NAME LIMIT symmem-bench ARGS...).
bench() {
  local name=$1 limit=$2
  shift 2
  mkdir -p "$L/bench"
  step "$name" "$limit" "$B/symmem-bench" "$@" --gpus "$NG" --csv "$L/bench/$name.csv" --json /dev/null
}

run_step() {
  local s=$1 n=$NG
  # (commands, not functions: `timeout` runs them)
  local torchrun_n=(python3 -m torch.distributed.run --nproc-per-node "$n")
  local shared_env=(env SYMMEM_TEST_SHARED_GPU=1 CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_MODULE_LOADING=EAGER)
  case $s in
    # --- tests ---
    gpu_tests) step "gpu_tests_${n}_ranks" 300 "$B/symmem-run" -n "$n" --timeout 290 "$B/symmem_gpu_tests" ;;
    kill)
      for path in sm low_latency copy_engine graph; do
        step "kill_${path}" 60 "$B/symmem-run" -n 2 --timeout 50 --expect-killed 1 "$B/symmem_kill_tests" "$path"
      done ;;
    hier_tests)
      step hier_tests_1x2 120 "$B/symmem-run" -n 2 --timeout 110 "$B/symmem_gpu_tests" hierarchical
      step hier_tests_2x1 120 "$B/symmem-run" -n 2 --simulate-nodes 2 --timeout 110 "$B/symmem_gpu_tests" hierarchical ;;
    torch_tests) step "torch_tests_${n}_ranks" 420 tests/python/gpu/run.sh "$n" ;;
    # The same tests split in two halves by file, for two pairs of GPUs at once.
    torch_tests_a) step "torch_tests_a_${n}_ranks" 420 tests/python/gpu/run.sh "$n" \
      -k "test_docs_gpu or test_fsdp_gpu or test_fused_gpu or test_matmul_reduce_scatter_gpu or test_torch_layer_gpu" ;;
    torch_tests_b) step "torch_tests_b_${n}_ranks" 420 tests/python/gpu/run.sh "$n" \
      -k "test_moe_gpu or test_torch_gpu or test_triton_gpu or test_nodes_gpu" ;;
    torch_tests_but_delayed) step "torch_tests_${n}_ranks" 420 tests/python/gpu/run.sh "$n" -k "not delayed" ;;
    fused_delayed_diag)  # the delayed-rank tests alone, stacks after 30 s (session 17 suspected them of
      # the 2-rank hang from a miscounted log: the hang was test_moe_gpu.py's, bench/results/h100x4)
      step "fused_delayed_diag_${n}_ranks" 60 tests/python/gpu/run.sh "$n" -k delayed -o faulthandler_timeout=30 ;;
    triton_interleave_diag)  # 4 ranks sharing the GPU, with and without PDL, stacks after 12 s
      for pdl in 1 0; do
        step "triton_interleave_world4_pdl$pdl" 50 "${shared_env[@]}" SYMMEM_PDL=$pdl SYMMEM_SHARED_GPU_WORLDS=4 \
          python3 -m pytest -v -p no:cacheprovider -rA -o faulthandler_timeout=12 -k "interleave and 4" \
          tests/python/triton_gpu/test_triton_shared_gpu.py
      done ;;
    torch_nodes) step "torch_nodes_${n}_ranks" 150 env SYMMEM_NODE_SIZE=$((n / 2)) tests/python/gpu/run.sh "$n" -k simulated_nodes ;;
    shared)
      for w in ${SHARED_WORLDS:-2 3 4 8}; do
        step "shared_gpu_world_$w" 200 env SYMMEM_SHARED_GPU_WORLDS="$w" "$B/symmem_shared_gpu_tests"
      done ;;
    moe_shared_window1)  # the graph replays synchronised after every replay: a crowded launch queue, or the protocol?
      for w in 4 8; do
        step "shared_gpu_moe_${w}_window1" 100 env SYMMEM_SHARED_GPU_WORLDS="$w" SYMMEM_SHARED_GPU_WINDOW=1 \
          CUDA_DEVICE_MAX_CONNECTIONS=32 "$B/symmem_shared_gpu_moe_tests" graph_replays
      done ;;
    moe_shared)
      for w in ${SHARED_WORLDS:-2 3 4 8}; do
        step "shared_gpu_moe_$w" 150 env SYMMEM_SHARED_GPU_WORLDS="$w" CUDA_DEVICE_MAX_CONNECTIONS=32 \
          SYMMEM_MOE_COMBINE=registers "$B/symmem_shared_gpu_moe_tests"
        step "shared_gpu_moe_bulk_$w" 120 env SYMMEM_SHARED_GPU_WORLDS="$w" CUDA_DEVICE_MAX_CONNECTIONS=32 \
          SYMMEM_MOE_COMBINE=bulk "$B/symmem_shared_gpu_moe_tests" moe_
      done ;;
    triton_shared)
      step triton_shared_gpu 330 "${shared_env[@]}" SYMMEM_SHARED_GPU_WORLDS="2 4 8" python3 -m pytest -v -p no:cacheprovider \
        -rA -o faulthandler_timeout=150 tests/python/triton_gpu/test_triton_shared_gpu.py ;;
    cuda_examples)
      for w in 2 4 8; do
        step "cuda_example_${w}_ranks" 60 "${shared_env[@]}" "$B/symmem_example_one_shot_all_reduce" --threads "$w"
      done
      step cuda_example_dead_rank 60 "${shared_env[@]}" "$B/symmem_example_one_shot_all_reduce" --threads 4 --dead-rank ;;
    triton_profile) step triton_launch_profile 120 python3 -m torch.distributed.run --nproc-per-node 1 \
      tools/triton_launch_profile.py ;;
    triton_ops) step triton_ops_world1 150 python3 -m pytest -v -p no:cacheprovider -rA \
      tests/python/triton_gpu/test_triton_ops_world1.py ;;
    triton_fused1)
      mkdir -p "$L/bench"
      step triton_fused_world1 200 python3 -m symmem.triton.examples.all_gather_matmul --world1-vs-mm \
        --csv "$L/bench/triton_fused_world1.csv" --commit "$SYMMEM_COMMIT" --dtype float16 ;;
    # --- benchmarks (n ranks) ---
    ag) bench "all_gather_$n" 200 all_gather -b 1K -e 256M -f 2 -n 20 -w 5 --reps 5 ;;
    ag_graph) bench "all_gather_graph_$n" 120 all_gather -b 1K -e 16M -f 4 -n 20 -w 5 --reps 5 --graph ;;
    ar) bench "all_reduce_$n" 200 all_reduce -b 1K -e 256M -f 4 -n 20 -w 5 --reps 5 ;;
    rs) bench "reduce_scatter_$n" 200 reduce_scatter -b 1K -e 256M -f 4 -n 20 -w 5 --reps 5 ;;
    vllm)
      bench "vllm_table_eager_$n" 150 all_reduce --vllm-table -n 20 -w 5 --reps 5
      bench "vllm_table_graph_$n" 150 all_reduce --vllm-table -n 20 -w 5 --reps 5 --graph ;;
    a2a)
      bench "all_to_all_$n" 150 all_to_all -b 1K -e 64M -f 4 -n 20 -w 5 --reps 5
      bench "all_to_all_graph_$n" 100 all_to_all -b 1K -e 1M -f 4 -n 20 -w 5 --reps 5 --graph
      bench "all_to_all_zipf_$n" 100 all_to_all -b 64K -e 64M -f 16 -n 20 -w 5 --reps 5 --splits zipf ;;
    tune)  # every algorithm x block count, the table chosen from it (--tune); TUNE_NCCL=1 keeps NCCL's rows (a sweep)
      for op in all_gather all_reduce reduce_scatter; do
        bench "tune_${op}_$n" 200 "$op" -b 1K -e 256M -f 2 -n 10 -w 3 --reps 3 --blocks 8,16,32,64,128 \
          $([ "${TUNE_NCCL:-0}" = 1 ] || echo --nccl 0) \
          --tune "$L/bench/tune_${op}_$n.json"
      done ;;
    tuned)  # the tables the tune step wrote, merged (tools/merge_tuning.py) and used: the automatic rows against NCCL
      rm -f "$L/bench/tuned_$n.json"  # (a warm machine keeps an earlier call's)
      if ! python3 tools/merge_tuning.py "$L/bench/tuned_$n.json" "$L/bench"/tune_*_"$n".json > "$L/tuned_merge.log" 2>&1; then
        say "tuned [$DEV]: not run (no tables to merge: $(tail -1 "$L/tuned_merge.log"))"
        return
      fi
      export SYMMEM_TUNING_FILE="$L/bench/tuned_$n.json"
      bench "all_gather_tuned_$n" 200 all_gather -b 1K -e 256M -f 2 -n 20 -w 5 --reps 5
      bench "vllm_table_eager_tuned_$n" 150 all_reduce --vllm-table -n 20 -w 5 --reps 5
      bench "vllm_table_graph_tuned_$n" 150 all_reduce --vllm-table -n 20 -w 5 --reps 5 --graph
      bench "reduce_scatter_tuned_$n" 200 reduce_scatter -b 1K -e 256M -f 4 -n 20 -w 5 --reps 5
      unset SYMMEM_TUNING_FILE ;;
    hier_bench)  # issue 13 at 4: 2 simulated nodes x 2 GPUs, flat NCCL under the same simulation
      bench "all_gather_hier_2x$((n / 2))" 200 all_gather --simulate-nodes 2 -b 16M -e 256M -f 2 -n 10 -w 3 --reps 5 \
        --algos copy_engine,hierarchical ;;
    torch_bench) step "torch_bench_$n" 240 "${torchrun_n[@]}" -m symmem.bench.torch --out "$L/torch_bench_$n" ;;
    overhead) step "overhead_$n" 90 "${torchrun_n[@]}" -m symmem.bench.overhead ;;
    fused)
      for op in all_gather_matmul matmul_reduce_scatter; do
        step "${op}_bench_$n" 200 "${torchrun_n[@]}" -m symmem.bench.all_gather_matmul --op $op --reps 7 --out "$L/fused_$n"
      done ;;
    triton_rows)  # the Triton rows, opt-in in the benches: the one-shot in the vLLM tables, the fused all-gather + matmul
      step "torch_bench_triton_$n" 240 "${torchrun_n[@]}" -m symmem.bench.torch --triton --out "$L/torch_bench_triton_$n"
      step "all_gather_matmul_triton_bench_$n" 300 "${torchrun_n[@]}" -m symmem.bench.all_gather_matmul --reps 7 \
        --dtypes fp16 --impls gemm_alone nccl_then_gemm symmem_fused symmem_triton_fused --stem all_gather_matmul_triton \
        --out "$L/fused_triton_$n" ;;
    kernels) step "kernels_bench_$n" 240 "${torchrun_n[@]}" -m symmem.bench.kernels --reps 5 --out "$L/kernels_$n" ;;
    kernels_sweep)  # the Triton all-gather's tile (warps x bytes per thread) at 16 programs against the CUDA pull at 16 blocks
      for cfg in ${TILE_SWEEP:-16:16 16:64 16:128 32:64 8:128}; do
        step "kernels_tile_w${cfg%%:*}_b${cfg#*:}_$n" 60 "${torchrun_n[@]}" -m symmem.bench.kernels --reps 5 --sms 16 \
          --impls symmem_cuda_pull,symmem_triton_pull,symmem_triton_push --triton-warps "${cfg%%:*}" \
          --triton-bytes-per-thread "${cfg#*:}" --out "$L/kernels_tile_w${cfg%%:*}_b${cfg#*:}_$n"
      done ;;
    kernels_graph) step "kernels_graph_bench_$n" 240 "${torchrun_n[@]}" -m symmem.bench.kernels --reps 5 --graph \
      --out "$L/kernels_graph_$n" ;;
    moe) step "moe_bench_$n" 240 "${torchrun_n[@]}" -m symmem.bench.moe --reps 5 --out "$L/moe_$n" ;;
    moe_ab)  # the moe bench alternating the bundle's library with old/libsymmem_capi.so (bundle.sh OLD_CAPI=path), ABAB
      # (the old library runs under this tree's Python package: for changes that keep the C ABI)
      [ -f "$B/old/COMMIT" ] || { say "moe_ab: no old library in the bundle (bundle.sh OLD_CAPI)"; return; }
      for rep in 1 2; do
        for lib in old new; do
          local so="$B/libsymmem_capi.so" commit=$SYMMEM_COMMIT
          [ "$lib" = old ] && so="$B/old/libsymmem_capi.so" && commit=$(cat "$B/old/COMMIT")
          step "moe_ab_${lib}_${rep}_$n" 150 env SYMMEM_LIBRARY="$so" SYMMEM_COMMIT="$commit" "${torchrun_n[@]}" \
            -m symmem.bench.moe --reps 5 --impls "${MOE_AB_IMPLS:-symmem_expert_major,symmem_rank_major,vllm_ag_rs}" \
            --out "$L/moe_ab_${lib}_${rep}_$n"
        done
      done ;;
    torch_cost)  # host and graph cost of st.all_reduce at 0.5 MiB, world 1: an older tree (bundle.sh OLD_TORCH_TREE) and this one interleaved
      [ -f "$B/old_torch/COMMIT" ] || { say "torch_cost: no old tree in the bundle (bundle.sh OLD_TORCH_TREE)"; return; }
      step torch_host_cost_ab 300 python3 tools/torch_host_cost_ab.py \
        --tree "$(cat "$B/old_torch/COMMIT")=$B/old_torch:$B/old_torch/libsymmem_capi.so" --tree "new=.:$B/libsymmem_capi.so" \
        --reps "${REPS:-5}" --samples 5 --cpu 3 --gpu "$GPU" --out "$L/torch_host_cost_ab.csv" ;;
    moe_mutant)  # the shared-GPU MoE suite built with a planted bug (bundle.sh MUTANT_MOE_TESTS): rc != 0 expected
      step "moe_mutant_must_fail_2" 120 env SYMMEM_TEST_SHARED_GPU=1 SYMMEM_SHARED_GPU_WORLDS=2 CUDA_DEVICE_MAX_CONNECTIONS=32 \
        "$B/mutant_symmem_shared_gpu_moe_tests" ;;
    moe_paths)  # the combine's two pulls (SYMMEM_MOE_COMBINE), one run each, each with its reference rows
      for path in registers bulk; do
        step "moe_${path}_$n" 150 env SYMMEM_MOE_COMBINE=$path "${torchrun_n[@]}" -m symmem.bench.moe --reps 5 \
          --shapes decode_1,decode_128,prefill_4096 --impls symmem_expert_major,symmem_rank_major,vllm_ag_rs --out "$L/moe_${path}_$n"
      done ;;
    triton_grids)  # the Triton one-shot's grid (programs x bytes a thread) against torch's one_shot, same run
      step "torch_bench_triton_grids_$n" 240 "${torchrun_n[@]}" -m symmem.bench.torch --triton --ops all_reduce \
        --triton-grids "${TRITON_GRIDS:-48:16,64:16,32:32,64:32,24:64}" --out "$L/torch_bench_triton_grids_$n" ;;
    triton_probe)  # the Triton one-shot call by call, per grid, alone and after other collectives (tools/triton_grid_probe.py)
      step "triton_grid_probe_$n" 150 "${torchrun_n[@]}" tools/triton_grid_probe.py --grids "${PROBE_GRIDS:-24:64,24:16,64:16,32:32}" ;;
    vdev) step "all_to_all_vdev_bench_$n" 150 "${torchrun_n[@]}" -m symmem.bench.all_to_all_vdev --out "$L/vdev_$n" ;;
    fsdp) step "fsdp_bench_$n" 300 "${torchrun_n[@]}" -m symmem.bench.fsdp --out "$L/fsdp_$n" --steps "${FSDP_STEPS:-12}" \
      --sizes "${FSDP_SIZES:-2048:16:8192}" ;;
    *) say "unknown step $s" ;;
  esac
}

# A lane may chain groups: "0:shared & 1:triton_shared > 0,1:ag" runs the first two at once, then
# the third once both are done ('&' at once, '>' after).
run_group() {
  local spec=$1 seq part pids
  local -a seqs parts
  IFS='>' read -ra seqs <<< "$spec"
  for seq in "${seqs[@]}"; do
    IFS='&' read -ra parts <<< "$seq"
    # "concurrent" in a step's log: other lanes of the phase, or other parts of this group, run beside it.
    if [ -n "${OTHER_LANES:-}" ] || [ ${#parts[@]} -gt 1 ]; then export CONCURRENT=1; else unset CONCURRENT; fi
    pids=()
    for part in "${parts[@]}"; do
      part=$(sed 's/^ *//; s/ *$//' <<< "$part")
      [ -n "$part" ] && { run_lane "$part" & pids+=($!); }
    done
    wait "${pids[@]}"
  done
}

run_lane() {  # DEVICES:STEPS
  local spec=$1
  export DEV=${spec%%:*}
  export CUDA_VISIBLE_DEVICES=$DEV
  NG=$(($(tr -cd ',' <<< "$DEV" | wc -c) + 1))
  export NG
  # Lanes at once: torchrun's rendezvous port apart per lane (tests/python/gpu/run.sh too).
  export PET_MASTER_PORT=$((29500 + 10 * ${DEV%%,*}))
  for s in ${spec#*:}; do run_step "$s"; done
}

{
  echo "$(date -u +%FT%TZ) $TAG: $GPU x $(nvidia-smi -L | wc -l), commit $SYMMEM_COMMIT, budget ${BUDGET} s"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,power.draw --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -8
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1
} > "$L/${TAG}_machine.txt" 2>&1
say "$(head -1 "$L/${TAG}_machine.txt")"
phase=()
run_phase() {
  [ ${#phase[@]} -eq 0 ] && return
  local pids=() lane
  unset OTHER_LANES
  if [ ${#phase[@]} -gt 1 ]; then export OTHER_LANES=1; fi
  for lane in "${phase[@]}"; do
    run_group "$lane" &
    pids+=($!)
  done
  wait "${pids[@]}"
  phase=()
}
for a in "$@"; do
  if [ "$a" = "--" ]; then run_phase; else phase+=("$a"); fi
done
run_phase
say "$(date -u +%FT%TZ) $TAG done in $((SECONDS - START)) s"
pack
