"""vLLM's all2all manager on symmem: hands out one ExpertParallel context per MoE configuration
(get_handle), as DeepEP's managers hand out buffers, and closes them (destroy). The per-token
dispatch()/combine() of the naive backend are not symmem's path: the modular kernel's prepare /
finalize (prepare_finalize.py) is."""
import inspect

from ..torch.moe import ExpertParallel, blocks_for
from ._vllm import All2AllManagerBase

_DEFAULT_MAX_BLOCKS = inspect.signature(ExpertParallel).parameters["max_blocks"].default


def _ep_device_group():
    """vLLM's expert-parallel device (NCCL) group, when vLLM is running."""
    from vllm.distributed.parallel_state import get_ep_group
    return get_ep_group().device_group


class SymmemAll2AllManager(All2AllManagerBase):
    def __init__(self, cpu_group=None, tcp_store_group=None, device_group=None):
        if All2AllManagerBase is not object:  # vLLM's base keeps the groups
            try:
                super().__init__(cpu_group, tcp_store_group)
            except TypeError:  # versions without the store group
                super().__init__(cpu_group)
        self.device_group = device_group
        self.handles = {}
        self.num_sms = None  # set_num_sms: the blocks of contexts made from then on (None: theirs)

    def get_handle(self, kwargs):
        """kwargs: ExpertParallel's (num_experts, topk, hidden, max_tokens_per_rank, payload, layout,
        max_tokens_per_expert, max_received_rows, max_blocks). Collective on the first call of a
        configuration. A context made after set_num_sms(n) takes at most n blocks: its max_blocks,
        or the library's choice where that is -1, lowered to n."""
        key = tuple(sorted(kwargs.items()))
        ep = self.handles.get(key)
        if ep is None:
            group = self.device_group if self.device_group is not None else _ep_device_group()
            if self.num_sms is not None:
                blocks = int(kwargs.get("max_blocks", _DEFAULT_MAX_BLOCKS))
                if blocks < 0:  # the library's choice (a CPU group runs no kernels: n)
                    blocks = blocks_for(group, **kwargs) or self.num_sms
                kwargs = dict(kwargs, max_blocks=min(blocks, self.num_sms))
            ep = ExpertParallel(group, **kwargs)
            self.handles[key] = ep
        return ep

    def dispatch(self, *args, **kwargs):
        raise NotImplementedError("symmem: dispatch goes through SymmemPrepareAndFinalize (the modular kernel)")

    def combine(self, *args, **kwargs):
        raise NotImplementedError("symmem: combine goes through SymmemPrepareAndFinalize (the modular kernel)")

    def set_num_sms(self, num_sms):
        """Caps the blocks (SMs) of the contexts get_handle makes from now on, as vLLM's DeepEP
        managers cap theirs: a context's max_blocks, or the library's choice, is lowered to n, never
        raised. A context made before keeps its blocks (fixed when the context is made: its plans and
        workspaces follow them)."""
        self.num_sms = int(num_sms)

    def max_sms_used(self):
        """The most blocks a context of this manager takes (its cap on a CPU group, which runs none)."""
        return max((ep.blocks if ep.blocks is not None else max(ep.max_blocks, 0) for ep in self.handles.values()),
                   default=0)

    def destroy(self):
        for ep in self.handles.values():
            ep.close()
        self.handles.clear()
