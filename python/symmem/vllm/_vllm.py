"""What the adapter needs from vLLM, or stand-ins of the same shape when vLLM is not installed
(the adapter is then usable, and tested, without it). Read against vLLM 0.22.0
(fused_moe/modular_kernel.py, prepare_finalize/deepep_ll.py and deepep_ht.py,
distributed/device_communicators/base_device_communicator.py) and vllm-project/vllm main at 055e47c."""
import dataclasses
import enum

try:  # pragma: no cover - exercised where vLLM is installed
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk

    HAVE_VLLM = True
    PrepareAndFinalizeBase = mk.FusedMoEPrepareAndFinalizeModular
    ActivationFormat = mk.FusedMoEActivationFormat
    ExpertTokensMetadata = mk.ExpertTokensMetadata
except ImportError:
    HAVE_VLLM = False

    class ActivationFormat(enum.Enum):
        Standard = ("standard",)
        BatchedExperts = ("batched_experts",)

    @dataclasses.dataclass
    class ExpertTokensMetadata:
        expert_num_tokens: object
        expert_num_tokens_cpu: object
        psum_recv_per_rank: object = None

    class PrepareAndFinalizeBase:
        def __init__(self, *args, **kwargs):
            pass

try:  # pragma: no cover
    from vllm.model_executor.layers.fused_moe.topk_weight_and_reduce import (TopKWeightAndReduceContiguous,
                                                                             TopKWeightAndReduceDelegate)
except ImportError:
    TopKWeightAndReduceDelegate = None
    TopKWeightAndReduceContiguous = None

try:  # pragma: no cover
    from vllm.distributed.device_communicators.all2all import All2AllManagerBase
except ImportError:
    try:
        from vllm.distributed.device_communicators.base_device_communicator import All2AllManagerBase
    except ImportError:
        All2AllManagerBase = object
