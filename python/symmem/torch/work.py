"""The Work an ``async_op=True`` drop-in call returns, meaning what NCCL's Work means.

symmem queues a collective on the caller's current stream (ProcessGroupNCCL queues it on an
internal stream that waits for the current one); either way the host returns at once, and:

- ``wait()`` makes the *then-current* stream wait for the collective (no host block), then raises
  the communicator's recorded failure, if any (a dead, stalled or mismatched peer: SymmemError, a
  DistBackendError). ``wait(timeout)`` also blocks the host until the collective completes, raising
  kTimeout when it has not within the timeout.
- ``get_future()`` is a CUDA-aware ``torch.futures.Future``, completed at once with the output
  tensors and events recorded after the collective, as NCCL's: ``fut.wait()`` makes the current
  stream wait; callbacks chained with ``then`` run with their streams ordered after it.
- ``is_completed()`` queries the GPU; ``is_success()`` is completed and not failed;
  ``exception()`` is the recorded failure or None (also after the group is gone: the failure
  recorded when its communicator closed); ``synchronize()`` makes the current stream wait, as
  NCCL's.
"""
import datetime
import time

import torch
import torch.distributed as dist

from .. import _native, errors


class Work(dist.Work):
    def __init__(self, comm, result):
        super().__init__()
        self._comm = comm
        self._result = result
        stream = torch.cuda.current_stream(comm.device)
        self._event = torch.cuda.Event()
        self._event.record(stream)
        self._future = torch.futures.Future(devices=[comm.torch_device])
        with torch.cuda.stream(stream):
            self._future.set_result(result)

    def exception(self):
        return self._comm.failure()

    def _raise_failure(self):
        failure = self.exception()
        if failure is not None:
            raise failure

    def wait(self, timeout=None):
        torch.cuda.current_stream(self._comm.device).wait_event(self._event)
        if timeout is not None and timeout != datetime.timedelta(0):
            seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
            deadline = time.monotonic() + seconds
            while not self._event.query():
                self._raise_failure()
                if time.monotonic() > deadline:
                    raise errors.SymmemError(_native.ErrorCode.kTimeout,
                                             f"symmem: a collective of group {self._comm.group_name!r} did not "
                                             f"complete within {seconds} s")
                time.sleep(50e-6)
        self._raise_failure()
        return True

    def is_completed(self):
        return self._event.query() or self.exception() is not None

    def is_success(self):
        return self._event.query() and self.exception() is None

    def get_future(self):
        return self._future

    def result(self):
        return self._result

    def synchronize(self):
        torch.cuda.current_stream(self._comm.device).wait_event(self._event)
        self._raise_failure()
