#!/usr/bin/env bash
# A/B of the GEMM's tile announcements at world 1 (not committed): old = announce at once, new = one tile late.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=$PWD/python
F=$1
for rep in 1 2 3; do
  for lib in old new; do
    L=$PWD/build-bundle/libsymmem_capi.so; [ $lib = old ] && L=$PWD/build-bundle/old_libsymmem_capi.so
    for k in 1024 4096; do
      SYMMEM_LIBRARY=$L SYMMEM_COMMIT=$lib timeout 120 python3 -m torch.distributed.run --nproc-per-node 1 -m symmem.bench.all_gather_matmul \
        --op matmul_reduce_scatter --impls gemm_alone symmem_fused --M 8192 --N 8192 --K $k --dtypes bf16 --reps 5 \
        --out $F/ab_${lib}_k${k}_r${rep} > $F/ab_${lib}_k${k}_r${rep}.log 2>&1
      grep "bf16" $F/ab_${lib}_k${k}_r${rep}.log | tail -1 | sed "s/^/$lib k=$k r=$rep: /"
    done
  done
done
