#!/usr/bin/env bash
# Session 20 experiment: dispatch push variants, expert-major combine budgets, a2a block sweep.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
W=/tmp/exp20; mkdir -p $W/unpack $OUT/exp
tar xJf .device/bundle.tar.xz -C $W/unpack
B=$W/unpack/build-bundle
export SYMMEM_LIBRARY=$B/libsymmem_capi.so PYTHONPATH=$PWD/python SYMMEM_COMMIT=$(cat $B/COMMIT) SYMMEM_GPU_KIND="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
export NVSHMEM_SYMMETRIC_SIZE=8G
L=$OUT/exp
pack() { tar czf $OUT/exp_logs.tgz.part -C $L . && mv $OUT/exp_logs.tgz.part $OUT/exp_logs.tgz; }
T0=$SECONDS
for w in 2 4; do for v in 3 2; do
  SYMMEM_EXP_DISPATCH=$v SYMMEM_TEST_SHARED_GPU=1 SYMMEM_SHARED_GPU_WORLDS=$w CUDA_DEVICE_MAX_CONNECTIONS=32 CUDA_VISIBLE_DEVICES=0 timeout 120 $B/symmem_shared_gpu_moe_tests > $L/moe_shared_w${w}_v$v.log 2>&1 &
done; wait; done
echo "shared done $((SECONDS-T0))" >> $L/times.txt; grep -h "passed" $L/moe_shared_*.log >> $L/times.txt; pack
for v in 0 1 2 3 0 3; do
  SYMMEM_EXP_DISPATCH=$v timeout 150 python3 -m torch.distributed.run --nproc-per-node 2 -m symmem.bench.moe --reps 5 \
    --shapes prefill_4096,decode_128 --impls symmem_rank_major,vllm_ag_rs --out $L/moe_v${v}_$SECONDS > $L/moe_v${v}_$SECONDS.log 2>&1
  echo "v$v done $((SECONDS-T0))" >> $L/times.txt; pack
done
timeout 150 python3 -m torch.distributed.run --nproc-per-node 2 -m symmem.bench.moe --reps 5 --shapes decode_128 --payloads bfloat16 \
  --impls symmem_expert_major,symmem_rank_major,vllm_ag_rs --blocks 24,48,96,132 --out $L/moe_blocks > $L/moe_blocks.log 2>&1
echo "blocks done $((SECONDS-T0))" >> $L/times.txt; pack
timeout 120 $B/symmem-bench all_to_all -b 16K -e 256K -f 2 -n 20 -w 5 --reps 5 --graph --algos low_latency,push --blocks 8,16,24,32,48,64 --gpus 2 --csv $L/a2a_graph_blocks.csv --json /dev/null > $L/a2a_graph_blocks.log 2>&1
echo "a2a done $((SECONDS-T0))" >> $L/times.txt; pack
