"""symmem.Exchange over a torch c10d Store: how a communicator is built from a process group
with no port or token of its own (torchrun's store already connects every rank)."""
import datetime

from ..communicator import Exchange
from .. import _native, errors


class StoreExchange(Exchange):
    """Round n of all_gather: every rank sets <prefix>/<n>/<rank>, waits for every rank's key, reads
    them all, and deletes its key of round n - 1 (every rank has read it: each rank sets its key of
    round n only after reading round n - 1)."""

    def __init__(self, store, rank, world, prefix, timeout_ms, what="the symmem exchange"):
        self._store = store
        self._rank = rank
        self._world = world
        self._prefix = prefix
        self._timeout = datetime.timedelta(milliseconds=timeout_ms)
        self._round = 0
        self._what = what

    def _key(self, round_, rank):
        return f"{self._prefix}/{round_}/{rank}"

    def all_gather(self, mine):
        n = self._round
        self._round += 1
        self._store.set(self._key(n, self._rank), bytes(mine))
        keys = [self._key(n, r) for r in range(self._world)]
        try:
            self._store.wait(keys, self._timeout)
        except Exception as e:
            missing = [r for r, k in enumerate(keys) if not self._store.check([k])]
            raise errors.SymmemError(_native.ErrorCode.kTimeout, f"rank {self._rank}: ranks {missing} did not reach step {n} of {self._what} "
                                          f"within {self._timeout} (every rank of the group must make the same "
                                          "symmem calls; the first call on a group builds its communicator)") from e
        try:
            blobs = self._store.multi_get(keys)
        except (AttributeError, NotImplementedError, RuntimeError):
            blobs = [self._store.get(k) for k in keys]
        if n > 0:
            try:
                self._store.delete_key(self._key(n - 1, self._rank))
            except (AttributeError, NotImplementedError, RuntimeError):
                pass  # a store without deletion keeps a few bytes per round; harmless
        return [bytes(b) for b in blobs]
